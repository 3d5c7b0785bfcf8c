# Mutant (one bug): gla_recurrent multiplies S (d_k, d_v) by gate_t directly, so a per-feature
# gate broadcasts over the LAST axis (value features) instead of the rows (key features).
# Right for a scalar gate; wrong (when d_k == d_v) or a shape error (d_k != d_v) per feature.
def gla_recurrent(q, k, v, gate):
    phi_q, phi_k = feature_map(q), feature_map(k)
    S = q.new_zeros(k.shape[1], v.shape[1])
    outputs = []
    for t in range(q.shape[0]):
        S = S * gate[t] + torch.outer(phi_k[t], v[t])  # BUG: broadcast over the value axis
        outputs.append(phi_q[t] @ S)
    return torch.stack(outputs)
