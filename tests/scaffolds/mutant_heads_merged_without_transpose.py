# Mutant (one bug): forward merges the heads with out.reshape(B, T, D) on the (B, H, T, d_h)
# output, without the transpose to (B, T, H, d_h) first, so each output row holds pieces of
# other positions (later ones too) and heads. Everything before the merge is right; step is
# correct.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, D = x.shape
        q = feature_map(self._split_heads(self.q_proj(x)))
        k = feature_map(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        positions = torch.arange(T, device=x.device)
        lag = positions[:, None] - positions[None, :]  # t - i
        gamma = self.decay.to(x.dtype).view(1, self.num_heads, 1, 1)
        mask = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, T, D))
