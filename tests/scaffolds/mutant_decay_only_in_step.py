# Mutant (one bug): forward uses a plain causal (lower-triangular 0/1) mask with no
# gamma^(t-i) decay; step decays S and z correctly. Both forms agree at gamma = 1 and the
# forward matches the undecayed reference, but they disagree for gamma < 1.
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
        mask = torch.ones(T, T, dtype=x.dtype, device=x.device).tril()  # causal: i <= t
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))
