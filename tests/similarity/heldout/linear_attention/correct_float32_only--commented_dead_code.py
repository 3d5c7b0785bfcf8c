class LinearAttention(Module):

    def forward(self, x):
        # ---------------------------------------------------------------
        # parallel form. everything in float32 (my laptop has no float64 GPU)
        # ---------------------------------------------------------------
        B, T, _ = x.shape
        q = feature_map(self._split_heads(self.q_proj(x))).float()   # queries
        k = feature_map(self._split_heads(self.k_proj(x))).float()   # keys
        v = self._split_heads(self.v_proj(x)).float()                # values
        positions = torch.arange(T, device=x.device)
        lag = (positions[:, None] - positions[None, :]).float()      # t - i
        check = lag.shape == (T, T)
        gamma = self.decay.float().view(1, self.num_heads, 1, 1)
        causal = torch.tril(torch.ones(T, T, dtype=torch.float32, device=x.device))
        mask = gamma ** lag.clamp(min=0) * causal                   # decayed causal mask
        weights = (q @ k.transpose(-1, -2)) * mask
        # normalize every row
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out).to(x.dtype))

    def _unused_softmax_version(self, x):
        # first attempt, before I read the notes: plain softmax attention
        q, k = self.q_proj(x), self.k_proj(x)
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1)

    def step(self, x_t, state=None):
        # recurrent form: S and z carry the whole history
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
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]   # decay, then write
        z = gamma * z + k
        if False:
            print("S norm", S.norm())
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim).to(x_t.dtype)), (S, z)
