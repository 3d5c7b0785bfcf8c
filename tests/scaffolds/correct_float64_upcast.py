# Correct variant (float64 inside): both forms do every projection and all attention
# arithmetic in float64 whatever the input dtype (weights upcast with .double()), and cast
# the output back to the input's dtype; step returns its state in the input's dtype too.
# Exact for float64; for float32 layers the result differs from pure float32 by ~1e-7.
class LinearAttention(Module):

    def _linear64(self, layer, x):
        """layer(x) computed in float64."""
        return x.double() @ layer.weight.double().T + layer.bias.double()

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        T = x.shape[1]
        q = feature_map(self._split_heads(self._linear64(self.q_proj, x)))
        k = feature_map(self._split_heads(self._linear64(self.k_proj, x)))
        v = self._split_heads(self._linear64(self.v_proj, x))
        positions = torch.arange(T, device=x.device)
        lag = positions[:, None] - positions[None, :]
        gamma = self.decay.double().view(1, self.num_heads, 1, 1)
        mask = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros((), dtype=torch.float64))
        weights = (q @ k.transpose(-1, -2)) * mask
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self._linear64(self.out_proj, self._merge_heads(out)).to(x.dtype)

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        S, z = S.double(), z.double()
        H, d = self.num_heads, self.head_dim
        q = feature_map(self._linear64(self.q_proj, x_t).view(B, H, d))
        k = feature_map(self._linear64(self.k_proj, x_t).view(B, H, d))
        v = self._linear64(self.v_proj, x_t).view(B, H, d)
        gamma = self.decay.double().view(1, H, 1)
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        y = self._linear64(self.out_proj, out.reshape(B, self.embedding_dim))
        return y.to(x_t.dtype), (S.to(x_t.dtype), z.to(x_t.dtype))
