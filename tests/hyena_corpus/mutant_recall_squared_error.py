# Mutant (one bug): linear_recall_error averages the SQUARED norms ||v^_j - v_j||^2, which gives
# about (K - 1)/d_k instead of sqrt((K - 1)/d_k) for random unit keys (still 0 when exact).
def linear_recall_error(keys, values):
    S = keys.T @ values
    recalled = keys @ S
    return ((recalled - values) ** 2).sum(dim=1).mean()  # BUG: no square root
