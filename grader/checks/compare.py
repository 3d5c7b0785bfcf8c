"""Comparing a student's outputs with what was expected, shared by every checks module.

Three rules live here so that every item of every assignment applies them the same way:

- **Shapes first.** An output of the wrong shape fails with both shapes named; it is never
  broadcast against the expected array, and an empty output never crashes a check.
- **Where and by how much.** A mismatch reports the max-abs error, its first worst position
  and the expected and actual values there, as pytest does (``describe_scaled`` adds the
  scaled error against its tolerance and the first position beyond it).
- **One dtype rule.** For checks modules that run every case in float64 and again in float32
  (its *twin*; ``DtypeRule``): an item passes when all its float64 runs are within the float64
  tolerance; failing that, when every case is within the float32 tolerance in its float64 run
  or in its float32 twin (code that cannot run in float64, or only computes in float32, still
  earns the item, with a note).

Tolerances are absolute for expected values of magnitude up to 1 and relative beyond, so an
output that legitimately grows (an unnormalized sum, say) is judged at the same precision:
the scaled error is err(got, expected) = max|got - expected| / max(1, max|expected|).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from grader.checks import Verdict


@dataclass(frozen=True)
class Mismatch:
    """The largest difference between two arrays of the same shape."""

    max_abs: float
    where: tuple[int, ...]
    expected: float
    got: float


def compare(got: np.ndarray | None, expected: np.ndarray) -> Mismatch | str:
    """The mismatch of ``got`` against ``expected``, or a message when they cannot be
    compared (no output, another shape, non-finite values)."""
    if got is None:
        return "no output was produced"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    if not np.all(np.isfinite(got)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return f"non-finite output ({got[where]}) at {position(where)}"
    if got.size == 0:
        return Mismatch(0.0, (), 0.0, 0.0)
    diff = np.abs(got.astype(np.float64) - expected)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return Mismatch(float(diff[where]), where, float(expected[where]), float(got[where]))


def scaled(tolerance: float, expected: np.ndarray) -> float:
    """``tolerance`` as an absolute bound for values up to 1, relative above that."""
    return tolerance * max(1.0, float(np.abs(expected).max(initial=0.0)))


def within(result: Mismatch | str, tolerance: float) -> bool:
    return isinstance(result, Mismatch) and result.max_abs <= tolerance


def position(where: tuple[int, ...], names: Sequence[str] | None = None) -> str:
    """'batch 0, position 3, channel 5' for a (B, T, C) index; the tuple otherwise. ``names``
    names the axes instead ('row 3, column 2'), when it has one name per axis."""
    if names is not None and len(names) == len(where):
        return ", ".join(f"{n} {i}" for n, i in zip(names, where))
    names = ("batch", "position", "channel")
    return ", ".join(f"{n} {i}" for n, i in zip(names, where)) if len(where) == 3 else str(where)


def describe(result: Mismatch | str, names: Sequence[str] | None = None,
             labels: tuple[str, str] = ("expected", "got")) -> str:
    """The mismatch for a message. ``labels`` name its two values (the ``expected`` one first);
    "expected" is only ever the trusted value, so a comparison of two of the student's own
    outputs names them instead (("forward", "step loop"), say)."""
    if isinstance(result, str):
        return result
    where = f" at ({position(result.where, names)})" if result.where else ""   # a 0-d value has no position
    first, second = labels
    return f"max-abs error {result.max_abs:.3g}{where}: {first} {result.expected:.6g}, {second} {result.got:.6g}"


def compare_nonfinite_as_expected(got: np.ndarray | None, expected: np.ndarray) -> Mismatch | str:
    """``compare`` for an expected array that may itself hold NaN or infinities (an expected
    0/0, say): ``got`` must hold the same non-finite value at exactly those entries, and the
    finite rest is compared as ``compare`` does."""
    if got is None or got.shape != expected.shape:
        return compare(got, expected)
    finite = np.isfinite(expected)
    if finite.all():
        return compare(got, expected)
    same = np.where(finite, np.isfinite(got), (np.isnan(expected) & np.isnan(got)) | (got == expected))
    if not same.all():
        where = tuple(int(i) for i in np.argwhere(~same)[0])
        return (f"expected {expected[where]} at {position(where)}, got {got[where]}" if not finite[where]
                else f"non-finite output ({got[where]}) at {position(where)}")
    if not finite.any():
        return Mismatch(0.0, (), 0.0, 0.0)
    diff = np.where(finite, np.abs(got.astype(np.float64) - np.where(finite, expected, 0.0)), 0.0)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return Mismatch(float(diff[where]), where, float(expected[where]), float(got[where]))


def magnitude(expected: np.ndarray) -> float:
    """max(1, max |expected|) over its finite entries: the scale of ``scaled`` (for an array
    that may hold non-finite entries) and what ``scaled_error`` divides by."""
    finite = np.abs(expected[np.isfinite(expected)]) if np.size(expected) else np.zeros(0)
    return max(1.0, float(finite.max(initial=0.0)))


def scaled_error(result: Mismatch, expected: np.ndarray) -> float:
    """err(got, expected) = max|got - expected| / max(1, max|expected|): the error that
    ``scaled(tolerance, expected)`` bounds, as one number."""
    return result.max_abs / magnitude(expected)


def first_beyond(got: np.ndarray, expected: np.ndarray, bound: float) -> tuple[int, ...] | None:
    """The first position, in row-major order, where ``got`` and ``expected`` (same shape) differ
    by more than ``bound`` (entries non-finite in ``expected`` are skipped), or None."""
    finite = np.isfinite(expected)
    diff = np.abs(got.astype(np.float64) - np.where(finite, expected, 0.0))
    beyond = np.argwhere(finite & ~(diff <= bound))
    return tuple(int(i) for i in beyond[0]) if beyond.size else None


def describe_scaled(result: Mismatch | str, got: np.ndarray | None, expected: np.ndarray, tolerance: float,
                    names: Sequence[str] | None = None) -> str:
    """A mismatch judged by the scaled rule, for a message: the error found against the
    tolerance, where it is largest (expected and got there) and the first offending position."""
    if isinstance(result, str):
        return result
    text = f"err {scaled_error(result, expected):.3g} (tolerance {tolerance:g}), {describe(result, names)}"
    first = first_beyond(got, expected, tolerance * magnitude(expected)) if got is not None else None
    if first is not None and first != result.where:
        text += f"; first beyond the tolerance at ({position(first, names)})"
    return text


@dataclass(frozen=True)
class DtypeRule:
    """The tolerances of the dtype rule, how a float64 case names its float32 twin, and the
    dtype of the arrays a run returned as received here (None: none received)."""

    float64_tolerance: float
    float32_tolerance: float
    twin: Callable[[str], str | None]
    received_dtype: Callable[[str], str | None] = lambda name: None

    def judge(self, names: Sequence[str], problem: Callable[[str, float], str | None],
              what: str) -> Verdict:
        """Apply the rule to the float64 cases ``names``. ``problem(run, tolerance)`` says what
        is wrong with one run at one tolerance (None: nothing)."""
        strict = next(((n, p) for n, p in ((n, problem(n, self.float64_tolerance)) for n in names) if p), None)
        if strict is None:
            return Verdict("passed", f"{what}: all {len(names)} cases within {self.float64_tolerance:g} (float64)")
        for name in names:
            found = self._loose_problem(name, problem)
            if found:
                return Verdict("failed", f"{what}: {found}")
        return Verdict("passed", f"{what}: {float32_note(self, strict[1], self.received_dtype(strict[0]))}")

    def _loose_problem(self, name: str, problem: Callable[[str, float], str | None]) -> str | None:
        """None when the float64 run or its twin is within the float32 tolerance; else the
        more telling of the two problems (the twin's, when the float64 run could not run)."""
        first = problem(name, self.float32_tolerance)
        twin = self.twin(name)
        if first is None or twin is None:
            return first
        second = problem(twin, self.float32_tolerance)
        if second is None:
            return None
        return second if first.startswith(RUN_FAILED) else first


RUN_FAILED = "could not run"   # how a problem that is not a numeric mismatch begins


def float32_note(rule: DtypeRule, float64_problem: str, received: str | None) -> str:
    """The one note every item gives code that is right only at float32 precision. It says what
    was measured: the float64 run did not run, returned float32 arrays, or returned float64
    arrays off by more than float64 rounding (float32 arithmetic inside, or a small difference in
    the computation itself such as where EPS sits, look the same from outside)."""
    passed = f"correct at float32 tolerance {rule.float32_tolerance:g}, so full marks"
    if RUN_FAILED in float64_problem:
        return (f"{passed}; in float64 it {float64_problem}, while its float32 run is right. Does your code "
                "hard-code float32 (x.float()?)? Use the input's dtype.")
    missed = f"in float64 it missed {rule.float64_tolerance:g} ({float64_problem})"
    if received == "float32":
        return (f"{passed}; {missed}: your float64 run returned float32 arrays, so your code computes in float32 "
                "(a hard-coded dtype, or x.float()?); use the input's dtype.")
    returned = f"the arrays your float64 run returned are {received}, so " if received else ""
    return (f"{passed}; {missed}: {returned}a part of the computation differs by about that much (a float32 step "
            "inside, or a small difference such as where a stabilizing epsilon sits?).")
