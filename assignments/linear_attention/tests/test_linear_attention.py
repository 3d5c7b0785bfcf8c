"""Public tests for the linear attention notebook.

Run from the assignment folder:

    pytest tests/                 all tests
    pytest tests/ -x              stop at the first failure
    pytest tests/ -k equiv        parallel (forward) vs recurrent (step) equivalence
    pytest tests/ -k causal       causality

``la`` (see conftest.py) is the notebook's provided and scaffold code as a module. Before you
write ``forward`` and ``step``, 8 tests pass (they exercise the provided code) and 7 fail with
your TODO's NotImplementedError. Precision-sensitive checks run in float64, so a correct
implementation agrees to about 1e-10 and any real bug shows up as a large error. Code that
cannot run in float64 (``x = x.float()``, say) or is only float32-accurate is checked again in
float32 at 1e-4, passes there with a warning, and is graded the same way. ``+ EPS``, no EPS and
``clamp(min=EPS)`` in the denominator are all accepted.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

TOL = 1e-10    # float64 agreement expected between two correct forms of the same computation
TOL32 = 1e-4   # the same in float32, for code that only computes in float32

# Small shapes: every test runs in well under a second on a laptop CPU.
B, T, D, H = 2, 24, 12, 3
VOCAB, MAX_LEN = 40, 32


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def make_layer(la, embedding_dim=D, num_heads=H, logits=None, dtype=torch.float64):
    """A LinearAttention in ``dtype``; ``logits`` (one per head) overrides gamma_logit."""
    layer = la.LinearAttention(embedding_dim, num_heads).to(dtype=dtype)
    if logits is not None:
        layer.gamma_logit = torch.tensor(logits, dtype=dtype, requires_grad=True)
    return layer


def in_float64_or_float32(check):
    """Run ``check(dtype, tol)`` in float64; if that fails, the float32 run at TOL32 counts
    instead (with a warning), as in the grader. The failure shown is the float64 one, or the
    float32 one when your code could not run in float64 at all."""
    torch.manual_seed(1234)
    try:
        check(torch.float64, TOL)
        return
    except Exception as exc:  # noqa: BLE001 - an assertion, or code that cannot run in float64
        in_float64 = exc
    torch.manual_seed(1234)
    try:
        check(torch.float32, TOL32)
    except AssertionError as in_float32:
        raise (in_float64 if isinstance(in_float64, AssertionError) else in_float32) from None
    except Exception:  # noqa: BLE001 - fails in float32 too: the float64 error says why
        raise in_float64 from None
    warnings.warn(f"passed only in float32 at {TOL32:g}; in float64: {str(in_float64).splitlines()[0]}. "
                  "Use the input's dtype instead of a fixed one.")


def run_steps(layer, x):
    """Feed x (B, T, D) through step() one position at a time; returns (B, T, D)."""
    state = layer.init_state(x.shape[0])
    outputs = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        outputs.append(y)
    return torch.stack(outputs, dim=1)


def assert_close(actual, expected, tol, what, names=("got", "expected")):
    """Assert max|actual - expected| <= tol for (B, T, C) tensors, with a readable report.

    The message gives the shapes, the max-abs error, the (batch, position, channel) of the
    worst mismatch, and the first position t where any entry exceeds the tolerance. ``names``
    says what the two are where neither is a trusted value ("step loop", "forward").
    """
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} does not match the expected {tuple(expected.shape)}")
    actual, expected = actual.detach(), expected.detach().to(actual.dtype)
    bad_values = ~torch.isfinite(actual)
    if bad_values.any():
        b, t, c = (int(i) for i in bad_values.nonzero()[0])
        raise AssertionError(f"{what}: non-finite output {actual[b, t, c].item()} "
                             f"at (batch {b}, position {t}, channel {c})")
    error = (actual - expected).abs()
    worst = float(error.max())
    if worst <= tol:
        return
    b, t, c = (int(i) for i in torch.unravel_index(error.argmax(), error.shape))
    first = int((error > tol).any(dim=0).any(dim=-1).nonzero()[0])
    raise AssertionError(
        f"{what}: max-abs error {worst:.3e} > tolerance {tol:.0e}\n"
        f"  worst mismatch at (batch {b}, position {t}, channel {c}): "
        f"{names[0]} {actual[b, t, c].item():.6g}, {names[1]} {expected[b, t, c].item():.6g}\n"
        f"  first offending position: t = {first} (of {actual.shape[1]}); "
        f"{int((error > tol).sum())} of {error.numel()} entries exceed the tolerance")


def undecayed_reference(la, layer, x, eps):
    """gamma = 1 linear attention written as a plain loop over query t and keys i <= t.

    out_t = sum_i (phi(q_t).phi(k_i)) v_i / (sum_i phi(q_t).phi(k_i) + eps), per head, then
    the output projection. It uses the layer's projections but none of its forward/step code.
    """
    Bx, Tx, Dx = x.shape
    Hx, d = layer.num_heads, layer.head_dim

    def heads(y):  # (B, T, D) -> (B, T, H, d_h)
        return y.reshape(Bx, Tx, Hx, d)

    phi = lambda y: F.elu(y) + 1  # noqa: E731  (independent copy of the feature map)
    q, k, v = phi(heads(layer.q_proj(x))), phi(heads(layer.k_proj(x))), heads(layer.v_proj(x))
    out = torch.zeros(Bx, Tx, Hx, d, dtype=x.dtype)
    for t in range(Tx):
        numerator = torch.zeros(Bx, Hx, d, dtype=x.dtype)
        denominator = torch.zeros(Bx, Hx, 1, dtype=x.dtype)
        for i in range(t + 1):
            score = (q[:, t] * k[:, i]).sum(dim=-1, keepdim=True)  # (B, H, 1)
            numerator = numerator + score * v[:, i]
            denominator = denominator + score
        out[:, t] = numerator / (denominator + eps)
    return layer.out_proj(out.reshape(Bx, Tx, Dx))


# --------------------------------------------------------------------------------------
# Provided code: these pass before you write anything.
# --------------------------------------------------------------------------------------

def test_feature_map_is_positive(la):
    x = torch.linspace(-12.0, 12.0, 2001, dtype=torch.float64)
    phi = la.feature_map(x)
    assert phi.shape == x.shape
    assert bool((phi > 0).all()), f"feature_map is not strictly positive: min {phi.min().item():.3e}"
    assert torch.allclose(phi, F.elu(x) + 1, atol=1e-12), "feature_map(x) should be elu(x) + 1"


def test_construction_shapes_and_head_divisibility(la):
    layer = la.LinearAttention(D, H)
    assert (layer.embedding_dim, layer.num_heads, layer.head_dim) == (D, H, D // H)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        weight = getattr(layer, name).weight
        assert tuple(weight.shape) == (D, D), f"{name}.weight has shape {tuple(weight.shape)}, expected ({D}, {D})"
    assert tuple(layer.gamma_logit.shape) == (H,), f"gamma_logit shape {tuple(layer.gamma_logit.shape)}"
    assert layer.gamma_logit.requires_grad, "gamma_logit must be a trainable parameter"
    assert torch.allclose(layer.gamma_logit.detach(), torch.full((H,), 4.6)), "gamma_logit should start at 4.6"
    with pytest.raises(ValueError):
        la.LinearAttention(10, 3)


def test_decay_is_sigmoid_of_logit(la):
    layer = la.LinearAttention(D, H)
    decay = layer.decay
    assert tuple(decay.shape) == (H,)
    assert bool(((decay > 0) & (decay < 1)).all()), f"decay {decay.tolist()} is not inside (0, 1)"
    assert torch.allclose(decay, torch.full((H,), 0.99), atol=2e-3), f"decay at init {decay.tolist()}, expected ~0.99"
    layer.gamma_logit = torch.tensor([-3.0, 0.0, 2.5], requires_grad=True)
    assert torch.allclose(layer.decay, torch.sigmoid(layer.gamma_logit))


def test_init_state_shapes_and_zeros(la):
    layer = la.LinearAttention(D, H)
    S, z = layer.init_state(B)
    d = D // H
    assert tuple(S.shape) == (B, H, d, d), f"S has shape {tuple(S.shape)}, expected {(B, H, d, d)}"
    assert tuple(z.shape) == (B, H, d), f"z has shape {tuple(z.shape)}, expected {(B, H, d)}"
    assert not S.any() and not z.any(), "the initial state must be all zeros"


def test_lm_rejects_bad_layer_pattern(la):
    with pytest.raises(ValueError):
        la.HybridTransformerLM(VOCAB, D, [], H, MAX_LEN)
    with pytest.raises(ValueError):
        la.HybridTransformerLM(VOCAB, D, ["linear", "sparse", "full"], H, MAX_LEN)


def test_hybrid_block_kinds(la):
    with pytest.raises(ValueError):
        la.HybridBlock(D, H, "softmax")
    assert isinstance(la.HybridBlock(D, H, "full").attn, la.MultiHeadAttention)
    assert isinstance(la.HybridBlock(D, H, "linear").attn, la.LinearAttention)


def test_parameter_counts_differ_only_by_decay_scalars(la):
    def count(pattern):
        return la.HybridTransformerLM(VOCAB, D, pattern, H, MAX_LEN).num_parameters()

    full = count(["full"] * 4)
    linear = count(["linear"] * 4)
    hybrid = count(["linear", "linear", "linear", "full"])
    assert linear - full == 4 * H, f"all-linear minus all-full = {linear - full}, expected {4 * H} (H per linear layer)"
    assert hybrid - full == 3 * H, f"hybrid minus all-full = {hybrid - full}, expected {3 * H} (H per linear layer)"


def test_lm_rejects_input_longer_than_max_seq_len(la):
    model = la.HybridTransformerLM(VOCAB, D, ["linear", "full"], H, MAX_LEN)
    with pytest.raises(ValueError):
        model(torch.randint(0, VOCAB, (1, MAX_LEN + 1)))


# --------------------------------------------------------------------------------------
# Your code: these fail until forward and step are written.
# --------------------------------------------------------------------------------------

def test_forward_output_shape(la):
    layer = la.LinearAttention(D, H)
    x = torch.randn(B, T, D)
    y = layer(x)
    assert tuple(y.shape) == (B, T, D), f"forward returned shape {tuple(y.shape)}, expected {(B, T, D)}"
    assert y.dtype == x.dtype, f"forward returned {y.dtype} for a {x.dtype} input"
    assert bool(torch.isfinite(y).all()), "forward returned non-finite values"


def test_causal_future_inputs_do_not_change_past_outputs(la):
    def check(dtype, tol):
        layer = make_layer(la, logits=[4.6, 1.0, 3.0], dtype=dtype)
        x = torch.randn(B, T, D, dtype=dtype)
        y = layer(x)
        for t in (0, T // 3, T - 2):
            changed = x.clone()
            changed[:, t + 1:] = torch.randn(B, T - t - 1, D, dtype=dtype)
            y_changed = layer(changed)
            assert_close(y_changed[:, : t + 1], y[:, : t + 1], tol,
                         f"outputs at positions <= {t} after changing the inputs after {t}",
                         names=("after the change", "before it"))
            moved = float((y_changed[:, t + 1:] - y[:, t + 1:]).detach().abs().max())
            assert moved > 1e-6, (f"changing the inputs after position {t} did not change any later output "
                                  f"(max change {moved:.1e}); does the output depend on its own input?")

        # The same property end to end: a hybrid LM whose linear layers run your forward.
        model = la.HybridTransformerLM(VOCAB, D, ["linear", "full", "linear"], H, MAX_LEN).to(dtype=dtype)
        tokens = torch.randint(0, VOCAB, (B, T))
        logits = model(tokens)
        t = T // 2
        changed = tokens.clone()
        changed[:, t + 1:] = (tokens[:, t + 1:] + 1) % VOCAB
        assert_close(model(changed)[:, : t + 1], logits[:, : t + 1], tol,
                     f"hybrid LM logits at positions <= {t} after changing the tokens after {t}",
                     names=("after the change", "before it"))
    in_float64_or_float32(check)


def test_forward_matches_undecayed_reference_at_gamma_one(la):
    def check(dtype, tol):
        layer = make_layer(la, logits=[50.0] * H, dtype=dtype)  # sigmoid(50) == 1.0 exactly
        assert bool((layer.decay == 1.0).all())
        x = torch.randn(B, 16, D, dtype=dtype)
        y = layer(x)
        what = ("forward at gamma = 1 vs the normalized reference loop "
                "(a missing or misplaced normalizer z, or a self-excluding mask, fails here)")
        try:  # with + EPS in the denominator ...
            assert_close(y, undecayed_reference(la, layer, x, la.EPS), tol, what)
        except AssertionError:  # ... or without it (also what clamp(min=EPS) gives here)
            assert_close(y, undecayed_reference(la, layer, x, 0.0), tol, what)
    in_float64_or_float32(check)


def test_step_keeps_fixed_size_state(la):
    def check(dtype, tol):
        layer = make_layer(la, dtype=dtype)
        d = D // H
        x = torch.randn(B, 40, D, dtype=dtype)
        y, state = layer.step(x[:, 0], None)  # None starts a fresh sequence
        assert tuple(y.shape) == (B, D), f"step returned y of shape {tuple(y.shape)}, expected {(B, D)}"
        y_init, _ = layer.step(x[:, 0], layer.init_state(B))
        assert_close(y[:, None], y_init[:, None], tol, "step(x, None) vs step(x, init_state(B))",
                     names=("step(x, None)", "step(x, init_state(B))"))
        for t in range(1, x.shape[1]):
            y, state = layer.step(x[:, t], state)
            S, z = state
            assert tuple(y.shape) == (B, D), f"step {t}: y has shape {tuple(y.shape)}, expected {(B, D)}"
            assert tuple(S.shape) == (B, H, d, d), f"step {t}: S grew to {tuple(S.shape)}; it must stay {(B, H, d, d)}"
            assert tuple(z.shape) == (B, H, d), f"step {t}: z grew to {tuple(z.shape)}; it must stay {(B, H, d)}"
        assert bool(torch.isfinite(y).all()), "step returned non-finite values"
        assert S.abs().sum() > 0 and z.abs().sum() > 0, "the state stayed zero: step never writes phi(k) v^T / phi(k)"
    in_float64_or_float32(check)


def agrees(actual, expected, tol):
    return actual.shape == expected.shape and bool(((actual - expected).abs() <= tol).all())


def decay_diagnosis(layer, x, tol):
    """Which form leaves the decay out, when one does: its output equals the other form's with
    gamma = 1 (the same weights, every decay logit at 50). The grader's words for the same bug."""
    undecayed = copy.deepcopy(layer)
    undecayed.gamma_logit = torch.full_like(layer.gamma_logit, 50.0)  # sigmoid(50) == 1.0 exactly
    with torch.no_grad():
        if agrees(run_steps(layer, x), undecayed(x), tol):
            return "step ignores gamma: decay S and z by gamma before adding the new token"
        if agrees(layer(x), run_steps(undecayed, x), tol):
            return "forward ignores gamma: weight position i by gamma^(t-i)"
    return None


class TestEquivalence:
    """forward (all positions at once) and step (one token at a time) are one computation."""

    def check(self, la, logits):
        def check(dtype, tol):
            layer = make_layer(la, logits=logits, dtype=dtype)
            x = torch.randn(B, T, D, dtype=dtype)
            what = f"step loop vs forward, decay {[round(g, 4) for g in layer.decay.tolist()]}"
            try:
                assert_close(run_steps(layer, x), layer(x), tol, what, names=("step loop", "forward"))
            except AssertionError as failure:
                diagnosis = decay_diagnosis(layer, x, tol)
                if diagnosis is None:
                    raise
                raise AssertionError(f"{diagnosis}\n{failure}") from None
        in_float64_or_float32(check)

    def test_parallel_matches_recurrent_mild_decay(self, la):
        self.check(la, [4.6, 3.5, 5.5])  # gamma ~ 0.990, 0.971, 0.996

    def test_parallel_matches_recurrent_strong_decay(self, la):
        self.check(la, [0.0, -1.0, 1.5])  # gamma = 0.5, ~0.269, ~0.818


def test_hybrid_lm_forward_and_backward(la):
    model = la.HybridTransformerLM(VOCAB, D, ["linear", "linear", "linear", "full"], H, MAX_LEN)
    tokens = torch.randint(0, VOCAB, (B, 20))
    logits = model(tokens)
    assert tuple(logits.shape) == (B, 20, VOCAB), f"logits shape {tuple(logits.shape)}, expected {(B, 20, VOCAB)}"
    assert bool(torch.isfinite(logits).all()), "the hybrid LM produced non-finite logits"
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, (f"{name} received no gradient" + (
            ": forward must use the learned decay self.decay (without detaching it)"
            if name.endswith("gamma_logit") else ""))
        assert bool(torch.isfinite(p.grad).all()), f"non-finite gradient in {name}"
        if name.endswith("gamma_logit"):
            assert p.grad.abs().sum() > 0, f"{name} received an all-zero gradient: is the decay applied?"
