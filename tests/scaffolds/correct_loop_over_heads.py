# Correct variant (loop over heads): forward slices the projections per head and, for each
# (batch, head), does the work with 2-D matmuls on (T, d_h) matrices and a (T, T) decay mask,
# then concatenates the heads along the feature axis; step loops over heads as well. dtype-agnostic.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, _ = x.shape
        d = self.head_dim
        Q, K, V = feature_map(self.q_proj(x)), feature_map(self.k_proj(x)), self.v_proj(x)
        pos = torch.arange(T, device=x.device)
        lag = pos[:, None] - pos[None, :]
        gamma = self.decay.to(x.dtype)
        batch_out = []
        for b in range(B):
            heads = []
            for h in range(self.num_heads):
                cols = slice(h * d, (h + 1) * d)
                q, k, v = Q[b, :, cols], K[b, :, cols], V[b, :, cols]       # (T, d) each
                mask = torch.where(lag >= 0, gamma[h] ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
                w = (q @ k.T) * mask                                       # (T, T)
                heads.append((w @ v) / (w.sum(dim=1, keepdim=True) + EPS))
            batch_out.append(torch.cat(heads, dim=-1))                     # (T, D)
        return self.out_proj(torch.stack(batch_out))

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        d = self.head_dim
        Q, K, V = feature_map(self.q_proj(x_t)), feature_map(self.k_proj(x_t)), self.v_proj(x_t)
        gamma = self.decay.to(x_t.dtype)
        new_S, new_z, outs = [], [], []
        for h in range(self.num_heads):
            cols = slice(h * d, (h + 1) * d)
            q, k, v = Q[:, cols], K[:, cols], V[:, cols]                   # (B, d) each
            S_h = gamma[h] * S[:, h] + k[:, :, None] * v[:, None, :]
            z_h = gamma[h] * z[:, h] + k
            num = (q[:, None, :] @ S_h)[:, 0]                              # (B, d)
            outs.append(num / ((q * z_h).sum(dim=-1, keepdim=True) + EPS))
            new_S.append(S_h)
            new_z.append(z_h)
        return self.out_proj(torch.cat(outs, dim=-1)), (torch.stack(new_S, 1), torch.stack(new_z, 1))
