# Mutant (one bug): the normalizer is never applied; both forms ignore normalize=True and return
# the unnormalized readout. The two forms still agree with each other.
def linear_attention_recurrent(q, k, v, normalize=True):
    phi_q, phi_k = feature_map(q), feature_map(k)
    S = q.new_zeros(k.shape[1], v.shape[1])
    outputs = []
    for t in range(q.shape[0]):
        S = S + torch.outer(phi_k[t], v[t])
        outputs.append(phi_q[t] @ S)  # BUG: no division by z . phi(q_t)
    return torch.stack(outputs)


def linear_attention_parallel(q, k, v, normalize=True):
    L = q.shape[0]
    causal = torch.ones(L, L, dtype=q.dtype).tril()
    scores = (feature_map(q) @ feature_map(k).T) * causal
    return scores @ v  # BUG: no division by the row sums
