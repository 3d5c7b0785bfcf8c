"""Linear attention with one learned decay per head: the parallel form for training, the
recurrent form, carrying a fixed-size (S, z) state, for inference."""
from __future__ import annotations

import torch

from g2c.linear_attention.feature_map import EPS, feature_map
from g2c.nn import Linear, Module


class LinearAttention(Module):
    """Multi-head linear attention with one learned decay per head.

    Parallel form (training): out_t = sum_{i<=t} gamma^(t-i) phi(q_t).phi(k_i) v_i, divided by
    sum_{i<=t} gamma^(t-i) phi(q_t).phi(k_i) + EPS, for each head separately.
    Recurrent form (inference): S_t = gamma S_{t-1} + phi(k_t) v_t^T, z_t = gamma z_{t-1} + phi(k_t),
    out_t = phi(q_t).S_t / (phi(q_t).z_t + EPS). Both forms must give the same numbers.
    """

    def __init__(self, embedding_dim: int, num_heads: int):
        if embedding_dim % num_heads != 0:
            raise ValueError(f"embedding_dim {embedding_dim} is not divisible by num_heads {num_heads}")
        self.embedding_dim = embedding_dim
        self.num_heads = num_heads
        self.head_dim = embedding_dim // num_heads
        self.q_proj = Linear(embedding_dim, embedding_dim)
        self.k_proj = Linear(embedding_dim, embedding_dim)
        self.v_proj = Linear(embedding_dim, embedding_dim)
        self.out_proj = Linear(embedding_dim, embedding_dim)
        # sigmoid(4.6) ~ 0.99: each head starts out forgetting about 1% of its state per token.
        self.gamma_logit = torch.full((num_heads,), 4.6, requires_grad=True)

    @property
    def decay(self):
        """Per-head decay gamma_h = sigmoid(gamma_logit_h), shape (H,), in (0, 1)."""
        return torch.sigmoid(self.gamma_logit)

    def init_state(self, batch_size: int, device=None):
        """Zero recurrent state: S (B, H, d_h, d_h) and z (B, H, d_h)."""
        dtype = self.q_proj.weight.dtype
        H, d = self.num_heads, self.head_dim
        S = torch.zeros(batch_size, H, d, d, device=device, dtype=dtype)
        z = torch.zeros(batch_size, H, d, device=device, dtype=dtype)
        return S, z

    def _split_heads(self, x):
        """(B, T, D) -> (B, H, T, d_h)."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge_heads(self, x):
        """(B, H, T, d_h) -> (B, T, D)."""
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.embedding_dim)

    def forward(self, x):
        """Parallel reference. x: (B, T, D) -> (B, T, D).

        Build phi(q), phi(k) and v per head, the (T, T) score matrix phi(q) phi(k)^T, and a
        decay mask holding gamma_h^(t-i) where i <= t and 0 above the diagonal. A token
        attends to itself (i = t has weight gamma^0 = 1). Normalize each row by its sum + EPS.
        """
        T = x.shape[1]
        q = feature_map(self._split_heads(self.q_proj(x)))
        k = feature_map(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        positions = torch.arange(T, device=x.device)
        lag = positions[:, None] - positions[None, :]  # t - i
        gamma = self.decay.to(x.dtype).view(1, self.num_heads, 1, 1)
        mask = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
        weights = (q @ k.transpose(-1, -2)) * mask  # (B, H, T, T)
        out = (weights @ v) / (weights.sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(self._merge_heads(out))

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
        S = gamma[..., None] * S + k[..., :, None] * v[..., None, :]
        z = gamma * z + k
        out = torch.einsum("bhd,bhde->bhe", q, S) / ((q * z).sum(dim=-1, keepdim=True) + EPS)
        return self.out_proj(out.reshape(B, self.embedding_dim)), (S, z)
