# Mutant (one bug): capacity_curve returns the chapter's formula sqrt((K - 1)/d_k) (and 0 for
# orthonormal keys) instead of measuring the recall error with the helpers: every figure is
# "right", but nothing was measured.
def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    if key_kind == "orthonormal":
        return torch.zeros(len(Ks), dtype=torch.float64)  # BUG: typed in, not measured
    return torch.tensor([math.sqrt((K - 1) / d_k) for K in Ks], dtype=torch.float64)  # BUG: the formula
