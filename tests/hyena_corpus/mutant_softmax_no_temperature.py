# Mutant (one bug): softmax_recall_error ignores beta (a softmax of the raw cosines, beta = 1),
# so the readout is a blur of all values instead of a sharp lookup.
def softmax_recall_error(keys, values, beta):
    weights = torch.softmax(keys @ keys.T, dim=-1)  # BUG: beta dropped
    return (weights @ values - values).norm(dim=1).mean()
