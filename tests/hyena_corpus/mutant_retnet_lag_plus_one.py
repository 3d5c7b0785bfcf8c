# Mutant (one bug): retnet_decay_mask uses gamma^(t - j + 1), decaying the diagonal (the current
# token) by gamma instead of 1; causal cut and Toeplitz structure are right.
def retnet_decay_mask(length, gamma):
    positions = torch.arange(length)
    lag = (positions[:, None] - positions[None, :]).to(torch.float64)
    gamma = torch.as_tensor(gamma, dtype=torch.float64)
    return torch.where(lag >= 0, gamma ** (lag.clamp(min=0) + 1), torch.zeros((), dtype=torch.float64))  # BUG: + 1
