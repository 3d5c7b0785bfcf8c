# Mutant (one bug): step decays S twice per token (gamma applied, then applied again), z once.
# forward is correct. The state step returns and its outputs are wrong wherever gamma < 1.
class LinearAttention(Module):

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        S, z = self.init_state(B, device=x_t.device) if state is None else state
        H, d = self.num_heads, self.head_dim
        q = feature_map(self.q_proj(x_t).view(B, H, d))
        k = feature_map(self.k_proj(x_t).view(B, H, d))
        v = self.v_proj(x_t).view(B, H, d)
        gamma = self.decay.to(x_t.dtype).view(1, H, 1)
        S = gamma[..., None] * S
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
