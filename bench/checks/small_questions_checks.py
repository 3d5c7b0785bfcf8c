"""Hidden checks for the bench's small assignment (``bench/rubrics/small_questions.yaml``).

Loaded from the assignment root's ``checks/`` folder (``grader.checks.checks_for``), not from
the grader package. Each function is called by the harness's own ``call`` handler on the
inputs otter's hidden tests use (``bench/otter/small_questions.ipynb``); the expected values
are computed here, from the same arrays, and compared at the rubric's ``values_abs``, as
otter's ``np.allclose(..., rtol=0, atol=1e-9)``.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from grader.checks import CheckContext, Verdict, decide, execution_verdict
from grader.checks.compare import compare, describe, within
from grader.probe import ProbeCase
from grader.rubric import Rubric

PROBE_DRIVER = None   # every case uses the harness's own ``call`` handler


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def _running_mean(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x, axis=0) / np.arange(1, x.shape[0] + 1)[:, None]


def _pairwise_sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1)


def _inputs() -> dict[str, tuple[str, dict[str, np.ndarray], Callable[..., np.ndarray]]]:
    """Case name -> (the function under test, its arguments by name, the trusted reference)."""
    first, second = np.random.default_rng(2), np.random.default_rng(3)
    return {
        "softplus/range": ("softplus", {"x": np.linspace(-50.0, 50.0, 101)}, _softplus),
        "softplus/extremes": ("softplus", {"x": np.array([-1000.0, 1000.0])}, _softplus),
        "running_mean/7x3": ("running_mean", {"x": np.random.default_rng(0).standard_normal((7, 3))}, _running_mean),
        "running_mean/1x4": ("running_mean", {"x": np.random.default_rng(1).standard_normal((1, 4))}, _running_mean),
        "pairwise_sq_dists/5x4": ("pairwise_sq_dists", {"a": first.standard_normal((5, 3)),
                                                        "b": first.standard_normal((4, 3))}, _pairwise_sq_dists),
        "pairwise_sq_dists/1x6": ("pairwise_sq_dists", {"a": second.standard_normal((1, 2)),
                                                        "b": second.standard_normal((6, 2))}, _pairwise_sq_dists),
    }


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    """One call per case, grouped by function (a function that hangs loses its own cases only);
    a function's cases share a worker, each judged against the reference on its own inputs."""
    return [ProbeCase(name, "call", {"dtype": "float64", "calls": [
                {"symbol": symbol, "args": [{"array": a} for a in arrays], "kwargs": {}, "output": "y"}]},
                      arrays, ("y",), group=symbol, batch=symbol)
            for name, (symbol, arrays, _) in _inputs().items()]


def _check_function(context: CheckContext, symbol: str) -> Verdict:
    """Every case of ``symbol`` within the tolerance of the reference on the same inputs."""
    tolerance = context.rubric.tolerances["values_abs"]
    cases = {name: (arrays, reference) for name, (s, arrays, reference) in _inputs().items() if s == symbol}
    for name, (arrays, reference) in cases.items():
        out = context.probe.cases.get(name) if context.probe else None
        if out is None or out.status != "ok":
            why = out.error if out is not None and out.error else (out.status if out else "not run")
            return Verdict("failed", f"{name}: {symbol} could not run: {why}")
        result = compare(out.arrays.get("y"), reference(*arrays.values()))
        if not within(result, tolerance):
            return Verdict("failed", f"{name}: {describe(result)} (tolerance {tolerance:g})")
    return Verdict("passed", f"{symbol} matches the reference on {len(cases)} inputs within {tolerance:g}")


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    """A verdict for every autograded item; each is decided on its own."""
    checks: dict[str, Callable[[], Verdict]] = {"notebook_runs": partial(execution_verdict, context)}
    symbols = ("softplus", "running_mean", "pairwise_sq_dists")
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}"
        return {**{name: Verdict("error", reason or "the scaffold was not probed") for name in symbols},
                **decide(checks)}
    checks.update({symbol: partial(_check_function, context, symbol) for symbol in symbols})
    return decide(checks)
