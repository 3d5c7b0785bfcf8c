# Mutant (one bug): forward's mask keeps only i < t (torch.tril(..., diagonal=-1)), with weight
# gamma^(t-i) there, so token t does not see itself; the denominator is the row sum + EPS as
# usual, so position 0 (an empty row) gives out_proj(0) = the output bias. step is correct.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        T = x.shape[1]
        q = feature_map(self._split_heads(self.q_proj(x)))
        k = feature_map(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        positions = torch.arange(T, device=x.device)
        lag = positions[:, None] - positions[None, :]  # t - i
        gamma = self.decay.to(x.dtype).view(1, self.num_heads, 1, 1)
        mask = torch.tril(gamma ** lag.clamp(min=0), diagonal=-1)  # i < t only: the diagonal is lost
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))
