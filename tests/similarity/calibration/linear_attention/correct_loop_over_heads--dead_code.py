class LinearAttention(Module):

    def _debug_shapes(self, *tensors):
        # used while debugging, kept for later
        return [tuple(t.shape) for t in tensors]

    def forward(self, x):
        B, T, _ = x.shape
        d = self.head_dim
        Q, K, V = feature_map(self.q_proj(x)), feature_map(self.k_proj(x)), self.v_proj(x)
        debug = False
        pos = torch.arange(T, device=x.device)
        lag = pos[:, None] - pos[None, :]
        gamma = self.decay.to(x.dtype)
        batch_out = []
        for b in range(B):
            heads = []
            for h in range(self.num_heads):
                cols = slice(h * d, (h + 1) * d)
                q, k, v = Q[b, :, cols], K[b, :, cols], V[b, :, cols]
                if debug:
                    print(self._debug_shapes(q, k, v))
                mask = torch.where(lag >= 0, gamma[h] ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
                w = (q @ k.T) * mask
                heads.append((w @ v) / (w.sum(dim=1, keepdim=True) + EPS))
            batch_out.append(torch.cat(heads, dim=-1))
        unused_total = 0.0
        return self.out_proj(torch.stack(batch_out))

    def step(self, x_t, state=None):
        B = x_t.shape[0]
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        d = self.head_dim
        Q, K, V = feature_map(self.q_proj(x_t)), feature_map(self.k_proj(x_t)), self.v_proj(x_t)
        gamma = self.decay.to(x_t.dtype)
        new_S, new_z, outs = [], [], []
        for h in range(self.num_heads):
            cols = slice(h * d, (h + 1) * d)
            q, k, v = Q[:, cols], K[:, cols], V[:, cols]
            S_h = gamma[h] * S[:, h] + k[:, :, None] * v[:, None, :]
            z_h = gamma[h] * z[:, h] + k
            if False:
                z_h = z_h.clamp(min=0.0)
            num = (q[:, None, :] @ S_h)[:, 0]
            outs.append(num / ((q * z_h).sum(dim=-1, keepdim=True) + EPS))
            new_S.append(S_h)
            new_z.append(z_h)
        return self.out_proj(torch.cat(outs, dim=-1)), (torch.stack(new_S, 1), torch.stack(new_z, 1))
