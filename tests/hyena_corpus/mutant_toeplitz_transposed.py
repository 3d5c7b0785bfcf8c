# Mutant (one bug): toeplitz_causal_conv builds T[n, m] = k[m - n] for m >= n, the transpose of
# the causal Toeplitz matrix (an anti-causal correlation); fft_causal_conv is untouched.
def toeplitz_causal_conv(u, k):
    L = u.shape[1]
    positions = torch.arange(L)
    lag = positions[None, :] - positions[:, None]  # BUG: m - n instead of n - m
    taps = k[lag.clamp(min=0)]
    toeplitz = taps * (lag >= 0).to(k.dtype)[:, :, None]
    return torch.einsum("nmc,bmc->bnc", toeplitz, u)
