# Mutant (one bug): gla_parallel uses the exclusive cumulative log-gate g_t - log gate_t (the sum
# over i < t) for both q and k, so the score of (t, j) carries gate_j ... gate_{t-1} instead of
# gate_{j+1} ... gate_t: the window of gates is shifted by one.
def gla_parallel(q, k, v, gate):
    gate = gate[:, None] if gate.dim() == 1 else gate
    log_gate = torch.log(gate)
    g = torch.cumsum(log_gate, dim=0) - log_gate  # BUG: exclusive cumsum
    q_tilde = feature_map(q) * torch.exp(g)
    k_tilde = feature_map(k) * torch.exp(-g)
    L = q.shape[0]
    causal = torch.ones(L, L, dtype=q.dtype).tril()
    return ((q_tilde @ k_tilde.T) * causal) @ v
