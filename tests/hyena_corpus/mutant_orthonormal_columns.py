# Mutant (one bug): orthonormal_vectors returns Q (d, n), the orthonormal COLUMNS, instead of its
# transpose: right for n == d (a square orthogonal matrix either way), wrong shape for n < d.
def orthonormal_vectors(n, d, generator):
    if n > d:
        raise ValueError(f"cannot have {n} orthonormal vectors in R^{d}")
    gaussian = torch.randn(d, n, generator=generator, dtype=torch.float64)
    Q, _ = torch.linalg.qr(gaussian)
    return Q  # BUG: (d, n) columns, not (n, d) rows
