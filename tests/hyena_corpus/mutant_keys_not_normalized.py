# Mutant (one bug): random_unit_vectors returns the Gaussian rows without dividing by their
# norms (norm about sqrt(d)), so the capacity experiment's "unit" keys are not unit.
def random_unit_vectors(n, d, generator):
    return torch.randn(n, d, generator=generator, dtype=torch.float64)  # BUG: not normalized
