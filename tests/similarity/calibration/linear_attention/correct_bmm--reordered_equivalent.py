class LinearAttention(Module):

    def step(self, x_t, state=None):
        B, D = x_t.shape
        if state is None:
            S, z = self.init_state(B, device=x_t.device)
        else:
            S, z = state
        H, d = self.num_heads, self.head_dim
        v = self.v_proj(x_t).reshape(B * H, 1, d)
        k = feature_map(self.k_proj(x_t)).reshape(B * H, 1, d)
        q = feature_map(self.q_proj(x_t)).reshape(B * H, 1, d)
        gamma = self.decay.to(x_t.dtype).repeat(B).view(B * H, 1, 1)
        z = k + gamma * z.reshape(B * H, 1, d)
        S = torch.bmm(k.transpose(1, 2), v) + gamma * S.reshape(B * H, d, d)
        den = torch.bmm(q, z.transpose(1, 2))
        num = torch.bmm(q, S)
        out = (num / (EPS + den)).view(B, D)
        return self.out_proj(out), (S.view(B, H, d, d), z.view(B, H, d))

    def forward(self, x):
        B, T, D = x.shape
        H, d = self.num_heads, self.head_dim

        def flat(y):
            return y.view(B, T, H, d).permute(0, 2, 1, 3).reshape(B * H, T, d)

        v = flat(self.v_proj(x))
        k = flat(feature_map(self.k_proj(x)))
        q = flat(feature_map(self.q_proj(x)))
        pos = torch.arange(T, device=x.device)
        lag = pos[:, None] - pos[None, :]
        gamma = self.decay.to(x.dtype).view(H, 1, 1)
        mask = torch.where(0 <= lag, gamma.pow(lag.clamp(min=0)), torch.zeros((), dtype=x.dtype))
        mask = mask.repeat(B, 1, 1)
        w = mask * torch.bmm(q, k.transpose(1, 2))
        out = torch.bmm(w, v) / (EPS + w.sum(dim=-1, keepdim=True))
        out = out.view(B, H, T, d).permute(0, 2, 1, 3).reshape(B, T, D)
        return self.out_proj(out)
