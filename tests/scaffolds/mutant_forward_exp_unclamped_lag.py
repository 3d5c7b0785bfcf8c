# Mutant (numerics): forward's mask is exp(lag * log gamma) over the whole (T, T) lag, future
# included, times a 0/1 causal mask: exact in float64 (e^354 at most for T = 512, gamma = 0.5),
# inf * 0 = nan in float32. step is correct.
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
        gamma = self.decay.to(x.dtype).view(1, self.num_heads, 1, 1)
        lag = (positions[:, None] - positions[None, :]).to(x.dtype)
        causal = (lag >= 0).to(x.dtype)
        mask = torch.exp(lag * torch.log(gamma)) * causal
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))
