# Correct variant (flattened heads + bmm): batch and heads are flattened into one axis,
# (B*H, T, d_h), and every product is a torch.bmm; the (H, T, T) decay mask is repeated over
# the batch. step keeps the (B, H, d, d) state shape but works on (B*H, d, d) views. dtype-agnostic.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, D = x.shape
        H, d = self.num_heads, self.head_dim

        def flat(y):  # (B, T, D) -> (B*H, T, d)
            return y.view(B, T, H, d).permute(0, 2, 1, 3).reshape(B * H, T, d)

        q, k, v = flat(feature_map(self.q_proj(x))), flat(feature_map(self.k_proj(x))), flat(self.v_proj(x))
        pos = torch.arange(T, device=x.device)
        lag = pos[:, None] - pos[None, :]
        gamma = self.decay.to(x.dtype).view(H, 1, 1)
        mask = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
        mask = mask.repeat(B, 1, 1)                                       # (B*H, T, T), b-major
        w = torch.bmm(q, k.transpose(1, 2)) * mask
        out = torch.bmm(w, v) / (w.sum(dim=-1, keepdim=True) + EPS)      # (B*H, T, d)
        out = out.view(B, H, T, d).permute(0, 2, 1, 3).reshape(B, T, D)
        return self.out_proj(out)

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B, D = x_t.shape
        H, d = self.num_heads, self.head_dim
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        q = feature_map(self.q_proj(x_t)).reshape(B * H, 1, d)
        k = feature_map(self.k_proj(x_t)).reshape(B * H, 1, d)
        v = self.v_proj(x_t).reshape(B * H, 1, d)
        gamma = self.decay.to(x_t.dtype).repeat(B).view(B * H, 1, 1)
        S = gamma * S.reshape(B * H, d, d) + torch.bmm(k.transpose(1, 2), v)
        z = gamma * z.reshape(B * H, 1, d) + k
        num = torch.bmm(q, S)                                             # (B*H, 1, d)
        den = torch.bmm(q, z.transpose(1, 2))                             # (B*H, 1, 1)
        out = (num / (den + EPS)).view(B, D)
        return self.out_proj(out), (S.view(B, H, d, d), z.view(B, H, d))
