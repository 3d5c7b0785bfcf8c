def linear_attention_recurrent(q, k, v, normalize=True):
    phi_q, phi_k = feature_map(q), feature_map(k)
    M = torch.einsum("i,j->ij", q.new_zeros(k.shape[1]), q.new_zeros(v.shape[1]))
    n_acc = q.new_zeros(k.shape[1])
    outs = []
    for t in range(q.shape[0]):
        M += torch.einsum("i,j->ij", phi_k[t], v[t])
        n_acc += phi_k[t]
        y = torch.einsum("i,ij->j", phi_q[t], M)
        outs.append(y / torch.einsum("i,i->", phi_q[t], n_acc) if normalize else y)
    return torch.stack(outs)


def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    A = torch.tril(torch.einsum("ti,ji->tj", feature_map(q), feature_map(k)))
    y = torch.einsum("tj,jv->tv", A, v)
    return y / torch.einsum("tj->t", A)[:, None] if normalize else y


def gla_recurrent(q, k, v, gate):
    phi_q, phi_k = feature_map(q), feature_map(k)
    d_k = k.shape[1]
    M = q.new_zeros(d_k, v.shape[1])
    outs = []
    for t in range(q.shape[0]):
        g_t = gate[t].expand(d_k) if gate.dim() == 1 else gate[t]
        M = torch.einsum("i,ij->ij", g_t, M) + torch.einsum("i,j->ij", phi_k[t], v[t])
        outs.append(torch.einsum("i,ij->j", phi_q[t], M))
    return torch.stack(outs)


def gla_parallel(q, k, v, gate):
    lg = torch.log(gate)
    if gate.dim() == 1:
        lg = torch.einsum("t,c->tc", lg, q.new_ones(k.shape[1]))
    g = lg.cumsum(dim=0)
    q_t = torch.einsum("tc,tc->tc", feature_map(q), torch.exp(g))
    k_t = torch.einsum("tc,tc->tc", feature_map(k), (-g).exp())
    A = torch.tril(torch.einsum("tc,jc->tj", q_t, k_t))
    return torch.einsum("tj,jv->tv", A, v)


def retnet_decay_mask(length, gamma):
    idx = torch.arange(length)
    lag = (idx[:, None] - idx[None, :]).clamp(min=0).to(torch.float64)
    return torch.tril(torch.pow(torch.tensor(float(gamma), dtype=torch.float64), lag))


def gla_decay_mask(gate):
    g = torch.cumsum(torch.log(gate), dim=0)
    diff = torch.einsum("t,j->tj", g, torch.ones_like(g)) - torch.einsum("t,j->tj", torch.ones_like(g), g)
    return torch.tril(torch.exp(torch.tril(diff)))  # inner tril: no overflow above the diagonal


def fft_causal_conv(u, k):
    L = u.shape[1]
    spec = torch.einsum("bfc,fc->bfc", torch.fft.rfft(u, n=2 * L, dim=1), torch.fft.rfft(k, n=2 * L, dim=0))
    return torch.fft.irfft(spec, n=2 * L, dim=1)[:, :L]


def toeplitz_causal_conv(u, k):
    L = u.shape[1]
    up = F.pad(u, (0, 0, L - 1, 0))                 # L - 1 zeros before the sequence
    win = up.unfold(1, L, 1)                    # (B, L, D, L): win[b, n, c, i] = u[b, n + i - (L - 1), c]
    return torch.einsum("bnci,ic->bnc", win, k.flip(0))


def fft_cyclic_conv(u, k):
    L = u.shape[1]
    spec = torch.einsum("bfc,fc->bfc", torch.fft.fft(u, dim=1), torch.fft.fft(k, dim=0))
    return torch.fft.ifft(spec, n=L, dim=1).real


def random_unit_vectors(n, d, generator):
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    return x / torch.sqrt(torch.einsum("nd,nd->n", x, x))[:, None]


def orthonormal_vectors(n, d, generator):
    if n > d:
        raise ValueError(f"need n <= d, got n={n}, d={d}")
    Q, _ = torch.linalg.qr(torch.randn(d, n, generator=generator, dtype=torch.float64), mode="reduced")
    return torch.einsum("dn->nd", Q).contiguous()


def linear_recall_error(keys, values):
    M = torch.einsum("ki,kj->ij", keys, values)
    err = torch.einsum("ki,ij->kj", keys, M) - values
    return torch.sqrt(torch.einsum("kj,kj->k", err, err)).mean()


def softmax_recall_error(keys, values, beta):
    W = torch.softmax(beta * torch.einsum("ki,li->kl", keys, keys), dim=1)
    err = torch.einsum("kl,lj->kj", W, values) - values
    return torch.sqrt(torch.einsum("kj,kj->k", err, err)).mean()


def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    sampler = random_unit_vectors if key_kind == "random" else orthonormal_vectors
    curve = []
    for K in Ks:
        per_seed = []
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            keys = sampler(K, d_k, gen)
            per_seed.append(linear_recall_error(keys, orthonormal_vectors(K, K, gen)))
        curve.append(sum(per_seed) / len(per_seed))
    return torch.stack(curve)
