# Mutant (unfinished): step still raises the template's NotImplementedError; forward is
# correct. Every item that needs step scores 0, for that one reason.
class LinearAttention(Module):

    def step(self, x_t, state=None):
        """Recurrent form. x_t: (B, D); state: (S, z) or None for a fresh sequence.

        Decay S and z by gamma_h, add phi(k_t) v_t^T and phi(k_t), then read out
        phi(q_t).S_t / (phi(q_t).z_t + EPS). Returns (y_t of shape (B, D), (S, z)).
        """
        raise NotImplementedError("implement one recurrent step carrying the fixed-size (S, z) state")
