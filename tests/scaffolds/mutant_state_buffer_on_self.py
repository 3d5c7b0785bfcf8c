# Mutant (one bug): to avoid allocations, step keeps one (S, z) buffer on self, writes the new
# state into it (torch.mul(S, gamma, out=self._S), then add_) and returns the buffer itself:
# every state it returns is that one object, overwritten by the next step (in place when the
# caller hands it back). The buffer keeps one size. forward is correct.
class LinearAttention(Module):

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x_t).view(B, H, d))
        k = feature_map(self.k_proj(x_t).view(B, H, d))
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype).view(1, H, 1)
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        if getattr(self, "_S", None) is None or self._S.shape != S.shape or self._S.dtype != S.dtype:
            self._S, self._z = torch.empty_like(S), torch.empty_like(z)
        torch.mul(S, gamma[..., None], out=self._S)
        self._S.add_(k[..., :, None] * v[..., None, :])
        torch.mul(z, gamma, out=self._z)
        self._z.add_(k)
        out = torch.einsum("bhd,bhde->bhe", q, self._S) / ((q * self._z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (self._S, self._z)
