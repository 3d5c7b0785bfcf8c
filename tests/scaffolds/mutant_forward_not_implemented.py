# Mutant (unfinished): forward still raises the template's NotImplementedError; step is
# correct. Every item that needs forward scores 0, for that one reason.
class LinearAttention(Module):

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        raise NotImplementedError("implement the parallel form with an explicit decayed T x T mask")
