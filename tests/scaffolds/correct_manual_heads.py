# Correct variant (hand-written head split): heads are split with view(B, T, H, d).transpose(1, 2)
# and merged with transpose(1, 2).contiguous().view(B, T, D) written out in place, without the
# _split_heads / _merge_heads helpers; the causal cut is a boolean (i <= t) factor. dtype-agnostic.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, D = x.shape
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x)).view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)
        k = feature_map(self.k_proj(x)).view(B, T, H, d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, d).transpose(1, 2)
        idx = torch.arange(T, device=x.device)
        lag = (idx[:, None] - idx[None, :]).clamp(min=0)
        gamma = self.decay.to(x.dtype)[:, None, None]                     # (H, 1, 1)
        mask = gamma ** lag * (idx[:, None] >= idx[None, :])              # (H, T, T)
        w = (q @ k.transpose(-2, -1)) * mask
        out = (w @ v) / (w.sum(dim=-1, keepdim=True) + EPS)               # (B, H, T, d)
        out = out.transpose(1, 2).contiguous().view(B, T, D)
        return self.out_proj(out)

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B, D = x_t.shape
        H, d = self.num_heads, self.head_dim
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        q = feature_map(self.q_proj(x_t)).view(B, H, d)
        k = feature_map(self.k_proj(x_t)).view(B, H, d)
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype)[None, :, None]                   # (1, H, 1)
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = (q[..., :, None] * S).sum(dim=-2) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.contiguous().view(B, D)), (S, z)
