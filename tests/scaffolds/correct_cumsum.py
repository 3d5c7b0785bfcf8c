# Correct variant (cumulative sums, chunk-wise): inside a chunk, keys are rescaled by
# gamma^-r and queries by gamma^r (r = offset in the chunk), so sum_{j<=r} gamma^(r-j) phi(k_j)
# v_j^T is gamma^r times a plain cumsum over time of rescaled outer products. The chunk
# length is chosen so gamma^-r never exceeds e^20 (no overflow / underflow even for very
# strong decay, e.g. gamma = sigmoid(-2) at T = 256), and the (S, z) state is carried
# between chunks exactly like step does. dtype-agnostic.
MAX_LOG_RESCALE = 20.0  # largest |r * log gamma| allowed inside one chunk


class LinearAttention(Module):

    def _chunk_length(self, log_gamma, T):
        """Longest chunk whose rescaling factors gamma^-r stay below e^MAX_LOG_RESCALE."""
        strongest = float(-log_gamma.detach().min())  # -log of the smallest gamma, >= 0
        if strongest <= 0.0:
            return max(T, 1)
        return int(min(max(T, 1), max(1, math.floor(MAX_LOG_RESCALE / strongest) + 1)))

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        B, T, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = feature_map(self._split_heads(self.q_proj(x)))  # (B, H, T, d)
        k = feature_map(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        log_gamma = F.logsigmoid(self.gamma_logit).to(x.dtype)  # log gamma_h, (H,)
        C = self._chunk_length(log_gamma, T)
        S = torch.zeros(B, H, d, d, dtype=x.dtype, device=x.device)  # state before the chunk
        z = torch.zeros(B, H, d, dtype=x.dtype, device=x.device)
        outs = []
        for start in range(0, T, C):
            qc, kc, vc = q[:, :, start:start + C], k[:, :, start:start + C], v[:, :, start:start + C]
            n = qc.shape[2]
            r = torch.arange(n, device=x.device, dtype=x.dtype)
            down = torch.exp(log_gamma[:, None] * r)[None, :, :, None]         # gamma^r, (1, H, n, 1)
            up = torch.exp(-log_gamma[:, None] * r)[None, :, :, None]          # gamma^-r
            k_up = kc * up
            kv_cum = torch.cumsum(k_up[..., :, None] * vc[..., None, :], dim=2)  # (B, H, n, d, d)
            k_cum = torch.cumsum(k_up, dim=2)                                    # (B, H, n, d)
            carry = down * torch.exp(log_gamma)[None, :, None, None]             # gamma^(r+1)
            S_t = down[..., None] * kv_cum + carry[..., None] * S[:, :, None]   # state after token r
            z_t = down * k_cum + carry * z[:, :, None]
            num = (qc[..., :, None] * S_t).sum(dim=-2)                           # (B, H, n, d)
            den = (qc * z_t).sum(dim=-1, keepdim=True)
            outs.append(num / (den + EPS))
            S, z = S_t[:, :, -1], z_t[:, :, -1]
        out = torch.cat(outs, dim=2) if outs else q.new_zeros(B, H, 0, d)
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
        out = (q[..., :, None] * S).sum(dim=-2) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
