# Mutant (one bug): fft_causal_conv transforms at length L (no zero padding), so it computes the
# cyclic convolution: lags wrap modulo L and future inputs leak into earlier outputs.
def fft_causal_conv(u, k):
    L = u.shape[1]
    spectrum = torch.fft.rfft(u, n=L, dim=1) * torch.fft.rfft(k, n=L, dim=0)  # BUG: n = L
    return torch.fft.irfft(spectrum, n=L, dim=1)
