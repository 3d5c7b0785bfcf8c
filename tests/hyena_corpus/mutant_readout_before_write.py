# Mutant (one bug): linear_attention_recurrent reads y_t from the state BEFORE adding token t's
# write, so y_t misses (k_t, v_t) (at t = 0 it reads a zero state: 0, or 0/0 = NaN normalized).
def linear_attention_recurrent(q, k, v, normalize=True):
    phi_q, phi_k = feature_map(q), feature_map(k)
    S = q.new_zeros(k.shape[1], v.shape[1])
    z = q.new_zeros(k.shape[1])
    outputs = []
    for t in range(q.shape[0]):
        y_t = phi_q[t] @ S  # BUG: read first ...
        if normalize:
            y_t = y_t / (phi_q[t] @ z)
        outputs.append(y_t)
        S = S + torch.outer(phi_k[t], v[t])  # ... write after
        z = z + phi_k[t]
    return torch.stack(outputs)
