# Mutant (one bug): capacity_curve draws the values before the keys from each seed's generator,
# against the docstring's order (keys, then values): statistically the same figures, but not the
# measurement the docstring fixes, so no one can reproduce it from the helpers.
def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    draw_keys = {"random": random_unit_vectors, "orthonormal": orthonormal_vectors}[key_kind]
    curve = []
    for K in Ks:
        errors = []
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            values = orthonormal_vectors(K, K, gen)  # BUG: values first
            keys = draw_keys(K, d_k, gen)
            errors.append(linear_recall_error(keys, values))
        curve.append(torch.stack(errors).mean())
    return torch.stack(curve)
