def linear_attention_parallel(q, k, v, normalize=True):  # done
    T_len, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    scores = torch.zeros(T_len, T_len, dtype=q.dtype)
    for c in range(d_k):                           # phi(Q) phi(K)^T as a sum of rank-one terms
        scores = scores + torch.outer(phi_q[:, c], phi_k[:, c])
    idx = torch.arange(T_len)
    scores = scores * (idx[:, None] >= idx[None, :]).to(q.dtype)
    y = scores @ v
    if normalize:
        y = y / scores.sum(dim=1)[:, None]
    return y


def gla_parallel(q, k, v, gate):  # done
    T_len, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    idx = torch.arange(T_len)
    causal = (idx[:, None] >= idx[None, :]).to(q.dtype)
    y = torch.zeros(T_len, v.shape[1], dtype=q.dtype)
    for c in range(d_k):                           # one rescaled rank-one score matrix per feature
        log_gate = torch.log(gate if gate.dim() == 1 else gate[:, c])
        g = torch.cumsum(log_gate, dim=0)
        scores = torch.outer(phi_q[:, c] * torch.exp(g), phi_k[:, c] * torch.exp(-g))
        y = y + (scores * causal) @ v
    return y


def gla_decay_mask(gate):  # done
    T_len = gate.shape[0]
    mask = torch.zeros(T_len, T_len, dtype=gate.dtype)
    for step_i in range(T_len):
        mask[step_i, step_i] = 1.0
        for j in range(step_i - 1, -1, -1):             # extend the product one gate to the left
            mask[step_i, j] = mask[step_i, j + 1] * gate[j + 1]
    return mask


def toeplitz_causal_conv(u, k):  # done
    B, T_len, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        T = torch.zeros(T_len, T_len, dtype=k.dtype)
        for n in range(T_len):
            T[n, : n + 1] = k[: n + 1, c].flip(0)  # T[n, m] = k[n - m] for m = 0..n
        y[:, :, c] = u[:, :, c] @ T.T
    return y


def random_unit_vectors(n, d, generator):  # done
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    for j_idx in range(n):
        x[j_idx] = x[j_idx] / math.sqrt(float((x[j_idx] * x[j_idx]).sum()))
    return x


def linear_recall_error(keys, values):  # done
    K = keys.shape[0]
    mem = torch.zeros(keys.shape[1], values.shape[1], dtype=keys.dtype)
    for j_idx in range(K):
        mem = mem + torch.outer(keys[j_idx], values[j_idx])
    acc = 0.0
    for j in range(K):
        acc = acc + torch.linalg.vector_norm(mem.T @ keys[j] - values[j])
    return acc / K


def capacity_curve(Ks, d_k, seeds, key_kind="random"):  # done
    result = []
    for K in Ks:
        acc, count = 0.0, 0
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            if key_kind == "random":
                keys = random_unit_vectors(K, d_k, gen)
            else:
                keys = orthonormal_vectors(K, d_k, gen)
            values = orthonormal_vectors(K, K, gen)
            acc = acc + float(linear_recall_error(keys, values))
            count += 1
        result.append(acc / count)
    return torch.tensor(result, dtype=torch.float64)


def linear_attention_recurrent(q, k, v, normalize=True):  # done
    T_len, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    mem = torch.zeros(d_k, v.shape[1], dtype=q.dtype)
    zz = torch.zeros(d_k, dtype=q.dtype)
    rows = []
    for step_i in range(T_len):
        for c in range(d_k):                       # one row of mem per key feature
            mem[c] = mem[c] + phi_k[step_i, c] * v[step_i]
            zz[c] = zz[c] + phi_k[step_i, c]
        y = torch.zeros(v.shape[1], dtype=q.dtype)
        for c in range(d_k):
            y = y + phi_q[step_i, c] * mem[c]
        if normalize:
            y = y / torch.dot(phi_q[step_i], zz)
        rows.append(y)
    return torch.stack(rows)


def gla_recurrent(q, k, v, gate):  # done
    T_len, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    mem = torch.zeros(d_k, v.shape[1], dtype=q.dtype)
    rows = []
    for step_i in range(T_len):
        for c in range(d_k):
            g = gate[step_i] if gate.dim() == 1 else gate[step_i, c]
            mem[c] = g * mem[c] + phi_k[step_i, c] * v[step_i]
        y = torch.zeros(v.shape[1], dtype=q.dtype)
        for c in range(d_k):
            y = y + phi_q[step_i, c] * mem[c]
        rows.append(y)
    return torch.stack(rows)


def retnet_decay_mask(length, gamma):  # done
    gamma = float(gamma)
    rows = [[gamma ** (step_i - j) if j <= step_i else 0.0 for j in range(length)] for step_i in range(length)]
    return torch.tensor(rows, dtype=torch.float64).reshape(length, length)


def fft_causal_conv(u, k):  # done
    B, T_len, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        u_pad = torch.cat([u[:, :, c], torch.zeros(B, T_len, dtype=u.dtype)], dim=1)
        k_pad = torch.cat([k[:, c], torch.zeros(T_len, dtype=k.dtype)])
        full = torch.fft.ifft(torch.fft.fft(u_pad, dim=1) * torch.fft.fft(k_pad)[None, :], dim=1)
        y[:, :, c] = full.real[:, :T_len]
    return y


def fft_cyclic_conv(u, k):  # done
    B, T_len, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        y[:, :, c] = torch.fft.ifft(torch.fft.fft(u[:, :, c], dim=1) * torch.fft.fft(k[:, c])[None, :], dim=1).real
    return y


def orthonormal_vectors(n, d, generator):  # done
    if n > d:
        raise ValueError("n must not exceed d")
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    basis = torch.zeros(n, d, dtype=torch.float64)
    for j_idx in range(n):
        w = x[j_idx]
        for _ in range(2):                         # Gram-Schmidt twice: orthogonal to rounding
            for j in range(j_idx):
                w = w - torch.dot(basis[j], w) * basis[j]
        basis[j_idx] = w / w.norm()
    return basis


def softmax_recall_error(keys, values, beta):  # done
    K = keys.shape[0]
    acc = 0.0
    for j in range(K):
        scores = beta * (keys @ keys[j])
        w = torch.exp(scores - scores.max())
        w = w / w.sum()
        acc = acc + torch.linalg.vector_norm(w @ values - values[j])
    return acc / K
