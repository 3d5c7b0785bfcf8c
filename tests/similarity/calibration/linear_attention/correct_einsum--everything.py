class LinearAttention(Module):
    # step first, it is the simpler one
    def step(self, inp_t, state=None):
        n = inp_t.shape[0]
        heads, width = self.num_heads, self.head_dim
        if state is None:
            state = self.init_state(n, device=inp_t.device)
        mem, norm = state
        qq = feature_map(self.q_proj(inp_t)).view(n, heads, width)
        kk = feature_map(self.k_proj(inp_t)).view(n, heads, width)
        vv = self.v_proj(inp_t).view(n, heads, width)
        g = self.decay.to(inp_t.dtype)
        mem = torch.einsum("bhd,bhe->bhde", kk, vv) + torch.einsum("h,bhde->bhde", g, mem)  # write
        norm = kk + torch.einsum("h,bhd->bhd", g, norm)
        top = torch.einsum("bhd,bhde->bhe", qq, mem)
        bottom = torch.einsum("bhd,bhd->bh", qq, norm)[..., None]
        return self.out_proj((top / (bottom + EPS)).reshape(n, self.embedding_dim)), (mem, norm)

    def forward(self, inp):
        n, L, dim = inp.shape
        heads, width = self.num_heads, self.head_dim
        qq = feature_map(self.q_proj(inp)).view(n, L, heads, width)
        kk = feature_map(self.k_proj(inp)).view(n, L, heads, width)
        vv = self.v_proj(inp).view(n, L, heads, width)
        ar = torch.arange(L, device=inp.device)
        dist = (ar[:, None] - ar[None, :]).to(inp.dtype)
        tri = torch.ones(L, L, dtype=inp.dtype, device=inp.device).tril()
        lg = self.decay.to(inp.dtype).log()
        dec = torch.exp(torch.einsum("h,ts->hts", lg, dist.clamp(min=0))) * tri
        sc = torch.einsum("bthd,bshd->bhts", qq, kk) * dec
        top = torch.einsum("bhts,bshd->bthd", sc, vv)
        bottom = torch.einsum("bhts->bth", sc)[..., None]
        return self.out_proj((top / (bottom + EPS)).reshape(n, L, dim))
