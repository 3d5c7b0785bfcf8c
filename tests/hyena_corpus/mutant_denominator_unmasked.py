# Mutant (one bug): linear_attention_parallel's numerator is masked, but the normalizer sums
# phi(q_t) . phi(k_j) over the whole row, future keys included.
def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    causal = torch.ones(L, L, dtype=q.dtype).tril()
    raw = feature_map(q) @ feature_map(k).T
    y = (raw * causal) @ v
    if normalize:
        y = y / raw.sum(dim=1, keepdim=True)  # BUG: unmasked row sum
    return y
