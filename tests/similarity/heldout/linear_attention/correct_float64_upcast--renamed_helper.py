class LinearAttention(Module):

    def proj_double(self, lin, inp):
        # do the projection in double precision
        return inp.double() @ lin.weight.double().T + lin.bias.double()

    def step(self, xt, state=None):
        bsz = xt.shape[0]
        St, zt = self.init_state(bsz, device=xt.device) if state is None else state
        St, zt = St.double(), zt.double()
        nh, hd = self.num_heads, self.head_dim
        qt = feature_map(self.proj_double(self.q_proj, xt).view(bsz, nh, hd))
        kt = feature_map(self.proj_double(self.k_proj, xt).view(bsz, nh, hd))
        vt = self.proj_double(self.v_proj, xt).view(bsz, nh, hd)
        g = self.decay.double().view(1, nh, 1)
        St = g[..., None] * St + kt[..., :, None] * vt[..., None, :]
        zt = g * zt + kt
        o = torch.einsum("bhd,bhde->bhe", qt, St) / ((qt * zt).sum(dim=-1, keepdim=True) + EPS)
        yt = self.proj_double(self.out_proj, o.reshape(bsz, self.embedding_dim))
        return yt.to(xt.dtype), (St.to(xt.dtype), zt.to(xt.dtype))

    def forward(self, inp):
        L = inp.shape[1]
        qs = feature_map(self._split_heads(self.proj_double(self.q_proj, inp)))
        ks = feature_map(self._split_heads(self.proj_double(self.k_proj, inp)))
        vs = self._split_heads(self.proj_double(self.v_proj, inp))
        ar = torch.arange(L, device=inp.device)
        dist = ar[:, None] - ar[None, :]
        g = self.decay.double().view(1, self.num_heads, 1, 1)
        m = torch.where(dist >= 0, g ** dist.clamp(min=0), torch.zeros((), dtype=torch.float64))
        att = (qs @ ks.transpose(-1, -2)) * m
        o = (att @ vs) / (att.sum(dim=-1, keepdim=True) + EPS)
        return self.proj_double(self.out_proj, self._merge_heads(o)).to(inp.dtype)
