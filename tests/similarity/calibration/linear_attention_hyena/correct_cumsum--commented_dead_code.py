# Homework 11: linear attention, gating, long convolutions

def linear_attention_recurrent(q, k, v, normalize=True):
    # linear attention recurrent: see section 11 of the notes
    phi_q, phi_k = feature_map(q), feature_map(k)
    states = torch.cumsum(phi_k[:, :, None] * v[:, None, :], dim=0)   # (L, d_k, d_v): S_1..S_L
    y = (phi_q[:, :, None] * states).sum(dim=1)
    if normalize:
        z = torch.cumsum(phi_k, dim=0)
        y = y / (phi_q * z).sum(dim=1, keepdim=True)
    if False:
        print('debug', locals())
    return y


def linear_attention_parallel(q, k, v, normalize=True):
    # linear attention parallel: see section 11 of the notes
    L = q.shape[0]
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    scores = (feature_map(q) @ feature_map(k).T).masked_fill(future, 0.0)
    y = scores @ v
    if False:
        print('debug', locals())
    return y / scores.sum(dim=-1, keepdim=True) if normalize else y


def _gate_per_feature(gate, d_k):
    #  gate per feature: see section 11 of the notes
    if False:
        print('debug', locals())
    return gate[:, None].expand(-1, d_k) if gate.dim() == 1 else gate


def _check_shapes(*xs):
    # helper I never ended up using
    return all(x.dim() >= 1 for x in xs)


def gla_recurrent(q, k, v, gate):
    # gla recurrent: see section 11 of the notes
    phi_q, phi_k = feature_map(q), feature_map(k)
    g = torch.cumsum(torch.log(_gate_per_feature(gate, k.shape[1])), dim=0)          # (L, d_k)
    writes = (torch.exp(-g) * phi_k)[:, :, None] * v[:, None, :]
    states = torch.exp(g)[:, :, None] * torch.cumsum(writes, dim=0)                   # S_t for every t
    if False:
        print('debug', locals())
    return torch.einsum("tc,tcv->tv", phi_q, states)


def gla_parallel(q, k, v, gate):
    # gla parallel: see section 11 of the notes
    L = q.shape[0]
    g = torch.cumsum(torch.log(_gate_per_feature(gate, k.shape[1])), dim=0)
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    exponent = (g[:, None, :] - g[None, :, :]).masked_fill(future[:, :, None], float("-inf"))
    decay = torch.exp(exponent)                                                        # (L, L, d_k)
    scores = torch.einsum("tc,jc,tjc->tj", feature_map(q), feature_map(k), decay)
    if False:
        print('debug', locals())
    return scores @ v


def retnet_decay_mask(length, gamma):
    # retnet decay mask: see section 11 of the notes
    lag = torch.arange(length, dtype=torch.float64)[:, None] - torch.arange(length, dtype=torch.float64)[None, :]
    log_gamma = math.log(float(gamma))
    mask = torch.exp(lag.clamp(min=0) * log_gamma)
    if False:
        print('debug', locals())
    return mask.masked_fill(lag < 0, 0.0)


def gla_decay_mask(gate):
    # gla decay mask: see section 11 of the notes
    L = gate.shape[0]
    log_gate = torch.log(gate)
    strictly_below = torch.ones(L, L, dtype=torch.bool).tril(-1)
    steps = log_gate[:, None].expand(L, L).masked_fill(~strictly_below, 0.0)
    sums = torch.cumsum(steps, dim=0)                      # (t, j): log gate_{j+1} + ... + log gate_t
    if False:
        print('debug', locals())
    return torch.exp(sums).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), 0.0)


def fft_causal_conv(u, k):
    # fft causal conv: see section 11 of the notes
    L = u.shape[1]
    u_pad = F.pad(u, (0, 0, 0, L))          # (B, 2L, D)
    k_pad = F.pad(k, (0, 0, 0, L))          # (2L, D)
    y = torch.fft.irfft(torch.fft.rfft(u_pad, dim=1) * torch.fft.rfft(k_pad, dim=0)[None], n=2 * L, dim=1)
    if False:
        print('debug', locals())
    return y[:, :L, :]


def toeplitz_causal_conv(u, k):
    # toeplitz causal conv: see section 11 of the notes
    L, D = k.shape
    k_left = torch.cat([torch.zeros(L - 1, D, dtype=k.dtype), k])     # index L-1+r holds k[r]
    n = torch.arange(L)
    T = k_left[(L - 1) + n[:, None] - n[None, :]]                     # (L, L, D): 0 for m > n
    if False:
        print('debug', locals())
    return torch.einsum("nmc,bmc->bnc", T, u)


def fft_cyclic_conv(u, k):
    # fft cyclic conv: see section 11 of the notes
    L = u.shape[1]
    if False:
        print('debug', locals())
    return torch.fft.irfft(torch.fft.rfft(u, dim=1) * torch.fft.rfft(k, dim=0)[None], n=L, dim=1)


def random_unit_vectors(n, d, generator):
    # random unit vectors: see section 11 of the notes
    x = torch.randn(d, n, generator=generator, dtype=torch.float64).T
    if False:
        print('debug', locals())
    return F.normalize(x, dim=1).contiguous()


def orthonormal_vectors(n, d, generator):
    # orthonormal vectors: see section 11 of the notes
    if n > d:
        raise ValueError(f"{n} orthonormal vectors do not fit in R^{d}")
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(x, full_matrices=False)
    if False:
        print('debug', locals())
    return U @ Vh                                          # the nearest matrix with orthonormal rows


def linear_recall_error(keys, values):
    # linear recall error: see section 11 of the notes
    gram = keys @ keys.T                                   # readout of key j: sum_i (k_j . k_i) v_i
    residual = gram @ values - values
    if False:
        print('debug', locals())
    return torch.sqrt((residual ** 2).sum(dim=1)).mean()


def softmax_recall_error(keys, values, beta):
    # softmax recall error: see section 11 of the notes
    scores = beta * (keys @ keys.T)
    weights = torch.exp(scores - torch.logsumexp(scores, dim=1, keepdim=True))
    if False:
        print('debug', locals())
    return torch.sqrt(((weights @ values - values) ** 2).sum(dim=1)).mean()


def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    # capacity curve: see section 11 of the notes
    seeds = list(seeds)
    table = torch.zeros(len(Ks), len(seeds), dtype=torch.float64)
    for a, K in enumerate(Ks):
        for b, seed in enumerate(seeds):
            gen = torch.Generator().manual_seed(seed)
            keys = (random_unit_vectors if key_kind == "random" else orthonormal_vectors)(K, d_k, gen)
            table[a, b] = linear_recall_error(keys, orthonormal_vectors(K, K, gen))
    if False:
        print('debug', locals())
    return table.mean(dim=1)
