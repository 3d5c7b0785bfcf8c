# Correct variant (float32 forward, dtype-agnostic step): forward casts q, k, v, gamma and its mask to
# float32 and hands the float32 result to out_proj, so it runs only with float32 parameters (the
# notebook's); step follows the input's dtype. In float64 forward cannot run while step can: the
# step loop's float32 run is then needed too, so that equivalence compares the two float32 runs.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, _ = x.shape
        q = feature_map(self._split_heads(self.q_proj(x))).float()
        k = feature_map(self._split_heads(self.k_proj(x))).float()
        v = self._split_heads(self.v_proj(x)).float()
        positions = torch.arange(T, device=x.device)
        lag = (positions[:, None] - positions[None, :]).float()
        gamma = self.decay.float().view(1, self.num_heads, 1, 1)
        causal = torch.tril(torch.ones(T, T, dtype=torch.float32, device=x.device))
        mask = gamma ** lag.clamp(min=0) * causal
        weights = (q @ k.transpose(-1, -2)) * mask
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x_t).view(B, H, d))
        k = feature_map(self.k_proj(x_t).view(B, H, d))
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype).view(1, H, 1)
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
