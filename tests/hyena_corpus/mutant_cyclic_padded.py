# Mutant (one bug): fft_cyclic_conv pads to 2L like the causal version, so the "un-padded" variant
# is causal after all and no longer shows the wrap-around.
def fft_cyclic_conv(u, k):
    L = u.shape[1]
    spectrum = torch.fft.rfft(u, n=2 * L, dim=1) * torch.fft.rfft(k, n=2 * L, dim=0)  # BUG: padded
    return torch.fft.irfft(spectrum, n=2 * L, dim=1)[:, :L]
