# Mutant (one bug): fft_causal_conv pads to 2L - 2, one short of the 2L - 1 that causality needs:
# only y[0] is wrong, by u[L-1] k[L-1] (invisible when the filter's last tap is tiny).
def fft_causal_conv(u, k):
    L = u.shape[1]
    N = 2 * L - 2  # BUG: needs N >= 2L - 1
    spectrum = torch.fft.rfft(u, n=N, dim=1) * torch.fft.rfft(k, n=N, dim=0)
    return torch.fft.irfft(spectrum, n=N, dim=1)[:, :L]
