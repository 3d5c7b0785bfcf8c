def capacity_curve(Ks, d_k: int, seeds, key_kind: str = "random") -> torch.Tensor:
    draw_keys = {"random": random_unit_vectors, "orthonormal": orthonormal_vectors}[key_kind]
    res = []
    for K in Ks:
        errors = []
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            K_mat = draw_keys(K, d_k, gen)
            V_mat = orthonormal_vectors(K, K, gen)
            errors.append(linear_recall_error(K_mat, V_mat))
        res.append(torch.stack(errors).mean())
    return torch.stack(res).to(torch.float64)


def softmax_recall_error(K_mat, V_mat, beta: float) -> torch.Tensor:
    weights = torch.softmax(beta * (K_mat @ K_mat.T), dim=-1)  # row j: weights over stored K_mat
    return (weights @ V_mat - V_mat).norm(dim=1).mean()


def linear_recall_error(K_mat, V_mat) -> torch.Tensor:
    state = K_mat.T @ V_mat                     # (d_k, d_v): sum of the K outer products
    recalled = K_mat @ state                     # row j: state^T k_j
    return (recalled - V_mat).norm(dim=1).mean()


def orthonormal_vectors(n: int, d: int, generator) -> torch.Tensor:
    if n > d:
        raise ValueError(f"cannot have {n} orthonormal vectors in R^{d}")
    gaussian = torch.randn(d, n, generator=generator, dtype=torch.float64)
    Q, _ = torch.linalg.qr(gaussian)  # reduced QR: Q is (d, n)
    return Q.T.contiguous()


def random_unit_vectors(n: int, d: int, generator) -> torch.Tensor:
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def fft_cyclic_conv(u, k):
    n = u.shape[1]
    spectrum = torch.fft.rfft(u, n=n, dim=1) * torch.fft.rfft(k, n=n, dim=0)
    return torch.fft.irfft(spectrum, n=n, dim=1)


def toeplitz_causal_conv(u, k):
    n = u.shape[1]
    positions = torch.arange(n, device=u.device)
    dist = positions[:, None] - positions[None, :]                # (n, m) -> n - m
    taps = k[dist.clamp(min=0)]                                   # (n, n, D): k[n - m, c]
    toeplitz = taps * (dist >= 0).to(k.dtype)[:, :, None]
    return torch.einsum("nmc,bmc->bnc", toeplitz, u)


def fft_causal_conv(u, k):
    n = u.shape[1]
    spectrum = torch.fft.rfft(u, n=2 * n, dim=1) * torch.fft.rfft(k, n=2 * n, dim=0)
    return torch.fft.irfft(spectrum, n=2 * n, dim=1)[:, :n]


def gla_decay_mask(gate):
    g = torch.cumsum(torch.log(gate), dim=0)
    n = gate.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool, device=gate.device).tril()
    return torch.exp((g[:, None] - g[None, :]).masked_fill(~causal, float("-inf")))


def retnet_decay_mask(length: int, gamma):
    positions = torch.arange(length)
    dist = (positions[:, None] - positions[None, :]).to(torch.float64)  # t - j
    gamma = torch.as_tensor(gamma, dtype=torch.float64)
    return torch.where(dist >= 0, gamma ** dist.clamp(min=0), torch.zeros((), dtype=torch.float64))


def gla_parallel(q, k, v, gate):
    gate = gate[:, None] if gate.dim() == 1 else gate
    g = torch.cumsum(torch.log(gate), dim=0)            # (n, 1) or (n, d_k)
    q_tilde = feature_map(q) * torch.exp(g)
    k_tilde = feature_map(k) * torch.exp(-g)
    n = q.shape[0]
    causal = torch.ones(n, n, dtype=q.dtype, device=q.device).tril()
    return ((q_tilde @ k_tilde.T) * causal) @ v


def gla_recurrent(q, k, v, gate):
    fq, fk = feature_map(q), feature_map(k)
    gate = gate[:, None] if gate.dim() == 1 else gate  # (n, 1) or (n, d_k): one factor per row of state
    state = q.new_zeros(k.shape[1], v.shape[1])
    ys = []
    for t in range(q.shape[0]):
        state = gate[t][:, None] * state + torch.outer(fk[t], v[t])
        ys.append(fq[t] @ state)
    return torch.stack(ys)


def linear_attention_parallel(q, k, v, normalize: bool = True):
    n = q.shape[0]
    causal = torch.ones(n, n, dtype=q.dtype, device=q.device).tril()  # 1 for j <= t
    scores = (feature_map(q) @ feature_map(k).T) * causal
    y = scores @ v
    if normalize:
        y = y / scores.sum(dim=1, keepdim=True)
    return y


def linear_attention_recurrent(q, k, v, normalize: bool = True):
    fq, fk = feature_map(q), feature_map(k)
    state = q.new_zeros(k.shape[1], v.shape[1])
    norm = q.new_zeros(k.shape[1])
    ys = []
    for t in range(q.shape[0]):
        state = state + torch.outer(fk[t], v[t])  # write first: token t sees itself
        norm = norm + fk[t]
        y_t = fq[t] @ state                   # state^T phi(q_t), as a row vector
        if normalize:
            y_t = y_t / (fq[t] @ norm)
        ys.append(y_t)
    return torch.stack(ys)
