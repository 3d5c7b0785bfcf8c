"""The reference solutions.

linear_attention: the master notebook's reference LinearAttention, checked at a realistic length
(T = 512). The model code is loaded with the public suite's own notebook loader (imported from
assignments/linear_attention/tests/conftest.py, not duplicated). Three computations must agree
to 1e-12 max-abs in float64: the parallel ``forward``, a loop of ``step`` calls, and an
independent NumPy loop over the recurrence equations written here.

linear_attention_hyena: ``grader validate`` in the real sandbox (as test_grading.py does for
linear_attention): the master earns every autograded point, the student template exactly the
baseline.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grader.assignment import Assignment
from grader.sandbox.factory import make_sandbox
from grader.validate import validate

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_CONFTEST = ROOT / "assignments" / "linear_attention" / "tests" / "conftest.py"
MASTER_NOTEBOOK = ROOT / "solutions" / "linear_attention" / "linear_attention.ipynb"

TOL = 1e-12
B, T, D, H = 2, 512, 16, 4
DECAYS = {
    "gamma_one": [50.0] * H,              # sigmoid(50) == 1.0 exactly in float64: no forgetting
    "gamma_per_head": [4.6, 2.0, 0.0, -1.5],  # ~0.990, ~0.881, 0.5, ~0.182
}


def _import_public_conftest():
    spec = importlib.util.spec_from_file_location("la_public_conftest", PUBLIC_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def la():
    loader = _import_public_conftest()
    return loader.load_notebook(MASTER_NOTEBOOK, module_name="la_master_reference")


def _layer(la, logits):
    torch.manual_seed(7)
    layer = la.LinearAttention(D, H).to(dtype=torch.float64)
    layer.gamma_logit = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    return layer


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64)


def recurrence_loop(layer, x: np.ndarray, eps: float) -> np.ndarray:
    """The recurrence written out per head and per time step, in NumPy.

    S_t = g S_{t-1} + phi(k_t) v_t^T,  z_t = g z_{t-1} + phi(k_t),
    y_t = phi(q_t) S_t / (phi(q_t) . z_t + eps),  phi(u) = u + 1 for u > 0, exp(u) otherwise.
    """
    def project(linear, u):
        return u @ _numpy(linear.weight).T + _numpy(linear.bias)

    def phi(u):
        return np.where(u > 0, u + 1.0, np.exp(np.minimum(u, 0.0)))

    Bx, Tx, Dx = x.shape
    d = Dx // layer.num_heads
    q, k, v = phi(project(layer.q_proj, x)), phi(project(layer.k_proj, x)), project(layer.v_proj, x)
    gammas = 1.0 / (1.0 + np.exp(-_numpy(layer.gamma_logit)))
    out = np.zeros_like(x)
    for h in range(layer.num_heads):
        cols = slice(h * d, (h + 1) * d)
        g = gammas[h]
        S = np.zeros((Bx, d, d))
        z = np.zeros((Bx, d))
        for t in range(Tx):
            qt, kt, vt = q[:, t, cols], k[:, t, cols], v[:, t, cols]
            S = g * S + kt[:, :, None] * vt[:, None, :]
            z = g * z + kt
            out[:, t, cols] = np.einsum("bi,bij->bj", qt, S) / ((qt * z).sum(axis=-1, keepdims=True) + eps)
    return project(layer.out_proj, out)


def _max_abs(a, b) -> tuple[float, tuple]:
    err = np.abs(np.asarray(a) - np.asarray(b))
    return float(err.max()), tuple(int(i) for i in np.unravel_index(err.argmax(), err.shape))


@pytest.mark.parametrize("case", sorted(DECAYS))
def test_forward_step_and_recurrence_agree_at_T512(la, case):
    layer = _layer(la, DECAYS[case])
    if case == "gamma_one":
        assert bool((layer.decay == 1.0).all())
    else:
        assert bool((layer.decay < 1.0).all()) and len(set(layer.decay.tolist())) == H
    torch.manual_seed(11)
    x = torch.randn(B, T, D, dtype=torch.float64)

    with torch.no_grad():
        parallel = layer(x)
        state = layer.init_state(B)
        steps = []
        for t in range(T):
            y, state = layer.step(x[:, t], state)
            steps.append(y)
        recurrent = torch.stack(steps, dim=1)
    expected = recurrence_loop(layer, _numpy(x), la.EPS)

    assert parallel.shape == recurrent.shape == (B, T, D)
    pairs = {"forward vs step loop": (_numpy(parallel), _numpy(recurrent)),
             "forward vs recurrence loop": (_numpy(parallel), expected),
             "step loop vs recurrence loop": (_numpy(recurrent), expected)}
    for label, (got, want) in pairs.items():
        err, where = _max_abs(got, want)
        assert err <= TOL, f"{case}: {label}: max-abs error {err:.3e} at (batch, position, channel) {where}"
    # The outputs are not trivially small: the tolerance is meaningful against their scale.
    assert np.abs(expected).max() > 0.1


def test_hyena_solution_earns_every_point_and_its_template_only_the_baseline():
    """One real sandboxed grading of the master and of the template (about 20 s)."""
    hyena = Assignment("linear_attention_hyena")
    sandbox = make_sandbox(hyena.rubric.limits, allow_unsandboxed=False)
    report = validate(hyena, sandbox, hyena.rubric)
    assert report.ok, report.text
    autograded = [i for i in report.solution.items if "written" not in i.tags]
    assert autograded and all(i.score == i.max_score for i in autograded), report.text
    assert report.template.score == sum(i.points for i in hyena.rubric.items if i.baseline)
