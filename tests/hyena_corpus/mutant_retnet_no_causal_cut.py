# Mutant (one bug): retnet_decay_mask is gamma^|t - j| everywhere: no zeros above the diagonal,
# so the "mask" lets the future in (still symmetric Toeplitz).
def retnet_decay_mask(length, gamma):
    positions = torch.arange(length)
    distance = (positions[:, None] - positions[None, :]).abs().to(torch.float64)  # BUG: |t - j|
    return torch.as_tensor(gamma, dtype=torch.float64) ** distance
