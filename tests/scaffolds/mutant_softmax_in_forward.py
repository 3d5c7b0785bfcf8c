# Mutant (one bug): forward is causal SOFTMAX attention, softmax(q k^T / sqrt(d_h)) with -inf
# above the diagonal, on the raw projections (no feature map phi, no decay), instead of linear
# attention. step is correct. The forms disagree everywhere except at T = 1.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        T = x.shape[1]
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, H, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = weights @ v
        return self.out_proj(self._merge_heads(out))
