# Mutant (one bug): step is a disguised KV cache. It appends every phi(k_t) and v_t to lists
# on self (reset when state is None) and recomputes the decayed, normalized output from the
# whole history at every call, so memory and work per step grow with T. It returns an
# (S, z) pair of the right shapes, dtype and (recomputed) values, but ignores the state
# passed in: resuming from a saved state, or interleaving two sequences, goes wrong, and the
# module's memory grows. Outputs of one fresh sequence stepped from state=None are correct.
# forward is correct.
class LinearAttention(Module):

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        H, d = self.num_heads, self.head_dim
        if state is None or not hasattr(self, "_keys"):
            self._keys, self._values = [], []  # new sequence: forget the old history
        q = feature_map(self.q_proj(x_t).view(B, H, d))
        self._keys.append(feature_map(self.k_proj(x_t).view(B, H, d)))
        self._values.append(self.v_proj(x_t).view(B, H, d))
        keys = torch.stack(self._keys, dim=2)      # (B, H, t+1, d)
        values = torch.stack(self._values, dim=2)  # (B, H, t+1, d)
        t = keys.shape[2] - 1
        lag = torch.arange(t, -1, -1, device=x_t.device)  # t - i for i = 0..t
        decay = self.decay.to(x_t.dtype)[:, None] ** lag  # (H, t+1)
        weighted_keys = keys * decay[None, :, :, None]
        S = weighted_keys.transpose(-1, -2) @ values  # sum_i gamma^(t-i) phi(k_i) v_i^T
        z = weighted_keys.sum(dim=2)                  # sum_i gamma^(t-i) phi(k_i)
        scores = (keys @ q[..., None])[..., 0] * decay  # (B, H, t+1)
        out = (scores[..., None] * values).sum(dim=2) / (scores.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
