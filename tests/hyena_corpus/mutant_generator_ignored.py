# Mutant (one bug): random_unit_vectors draws from the global random state instead of the
# generator it is given, so the same seed does not reproduce the same keys (statistics are fine).
def random_unit_vectors(n, d, generator):
    x = torch.randn(n, d, dtype=torch.float64)  # BUG: generator ignored
    return x / x.norm(dim=1, keepdim=True)
