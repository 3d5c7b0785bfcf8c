# Mutant (one bug): forward's decay mask uses gamma^(t-i+1) instead of gamma^(t-i) (the
# diagonal gets gamma instead of 1); step is correct. Because every weight in row t carries
# the same extra factor gamma, it cancels in the normalized ratio EXCEPT against EPS:
# forward effectively divides by (phi(q).z + EPS/gamma). The deviation is therefore zero at
# gamma = 1 and of order EPS*(1/gamma - 1)/(phi(q).z) otherwise: tiny (~1e-7..1e-6) for
# ordinary inputs, large when phi(q).z is made comparable to EPS (strongly negative q).
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
        mask = torch.where(lag >= 0, gamma ** (lag.clamp(min=0) + 1), torch.zeros((), dtype=x.dtype))
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))
