# Correct variant (loop style): Python loops over positions in the recurrences and over key
# features in the masked forms (no loop over positions there), masks built entry by entry,
# the FFT done per channel with complex torch.fft.fft on explicitly zero-padded copies,
# Gram-Schmidt (applied twice) for orthonormal vectors. Everything follows the input dtype.


def linear_attention_recurrent(q, k, v, normalize=True):
    L, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    S = torch.zeros(d_k, v.shape[1], dtype=q.dtype)
    z = torch.zeros(d_k, dtype=q.dtype)
    rows = []
    for t in range(L):
        for c in range(d_k):                       # one row of S per key feature
            S[c] = S[c] + phi_k[t, c] * v[t]
            z[c] = z[c] + phi_k[t, c]
        y = torch.zeros(v.shape[1], dtype=q.dtype)
        for c in range(d_k):
            y = y + phi_q[t, c] * S[c]
        if normalize:
            y = y / torch.dot(phi_q[t], z)
        rows.append(y)
    return torch.stack(rows)


def linear_attention_parallel(q, k, v, normalize=True):
    L, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    scores = torch.zeros(L, L, dtype=q.dtype)
    for c in range(d_k):                           # phi(Q) phi(K)^T as a sum of rank-one terms
        scores = scores + torch.outer(phi_q[:, c], phi_k[:, c])
    idx = torch.arange(L)
    scores = scores * (idx[:, None] >= idx[None, :]).to(q.dtype)
    y = scores @ v
    if normalize:
        y = y / scores.sum(dim=1)[:, None]
    return y


def gla_recurrent(q, k, v, gate):
    L, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    S = torch.zeros(d_k, v.shape[1], dtype=q.dtype)
    rows = []
    for t in range(L):
        for c in range(d_k):
            g = gate[t] if gate.dim() == 1 else gate[t, c]
            S[c] = g * S[c] + phi_k[t, c] * v[t]
        y = torch.zeros(v.shape[1], dtype=q.dtype)
        for c in range(d_k):
            y = y + phi_q[t, c] * S[c]
        rows.append(y)
    return torch.stack(rows)


def gla_parallel(q, k, v, gate):
    L, d_k = k.shape
    phi_q, phi_k = feature_map(q), feature_map(k)
    idx = torch.arange(L)
    causal = (idx[:, None] >= idx[None, :]).to(q.dtype)
    y = torch.zeros(L, v.shape[1], dtype=q.dtype)
    for c in range(d_k):                           # one rescaled rank-one score matrix per feature
        log_gate = torch.log(gate if gate.dim() == 1 else gate[:, c])
        g = torch.cumsum(log_gate, dim=0)
        scores = torch.outer(phi_q[:, c] * torch.exp(g), phi_k[:, c] * torch.exp(-g))
        y = y + (scores * causal) @ v
    return y


def retnet_decay_mask(length, gamma):
    gamma = float(gamma)
    rows = [[gamma ** (t - j) if j <= t else 0.0 for j in range(length)] for t in range(length)]
    return torch.tensor(rows, dtype=torch.float64).reshape(length, length)


def gla_decay_mask(gate):
    L = gate.shape[0]
    mask = torch.zeros(L, L, dtype=gate.dtype)
    for t in range(L):
        mask[t, t] = 1.0
        for j in range(t - 1, -1, -1):             # extend the product one gate to the left
            mask[t, j] = mask[t, j + 1] * gate[j + 1]
    return mask


def fft_causal_conv(u, k):
    B, L, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        u_pad = torch.cat([u[:, :, c], torch.zeros(B, L, dtype=u.dtype)], dim=1)
        k_pad = torch.cat([k[:, c], torch.zeros(L, dtype=k.dtype)])
        full = torch.fft.ifft(torch.fft.fft(u_pad, dim=1) * torch.fft.fft(k_pad)[None, :], dim=1)
        y[:, :, c] = full.real[:, :L]
    return y


def toeplitz_causal_conv(u, k):
    B, L, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        T = torch.zeros(L, L, dtype=k.dtype)
        for n in range(L):
            T[n, : n + 1] = k[: n + 1, c].flip(0)  # T[n, m] = k[n - m] for m = 0..n
        y[:, :, c] = u[:, :, c] @ T.T
    return y


def fft_cyclic_conv(u, k):
    B, L, D = u.shape
    y = torch.empty_like(u)
    for c in range(D):
        y[:, :, c] = torch.fft.ifft(torch.fft.fft(u[:, :, c], dim=1) * torch.fft.fft(k[:, c])[None, :], dim=1).real
    return y


def random_unit_vectors(n, d, generator):
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    for i in range(n):
        x[i] = x[i] / math.sqrt(float((x[i] * x[i]).sum()))
    return x


def orthonormal_vectors(n, d, generator):
    if n > d:
        raise ValueError("n must not exceed d")
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    basis = torch.zeros(n, d, dtype=torch.float64)
    for i in range(n):
        w = x[i]
        for _ in range(2):                         # Gram-Schmidt twice: orthogonal to rounding
            for j in range(i):
                w = w - torch.dot(basis[j], w) * basis[j]
        basis[i] = w / w.norm()
    return basis


def linear_recall_error(keys, values):
    K = keys.shape[0]
    S = torch.zeros(keys.shape[1], values.shape[1], dtype=keys.dtype)
    for i in range(K):
        S = S + torch.outer(keys[i], values[i])
    total = 0.0
    for j in range(K):
        total = total + torch.linalg.vector_norm(S.T @ keys[j] - values[j])
    return total / K


def softmax_recall_error(keys, values, beta):
    K = keys.shape[0]
    total = 0.0
    for j in range(K):
        scores = beta * (keys @ keys[j])
        w = torch.exp(scores - scores.max())
        w = w / w.sum()
        total = total + torch.linalg.vector_norm(w @ values - values[j])
    return total / K


def capacity_curve(Ks, d_k, seeds, key_kind="random"):
    out = []
    for K in Ks:
        total, count = 0.0, 0
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            if key_kind == "random":
                keys = random_unit_vectors(K, d_k, gen)
            else:
                keys = orthonormal_vectors(K, d_k, gen)
            values = orthonormal_vectors(K, K, gen)
            total = total + float(linear_recall_error(keys, values))
            count += 1
        out.append(total / count)
    return torch.tensor(out, dtype=torch.float64)
