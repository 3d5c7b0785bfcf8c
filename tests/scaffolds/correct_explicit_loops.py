# Correct variant (explicit loops): forward walks every pair (t, i <= t) in Python, weighting
# phi(q_t).phi(k_i) by gamma^(t-i) and accumulating numerator and denominator per position;
# step updates each head's (S, z) in a Python loop over heads. Slow but exact; dtype-agnostic.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, _ = x.shape
        q = feature_map(self._split_heads(self.q_proj(x)))  # (B, H, T, d)
        k = feature_map(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        gamma = self.decay.to(x.dtype)  # (H,)
        rows = []
        for t in range(T):
            numerator = torch.zeros_like(v[:, :, 0])                 # (B, H, d)
            denominator = torch.zeros_like(v[:, :, 0, :1])           # (B, H, 1)
            for i in range(t + 1):
                similarity = (q[:, :, t] * k[:, :, i]).sum(dim=-1)   # (B, H)
                w = similarity * gamma ** (t - i)                    # decayed weight of token i
                numerator = numerator + w[..., None] * v[:, :, i]
                denominator = denominator + w[..., None]
            rows.append(numerator / (denominator + EPS))
        out = torch.stack(rows, dim=2)  # (B, H, T, d)
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
        gamma = self.decay.to(x_t.dtype)
        new_S, new_z, outs = [], [], []
        for h in range(H):
            S_h = gamma[h] * S[:, h] + k[:, h, :, None] * v[:, h, None, :]  # (B, d, d)
            z_h = gamma[h] * z[:, h] + k[:, h]                               # (B, d)
            num = (q[:, h, :, None] * S_h).sum(dim=1)                        # (B, d)
            den = (q[:, h] * z_h).sum(dim=-1, keepdim=True)                  # (B, 1)
            new_S.append(S_h)
            new_z.append(z_h)
            outs.append(num / (den + EPS))
        S = torch.stack(new_S, dim=1)
        z = torch.stack(new_z, dim=1)
        out = torch.cat(outs, dim=-1)  # head h fills columns h*d:(h+1)*d
        return self.out_proj(out), (S, z)
