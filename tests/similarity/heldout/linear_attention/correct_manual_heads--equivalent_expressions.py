class LinearAttention(Module):

    def forward(self, x):
        B, T, D = x.shape
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x)).view(B, T, H, d).transpose(1, 2)
        k = feature_map(self.k_proj(x)).view(B, T, H, d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, d).transpose(1, 2)
        idx = torch.arange(T, device=x.device)
        lag = torch.clamp(idx[:, None] - idx[None, :], min=0)
        gamma = self.decay.to(x.dtype)[:, None, None]
        mask = (idx[None, :] <= idx[:, None]) * torch.pow(gamma, lag)
        w = mask * torch.matmul(q, k.transpose(-2, -1))
        out = torch.matmul(w, v) / (EPS + torch.sum(w, dim=-1, keepdim=True))
        out = out.transpose(1, 2).contiguous().view(B, T, D)
        return self.out_proj(out)

    def step(self, x_t, state=None):
        B, D = x_t.shape
        H, d = self.num_heads, self.head_dim
        S, z = state if state is not None else self.init_state(B, device=x_t.device)
        q = feature_map(self.q_proj(x_t)).view(B, H, d)
        k = feature_map(self.k_proj(x_t)).view(B, H, d)
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype)[None, :, None]
        S = S * gamma[..., None]
        S += k[..., :, None] * v[..., None, :]
        z = z * gamma
        z += k
        out = torch.sum(q[..., :, None] * S, dim=-2) / (EPS + torch.sum(q * z, dim=-1, keepdim=True))
        return self.out_proj(out.contiguous().view(B, D)), (S, z)
