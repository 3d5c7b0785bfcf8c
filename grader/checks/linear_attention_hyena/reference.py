"""Trusted references, in NumPy float64, written from the chapter's definitions.

Nothing here comes from the master notebook's solution code: each function is the formula
the notebook states, computed the plainest way (explicit products of gates, double loops for
the convolution), so that it is independent of every way a student may write it.
"""
from __future__ import annotations

import numpy as np


def phi(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1: x + 1 for x > 0, exp(x) otherwise."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, normalize: bool) -> np.ndarray:
    """y_t = sum_{j <= t} (phi(q_t) . phi(k_j)) v_j, divided by sum_{j <= t} phi(q_t) . phi(k_j)
    when normalized."""
    scores = np.tril(phi(q) @ phi(k).T)
    y = scores @ v
    return y / scores.sum(axis=1, keepdims=True) if normalize else y


# The window of gates that multiplies the write of token j in the output at t >= j:
# gate_{j + a} ... gate_{t + b}. The chapter's recurrence (gate, then write) is (1, 0).
WINDOWS = {
    "reference": (1, 0),
    "gate_after_write": (0, 0),     # S_t = diag(gate_t) (S_{t-1} + phi(k_t) v_t^T)
    "window_shifted": (0, -1),      # gate_j ... gate_{t-1}: an exclusive cumulative log-gate
}
WINDOW_WORDS = {
    "reference": "gate_{j+1} ... gate_t",
    "gate_after_write": "gate_j ... gate_t (the gate applied after the write, so each token is decayed "
                        "at its own step; the gate must scale S before token t is written)",
    "window_shifted": "gate_j ... gate_{t-1} (a window of gates shifted by one, as an exclusive cumulative "
                      "log-gate gives; g_t must include log gate_t)",
}


def gate_products(gate: np.ndarray, window: tuple[int, int] = WINDOWS["reference"]) -> np.ndarray:
    """W[t, j, c] = gate_{j+a, c} ... gate_{t+b, c} for j <= t (an empty product is 1), 0 above
    the diagonal; gate (L,) is one feature, (L, d_k) one gate per feature."""
    gates = gate.reshape(gate.shape[0], -1)
    L, features = gates.shape
    a, b = window
    products = np.zeros((L, L, features))
    for t in range(L):
        for j in range(t + 1):
            products[t, j] = np.prod(gates[max(j + a, 0): t + b + 1], axis=0)
    return products


def gated_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, gate: np.ndarray,
                    window: tuple[int, int] = WINDOWS["reference"]) -> np.ndarray:
    """The unnormalized gated readout y_t = sum_{j <= t} sum_c phi(q_t)_c W[t, j, c] phi(k_j)_c v_j."""
    scores = np.einsum("tc,tjc,jc->tj", phi(q), gate_products(gate, window), phi(k))
    return scores @ v


def retnet_mask(length: int, gamma: float) -> np.ndarray:
    """gamma^(t - j) for j <= t, 0 above the diagonal."""
    return np.array([[gamma ** (t - j) if j <= t else 0.0 for j in range(length)] for t in range(length)]).reshape(
        length, length)


def gla_mask(gate: np.ndarray) -> np.ndarray:
    """gate_{j+1} ... gate_t for j <= t (1 on the diagonal), 0 above."""
    return gate_products(gate)[:, :, 0]


def causal_convolution(u: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y[b, n, c] = sum_{m <= n} k[n - m, c] u[b, m, c]: the sum over m written out for each n."""
    L = u.shape[1]
    y = np.zeros_like(u)
    for n in range(L):
        y[:, n] = np.einsum("mc,bmc->bc", k[n::-1], u[:, : n + 1])   # k[n - m] for m = 0 .. n
    return y


def cyclic_convolution(u: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y[b, n, c] = sum_{m < L} k[(n - m) mod L, c] u[b, m, c]."""
    L = u.shape[1]
    n = np.arange(L)
    wrapped = k[(n[:, None] - n[None, :]) % L]          # (n, m, c)
    return np.einsum("nmc,bmc->bnc", wrapped, u)


def linear_recall_error(keys: np.ndarray, values: np.ndarray) -> float:
    """(1/K) sum_j ||S^T k_j - v_j|| with S = sum_i k_i v_i^T (no feature map)."""
    recalled = keys @ (keys.T @ values)
    return float(np.linalg.norm(recalled - values, axis=1).mean())


def softmax_recall_error(keys: np.ndarray, values: np.ndarray, beta: float) -> float:
    """(1/K) sum_j ||sum_i softmax_i(beta k_j . k_i) v_i - v_j||, softmax over the stored keys i."""
    scores = beta * keys @ keys.T
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return float(np.linalg.norm(weights @ values - values, axis=1).mean())
