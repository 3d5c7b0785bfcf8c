# Correct-but-float32 variant: the math is right, but the student hard-coded float32. The
# projections run in the module's dtype, then q, k, v, gamma, the mask and the recurrent
# state are cast to / created as torch.float32, and the result is cast back to the input's
# dtype before out_proj. It runs with float64 parameters and inputs, but is only accurate to
# ~1e-6 there; step also hands back a float32 (S, z) whatever the parameters' dtype.
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
        return self.out_proj(self._merge_heads(out).to(x.dtype))

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        H, d = self.num_heads, self.head_dim
        if state is None:
            S = torch.zeros(B, H, d, d, dtype=torch.float32, device=x_t.device)
            z = torch.zeros(B, H, d, dtype=torch.float32, device=x_t.device)
        else:
            S, z = state[0].float(), state[1].float()
        q = feature_map(self.q_proj(x_t).view(B, H, d)).float()
        k = feature_map(self.k_proj(x_t).view(B, H, d)).float()
        v = self.v_proj(x_t).view(B, H, d).float()
        gamma = self.decay.float().view(1, H, 1)
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim).to(x_t.dtype)), (S, z)
