# Mutant (one bug): step is a KV cache kept in CLASS attributes: LinearAttention._keys and
# LinearAttention._values collect every phi(k_t) and v_t (rebound to fresh lists when state is
# None), and each call recomputes the decayed, normalized output from the whole history. It
# returns an (S, z) of the right shapes and values computed from that history, but ignores the
# state passed in: resuming from a state in a fresh process (empty class lists), or stepping two
# layers or sequences interleaved (one shared history), goes wrong. Nothing is stored on the
# instance or in module globals. forward is correct.
class LinearAttention(Module):

    _keys = []    # phi(k_t) of every step so far, shared by every layer of the class
    _values = []  # v_t of every step so far

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        B = x_t.shape[0]
        H, d = self.num_heads, self.head_dim
        if state is None:
            LinearAttention._keys = []  # new sequence: forget the old history
            LinearAttention._values = []
        q = feature_map(self.q_proj(x_t).view(B, H, d))
        LinearAttention._keys.append(feature_map(self.k_proj(x_t).view(B, H, d)))
        LinearAttention._values.append(self.v_proj(x_t).view(B, H, d))
        K = torch.stack(LinearAttention._keys, dim=2)    # (B, H, t+1, d)
        V = torch.stack(LinearAttention._values, dim=2)  # (B, H, t+1, d)
        t = K.shape[2] - 1
        lag = torch.arange(t, -1, -1, device=x_t.device)  # t - i for i = 0..t
        decay = self.decay.to(x_t.dtype)[:, None] ** lag  # (H, t+1)
        weighted_keys = K * decay[None, :, :, None]
        S = weighted_keys.transpose(-1, -2) @ V  # sum_i gamma^(t-i) phi(k_i) v_i^T
        z = weighted_keys.sum(dim=2)             # sum_i gamma^(t-i) phi(k_i)
        scores = (K @ q[..., None])[..., 0] * decay  # (B, H, t+1)
        out = (scores[..., None] * V).sum(dim=2) / (scores.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
