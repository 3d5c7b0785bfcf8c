# Mutant (one bug): fft_causal_conv multiplies by the CONJUGATE filter spectrum, which computes a
# cross-correlation y[n] = sum_m k[m - n] u[m]: anti-causal (outputs see the future, not the past).
def fft_causal_conv(u, k):
    L = u.shape[1]
    spectrum = torch.fft.rfft(u, n=2 * L, dim=1) * torch.fft.rfft(k, n=2 * L, dim=0).conj()  # BUG: conj
    return torch.fft.irfft(spectrum, n=2 * L, dim=1)[:, :L]
