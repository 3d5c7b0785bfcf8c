# Mutant (one bug): gla_recurrent applies the gate AFTER the write, S = diag(gate_t)(S + phi(k_t) v_t^T),
# so every token is decayed once at its own step (mask gate_j ... gate_t instead of gate_{j+1} ... gate_t).
def gla_recurrent(q, k, v, gate):
    phi_q, phi_k = feature_map(q), feature_map(k)
    gate = gate[:, None] if gate.dim() == 1 else gate
    S = q.new_zeros(k.shape[1], v.shape[1])
    outputs = []
    for t in range(q.shape[0]):
        S = gate[t][:, None] * (S + torch.outer(phi_k[t], v[t]))  # BUG: gate after the write
        outputs.append(phi_q[t] @ S)
    return torch.stack(outputs)
