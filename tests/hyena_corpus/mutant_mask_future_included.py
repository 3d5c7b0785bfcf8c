# Mutant (one bug): linear_attention_parallel's mask is tril(diagonal=1), off by one the other
# way: token t also sees token t + 1 (one future key leaks into every row but the last).
def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    causal = torch.ones(L, L, dtype=q.dtype).tril(1)  # BUG: includes j = t + 1
    scores = (feature_map(q) @ feature_map(k).T) * causal
    y = scores @ v
    if normalize:
        y = y / scores.sum(dim=1, keepdim=True)
    return y
