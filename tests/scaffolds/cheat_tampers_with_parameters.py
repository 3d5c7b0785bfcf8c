# Cheat: a correct einsum implementation whose forward zeroes its own out_proj weights in place,
# so parameters it reports after the run no longer match the model that was built.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        self.out_proj.weight.data.zero_()  # tampers with its own parameters
        B, T, D = x.shape
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x)).view(B, T, H, d)
        k = feature_map(self.k_proj(x)).view(B, T, H, d)
        v = self.v_proj(x).view(B, T, H, d)
        t = torch.arange(T, device=x.device)
        lag = (t[:, None] - t[None, :]).to(x.dtype)                 # (T, T): t - i
        causal = torch.ones(T, T, dtype=x.dtype, device=x.device).tril()
        log_gamma = torch.log(self.decay.to(x.dtype))                # (H,)
        decay = torch.exp(torch.einsum("h,ts->hts", log_gamma, lag.clamp(min=0))) * causal
        scores = torch.einsum("bthd,bshd->bhts", q, k) * decay      # (B, H, T, T)
        num = torch.einsum("bhts,bshd->bthd", scores, v)
        den = torch.einsum("bhts->bth", scores)[..., None]
        return self.out_proj((num / (den + EPS)).reshape(B, T, D))

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        H, d = self.num_heads, self.head_dim
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        q = feature_map(self.q_proj(x_t)).view(B, H, d)
        k = feature_map(self.k_proj(x_t)).view(B, H, d)
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype)
        S = torch.einsum("h,bhde->bhde", gamma, S) + torch.einsum("bhd,bhe->bhde", k, v)
        z = torch.einsum("h,bhd->bhd", gamma, z) + k
        num = torch.einsum("bhd,bhde->bhe", q, S)
        den = torch.einsum("bhd,bhd->bh", q, z)[..., None]
        return self.out_proj((num / (den + EPS)).reshape(B, self.embedding_dim)), (S, z)
