# Mutant (one bug): gla_decay_mask multiplies gate_j ... gate_t (the product includes the gate of
# the key's own position j), i.e. exp(g_t - g_{j-1}): the diagonal is gate_t instead of 1.
def gla_decay_mask(gate):
    log_gate = torch.log(gate)
    g = torch.cumsum(log_gate, dim=0)
    L = gate.shape[0]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    exponent = g[:, None] - (g - log_gate)[None, :]  # BUG: g_t - g_{j-1}
    return torch.exp(exponent.masked_fill(~causal, float("-inf")))
