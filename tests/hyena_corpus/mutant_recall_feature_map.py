# Mutant (one bug): linear_recall_error applies the attention feature map elu + 1 to the keys,
# which makes every entry positive and destroys orthogonality (orthonormal keys no longer recall).
def linear_recall_error(keys, values):
    features = feature_map(keys)  # BUG: the capacity experiment uses the keys as features directly
    S = features.T @ values
    recalled = features @ S
    return (recalled - values).norm(dim=1).mean()
