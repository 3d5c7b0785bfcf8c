# My linear attention. I worked this out from the lecture slides.
class LinearAttention(Module):

    def forward(self, inp):
        """Parallel form: decayed causal mask over the (T, T) scores."""
        seq_len = inp.shape[1]
        # project and apply the feature map per head
        query = feature_map(self._split_heads(self.q_proj(inp)))
        key = feature_map(self._split_heads(self.k_proj(inp)))
        val = self._split_heads(self.v_proj(inp))
        idx = torch.arange(seq_len, device=inp.device)
        dist = idx[:, None] - idx[None, :]  # how far back token i is from t
        g = self.decay.to(inp.dtype).view(1, self.num_heads, 1, 1)
        # zero above the diagonal, g^(t-i) on and below it
        m = torch.where(dist >= 0, g ** dist.clamp(min=0), torch.zeros((), dtype=inp.dtype))
        att = (query @ key.transpose(-1, -2)) * m  # (B, H, T, T)
        result = (att @ val) / (att.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(result))

    def step(self, xt, state=None):
        """One token at a time with the (S, z) state."""
        batch = xt.shape[0]
        mem, norm = self.init_state(batch, device=xt.device) if state is None else state
        nh, hd = self.num_heads, self.head_dim
        query = feature_map(self.q_proj(xt).view(batch, nh, hd))
        key = feature_map(self.k_proj(xt).view(batch, nh, hd))
        val = self.v_proj(xt).view(batch, nh, hd)
        g = self.decay.to(xt.dtype).view(1, nh, 1)
        # decay the memory, then write the outer product k v^T
        mem = g[..., None] * mem + key[..., :, None] * val[..., None, :]
        norm = g * norm + key
        result = torch.einsum("bhd,bhde->bhe", query, mem) / ((query * norm).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(result.reshape(batch, self.embedding_dim)), (mem, norm)
