class LinearAttention(Module):
    def step(self, token, state=None):
        nb = token.shape[0]
        nh, dh = self.num_heads, self.head_dim
        if state is None:
            state = self.init_state(nb, device=token.device)
        mem, nrm = state
        qv = feature_map(self.q_proj(token).view(nb, nh, dh))
        kv = feature_map(self.k_proj(token).view(nb, nh, dh))
        vv = self.v_proj(token).view(nb, nh, dh)
        g = self.decay.to(token.dtype)
        mems, nrms, ys = [], [], []
        for head in range(nh):
            mem_h = kv[:, head, :, None] * vv[:, head, None, :] + g[head] * mem[:, head]
            nrm_h = kv[:, head] + g[head] * nrm[:, head]
            top = (qv[:, head, :, None] * mem_h).sum(dim=1)
            bottom = (qv[:, head] * nrm_h).sum(dim=-1, keepdim=True)
            mems.append(mem_h)
            nrms.append(nrm_h)
            ys.append(top / (bottom + EPS))
        return self.out_proj(torch.cat(ys, dim=-1)), (torch.stack(mems, dim=1), torch.stack(nrms, dim=1))

    def forward(self, inp):
        nb, L, _ = inp.shape
        qv = feature_map(self._split_heads(self.q_proj(inp)))
        kv = feature_map(self._split_heads(self.k_proj(inp)))
        vv = self._split_heads(self.v_proj(inp))
        g = self.decay.to(inp.dtype)
        ys = []
        for pos in range(L):
            top = torch.zeros_like(vv[:, :, 0])
            bottom = torch.zeros_like(vv[:, :, 0, :1])
            for j in range(pos + 1):
                sim = (q_row := qv[:, :, pos] * kv[:, :, j]).sum(dim=-1)
                wt = sim * g ** (pos - j)
                top = top + wt[..., None] * vv[:, :, j]
                bottom = bottom + wt[..., None]
            ys.append(top / (bottom + EPS))
        return self.out_proj(self._merge_heads(torch.stack(ys, dim=2)))
