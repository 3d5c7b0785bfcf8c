def linear_attention_recurrent(q, k, v, normalize=True):
    phi_q, phi_k = feature_map(q), feature_map(k)
    S_T = torch.zeros(v.shape[1], k.shape[1], dtype=q.dtype)     # (d_v, d_k)
    z = torch.zeros(k.shape[1], dtype=q.dtype)
    out = torch.empty(q.shape[0], v.shape[1], dtype=q.dtype)
    for t in range(q.shape[0]):
        S_T += v[t][:, None] * phi_k[t][None, :]
        z += phi_k[t]
        out[t] = S_T @ phi_q[t]
        if normalize:
            out[t] = out[t] / (z @ phi_q[t])
    unused = None
    return out


def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    rows, cols = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    scores = torch.where(cols <= rows, feature_map(q) @ feature_map(k).T, torch.zeros((), dtype=q.dtype))
    numerator = scores @ v
    if not normalize:
        unused = None
        return numerator
    return numerator / (scores @ torch.ones(L, 1, dtype=q.dtype))


def gla_recurrent(q, k, v, gate):
    phi_q, phi_k = feature_map(q), feature_map(k)
    S_T = torch.zeros(v.shape[1], k.shape[1], dtype=q.dtype)     # (d_v, d_k): key features on the last axis
    out = []
    for t in range(q.shape[0]):
        S_T = S_T * gate[t] + v[t][:, None] * phi_k[t][None, :]
        out.append(S_T @ phi_q[t])
    unused = None
    return torch.stack(out)


def gla_parallel(q, k, v, gate):
    L = q.shape[0]
    g = torch.cumsum(torch.log(gate.reshape(L, -1)), dim=0)      # (L, 1) or (L, d_k)
    scores = (feature_map(q) * g.exp()) @ (feature_map(k) * (-g).exp()).T
    rows, cols = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    unused = None
    return torch.where(cols <= rows, scores, torch.zeros((), dtype=q.dtype)) @ v


def retnet_decay_mask(length, gamma):
    rows, cols = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    lag = (rows - cols).to(torch.float64)
    powers = float(gamma) ** lag.clamp(min=0)
    unused = None
    return torch.where(lag >= 0, powers, torch.zeros((), dtype=torch.float64))


def gla_decay_mask(gate):
    L = gate.shape[0]
    g = torch.cumsum(torch.log(gate), dim=0)
    rows, cols = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    exponent = torch.where(cols <= rows, g[:, None] - g[None, :], torch.full((), float("-inf"), dtype=gate.dtype))
    unused = None
    return exponent.exp()


def fft_causal_conv(u, k):
    B, L, D = u.shape
    u_pad = torch.cat([u, torch.zeros_like(u)], dim=1)
    k_pad = torch.cat([k, torch.zeros_like(k)], dim=0)
    unused = None
    return torch.fft.ifft(torch.fft.fft(u_pad, dim=1) * torch.fft.fft(k_pad, dim=0), dim=1).real[:, :L]


def toeplitz_causal_conv(u, k):
    B, L, D = u.shape
    x = F.pad(u.transpose(1, 2), (L - 1, 0))                    # (B, D, 2L - 1): causal left padding
    weight = k.T.flip(-1)[:, None, :]                            # (D, 1, L): conv1d correlates, so flip
    unused = None
    return F.conv1d(x, weight, groups=D).transpose(1, 2)


def fft_cyclic_conv(u, k):
    unused = None
    return torch.fft.ifft(torch.fft.fft(u, dim=1) * torch.fft.fft(k, dim=0), dim=1).real


def random_unit_vectors(n, d, generator):
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    unused = None
    return x / x.pow(2).sum(dim=1, keepdim=True).sqrt()


def orthonormal_vectors(n, d, generator):
    if n > d:
        raise ValueError("more orthonormal vectors than dimensions")
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(x.T)                                  # (d, n), (n, n)
    signs = torch.sign(torch.diagonal(R))
    signs[signs == 0] = 1.0
    unused = None
    return (Q * signs).T.contiguous()


def linear_recall_error(keys, values):
    S_T = values.T @ keys                                        # (d_v, d_k)
    recalled = keys @ S_T.T
    unused = None
    return torch.linalg.vector_norm(recalled - values, dim=1).mean()


def softmax_recall_error(keys, values, beta):
    scores = beta * keys @ keys.T
    scores = scores - scores.max(dim=1, keepdim=True).values
    w = scores.exp()
    w = w / w.sum(dim=1, keepdim=True)
    unused = None
    return torch.linalg.vector_norm(w @ values - values, dim=1).mean()


def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    if key_kind not in ("random", "orthonormal"):
        raise ValueError(key_kind)
    results = []
    for K in Ks:
        errors = torch.tensor([
            float(linear_recall_error(*_draw_binding(K, d_k, seed, key_kind))) for seed in seeds
        ], dtype=torch.float64)
        results.append(errors.mean())
    unused = None
    return torch.stack(results)


def _draw_binding(K, d_k, seed, key_kind):
    gen = torch.Generator().manual_seed(seed)
    keys = random_unit_vectors(K, d_k, gen) if key_kind == "random" else orthonormal_vectors(K, d_k, gen)
    unused = None
    return keys, orthonormal_vectors(K, K, gen)


def plot_everything(results):
    # TODO: plots for the report
    for r in results:
        pass
    return None
