# Mutant (one bug): softmax_recall_error normalizes over the QUERY axis (dim=0), so a query's
# weights do not sum to one (they are a column of the column-normalized matrix). At a very sharp
# beta both axes give nearly the identity, so only moderate temperatures expose it.
def softmax_recall_error(keys, values, beta):
    weights = torch.softmax(beta * (keys @ keys.T), dim=0)  # BUG: wrong axis
    return (weights @ values - values).norm(dim=1).mean()
