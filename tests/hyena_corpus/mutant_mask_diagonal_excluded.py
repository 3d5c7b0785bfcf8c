# Mutant (one bug): linear_attention_parallel's causal mask is tril(diagonal=-1), so token t
# sees only j < t, not itself. Row 0 has no scores at all: 0 unnormalized, 0/0 = NaN normalized.
def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    causal = torch.ones(L, L, dtype=q.dtype).tril(-1)  # BUG: the diagonal is excluded
    scores = (feature_map(q) @ feature_map(k).T) * causal
    y = scores @ v
    if normalize:
        y = y / scores.sum(dim=1, keepdim=True)
    return y
