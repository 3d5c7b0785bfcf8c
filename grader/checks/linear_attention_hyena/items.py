"""The scaffold items: each judges one concern of the student's functions.

How a mistake is charged once (error carried forward). Where one item builds on what another
judges, it is judged against what the student's own code computes once that other item is
lost, and says so:

- ``la_normalized``: a form whose unnormalized output is wrong (its mask, or the order of read
  and write: ``la_unnormalized``) is judged against its own unnormalized output divided by its
  own row sums (the same call with v = 1), so only the normalizer itself is judged here.
- ``la_precision``: its float64 half (the forms agree at L = 512) is judged only when the forms
  agree at small L; its float32 half then compares the two forms as the chapter does, and
  otherwise each form with its own float64 output on the same float32-exact numbers.
- ``gla_vector``: a form found to use another window of gates with a scalar gate (gate after
  the write, a shifted cumulative log-gate: ``gla_scalar``) is judged against that window.
- The capacity items: the figures of the chapter when the curve shows them; otherwise, when a
  helper it is built on (random_unit_vectors, orthonormal_vectors, linear_recall_error) loses
  its item, against the computation capacity_curve's docstring fixes, done in the probe with
  the student's own helpers; a crash that those helpers cause as well is charged to them.
  With right helpers, ``capacity_random`` alone also requires the curve to be that very
  measurement (a curve typed in from the formula, or drawn in another order, loses it there).

The FFT mistakes (no padding, short padding, a conjugated filter) lose ``fft_causal`` and
``fft_impulse`` both: the operator is acausal, and its values are wrong (see the corpus README).
"""
from __future__ import annotations

import math
import re
from functools import cache
from typing import Callable, Iterable

import numpy as np

from grader.checks import CheckContext, Verdict
from grader.checks.compare import (Mismatch, compare, compare_nonfinite_as_expected, describe_scaled, magnitude,
                                   scaled_error)
from grader.checks.linear_attention_hyena import cases as inputs
from grader.checks.linear_attention_hyena import reference
from grader.checks.linear_attention_hyena.cases import Spec
from grader.probe import CaseOutput

MISSING = re.compile(r"AttributeError: module 'submission' has no attribute '(\w+)'")
AXES = {2: ("row", "column"), 3: ("batch", "position", "channel")}
MAX_LISTED = 1   # failing cases quoted in a message (the rest are counted)


class Evidence:
    """Probe outputs with the inputs that produced them, and the trusted expectations."""

    def __init__(self, context: CheckContext):
        self.context = context
        self.plan = inputs.plan()
        tolerances = context.rubric.tolerances
        self.tol = tolerances["identity_float64"]
        self.min_gap = tolerances["float32_min_gap"]
        self.unpadded_min = tolerances["unpadded_min"]
        self.capacity_rel = tolerances["capacity_rel"]
        self.softmax_max = tolerances["softmax_max"]
        self.orthonormal_max = tolerances["orthonormal_max"]
        self.isotropy_mean = tolerances["isotropy_mean"]
        self.isotropy_covariance = tolerances["isotropy_covariance"]
        self._verdicts: dict[str, Verdict] = {}

    # ------------------------------------------------------------------ raw outputs

    def output(self, name: str) -> CaseOutput:
        return self.context.probe.cases.get(name) or CaseOutput("not_run", "the probe did not run this case")

    def names(self, prefix: str, **params) -> list[str]:
        """The cases whose name starts with ``prefix`` and whose parameters include ``params``."""
        return [n for n, s in self.plan.items()
                if n.startswith(prefix) and all(s.params.get(k) == v for k, v in params.items())]

    def where(self, name: str) -> str:
        """The function and the case, for a message: 'gla_parallel (seed 0, L=17, ...)'."""
        spec = self.plan[name]
        return spec.label if spec.label.startswith(spec.function) else f"{spec.function} ({spec.label})"

    def failure(self, name: str) -> str | None:
        """Why case ``name`` gave no outputs (a sentence naming the function and the case), or None."""
        out = self.output(name)
        if out.status == "ok":
            return None
        error = out.error or out.status
        missing = MISSING.match(error)
        if missing:
            return f"{missing.group(1)} is not defined (no `def {missing.group(1)}` in your scaffold cell)"
        verb = {"timeout": "was stopped", "not_run": "was not run"}.get(out.status, "raised")
        return f"{self.where(name)} {verb}: {error}"

    def returned(self, name: str, key: str = "y", shape: tuple[int, ...] | None = None,
                 dtype: str | None = "float64") -> np.ndarray | str:
        """The tensor ``key`` that case ``name`` returned, of this shape and dtype, or what is wrong.
        Its shape and dtype are the received array's; what the worker reports about it can only
        add a reason to fail (see ``dtype_problem``)."""
        problem = self.failure(name)
        if problem:
            return problem
        out = self.output(name)
        reported = out.info.get(key) or {}
        what = self.where(name) + (f", call {key!r}" if key != "y" else "")
        if reported.get("type") != "Tensor":
            return f"{what} returned {reported.get('type', 'nothing')}, not a tensor"
        got = out.arrays.get(key)
        if got is None:
            return f"{what} returned a tensor that could not be read back"
        if shape is not None and tuple(got.shape) != tuple(shape):
            return f"{what} returned shape {tuple(got.shape)}, expected {tuple(shape)}"
        if dtype is not None:
            wrong = dtype_problem(what, got, reported, dtype)
            if wrong:
                return wrong
        return got.astype(np.float64)

    def scalar(self, name: str, key: str = "y") -> float | str:
        """A 0-d float64 value (a one-element float64 tensor, or a Python number), or what is
        wrong, judged on the received array as ``returned`` does."""
        problem = self.failure(name)
        if problem:
            return problem
        out = self.output(name)
        reported, got = out.info.get(key) or {}, out.arrays.get(key)
        what = self.where(name)
        if got is None or reported.get("type") not in ("Tensor", "float", "int"):
            return f"{what} returned {reported.get('type', 'nothing')}, not a number"
        if got.size != 1:
            return f"{what} returned a tensor of shape {tuple(got.shape)}, not a scalar"
        wrong = dtype_problem(what, got, reported, "float64")
        if wrong:
            return wrong
        return float(got.reshape(-1)[0])

    # ------------------------------------------------------------------ comparisons

    def mismatch(self, got: np.ndarray, expected: np.ndarray, tolerance: float | None = None,
                 nonfinite_as_expected: bool = False) -> str | None:
        """None when ``got`` is within the scaled tolerance of ``expected``, else the mismatch."""
        tolerance = self.tol if tolerance is None else tolerance
        result = (compare_nonfinite_as_expected if nonfinite_as_expected else compare)(got, expected)
        if isinstance(result, Mismatch) and result.max_abs <= tolerance * magnitude(expected):
            return None
        return describe_scaled(result, got, expected, tolerance, AXES.get(expected.ndim))

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        return self.plan[name].case.arrays

    # ------------------------------------------------------------------ trusted expectations

    def expected(self, name: str) -> np.ndarray:
        return _expected(name)

    def gla_expected(self, name: str, window: str) -> np.ndarray:
        return _gla_expected(name, window)

    def helper_passed(self, item: str) -> bool | None:
        """Whether another item (a helper this one builds on) passes; None when its check
        crashed, which is that item's error, never this one's."""
        try:
            if item not in self._verdicts:
                self._verdicts[item] = ITEMS[item](self)
            return self._verdicts[item].status == "passed"
        except Exception:  # noqa: BLE001
            return None


def dtype_problem(what: str, got: np.ndarray, reported: dict, dtype: str) -> str | None:
    """None when the received array ``got`` has ``dtype`` and the worker's report of its output
    (``reported``) does not name another. The report can only fail it: the harness sends a
    tensor of another dtype (float16, int64) as a float64 array, which only the report names;
    a Python number is sent as float64, with no dtype reported."""
    for found in (str(got.dtype), reported.get("dtype", dtype)):
        if found != dtype:
            return f"{what} returned {found}, expected {dtype} (compute in the inputs' dtype)"
    return None


@cache
def _expected(name: str) -> np.ndarray:
    """The trusted output of case ``name`` (cases are fixed data, so this is computed once)."""
    spec = inputs.plan()[name]
    a = spec.case.arrays
    if name.startswith(("la/", "precision/")):
        return reference.linear_attention(a["q"], a["k"], a["v"], spec.params.get("normalize", True))
    if name.startswith("retnet/"):
        return reference.retnet_mask(spec.params["L"], spec.params["gamma"])
    if name.startswith("gla_mask/"):
        constant = spec.params["constant"]
        return reference.retnet_mask(spec.params["L"], constant) if constant else reference.gla_mask(a["gate"])
    if name.startswith(("fft/", "toeplitz/", "unpadded/")):
        return reference.causal_convolution(a["u"], a["k"])
    if name.startswith("cyclic/"):
        return reference.cyclic_convolution(a["u"], a["k"])
    if name.startswith("recall/"):
        return np.array(reference.linear_recall_error(a["keys"], a["values"]))
    if name.startswith("softmax/"):
        return np.array(reference.softmax_recall_error(a["keys"], a["values"], spec.params["beta"]))
    raise KeyError(f"no trusted expectation for case {name}")


@cache
def _gla_expected(name: str, window: str) -> np.ndarray:
    a = inputs.plan()[name].case.arrays
    return reference.gated_attention(a["q"], a["k"], a["v"], a["gate"], reference.WINDOWS[window])


# ----------------------------------------------------------------------------- verdicts

def judge(problems: Iterable[str | None], passed: str, notes: Iterable[str] = ()) -> Verdict:
    """Failed with the first problem (and how many more cases failed), else passed."""
    found = [p for p in problems if p]
    notes = [n for n in dict.fromkeys(notes) if n]
    if found:
        more = len(found) - MAX_LISTED
        extra = f" (and {more} more failing case{'s' if more > 1 else ''})" if more > 0 else ""
        return Verdict("failed", "; ".join(found[:MAX_LISTED]) + extra)
    return Verdict("passed", "; ".join([passed, *notes]))


def _worst(errors: list[float]) -> str:
    return f"largest err {max(errors):.1e}" if errors else "no case compared"


# ----------------------------------------------------------------------------- format

def check_scaffold_present(ev: Evidence) -> Verdict:
    """The module imports, and every scaffold function is defined and takes the scaffold's
    arguments (a call that cannot bind its arguments fails before any student code runs)."""
    missing, signatures = [], []
    for name in ev.plan:
        out = ev.output(name)
        error = out.error if isinstance(out, CaseOutput) and out.status == "error" and isinstance(out.error, str) else ""
        found = MISSING.match(error)
        if found and found.group(1) not in missing:
            missing.append(found.group(1))
        symbol = ev.plan[name].function
        if (error.startswith(f"TypeError: {symbol}()") and "(in your code:" not in error
                and symbol not in [s for s, _ in signatures]):
            signatures.append((symbol, error))
    if missing:
        return Verdict("failed", f"not defined: {', '.join(missing)} (keep the scaffold's function names)")
    if signatures:
        symbol, error = signatures[0]
        return Verdict("failed", f"{symbol} does not take the scaffold's arguments: {error}")
    return Verdict("passed", "the scaffold imports and all its functions are defined with their signatures")


# ----------------------------------------------------------------------------- linear attention

def _la_output(ev: Evidence, form: str, mode: str, seed: int, shape: tuple) -> tuple[str, np.ndarray | str]:
    name = inputs.la_name(form, mode, seed, shape)
    rows = (shape[0], 1) if mode == "row_sums" else (shape[0], shape[2])
    return name, ev.returned(name, shape=rows)


def check_la_unnormalized(ev: Evidence) -> Verdict:
    problems, errors = [], []
    for form in inputs.LA_FORMS:
        for seed in inputs.SEEDS:
            for shape in inputs.LA_SHAPES:
                name, got = _la_output(ev, form, "unnormalized", seed, shape)
                if isinstance(got, str):
                    problems.append(got)
                    continue
                expected = ev.expected(name)
                found = ev.mismatch(got, expected)
                if found:
                    problems.append(f"{ev.where(name)}, normalize=False, vs the reference: {found}")
                else:
                    errors.append(scaled_error(compare(got, expected), expected))
    return judge(problems, f"both forms match the reference on all {len(errors) // 2} inputs within {ev.tol:g} "
                           f"({_worst(errors)})")


def _unnormalized_wrong(ev: Evidence, form: str, seed: int, shape: tuple) -> np.ndarray | None:
    """The form's own unnormalized output divided by its own row sums, when its unnormalized
    output is wrong (so la_unnormalized charges it) and both calls returned; else None."""
    name, unnormalized = _la_output(ev, form, "unnormalized", seed, shape)
    _, row_sums = _la_output(ev, form, "row_sums", seed, shape)
    if isinstance(unnormalized, str) or isinstance(row_sums, str) or ev.mismatch(unnormalized, ev.expected(name)) is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return unnormalized / row_sums


def check_la_normalized(ev: Evidence) -> Verdict:
    problems, errors, carried = [], [], []
    for form in inputs.LA_FORMS:
        for seed in inputs.SEEDS:
            for shape in inputs.LA_SHAPES:
                name, got = _la_output(ev, form, "normalized", seed, shape)
                if isinstance(got, str):
                    problems.append(got)
                    continue
                expected = ev.expected(name)
                found = ev.mismatch(got, expected)
                if found is None:
                    errors.append(scaled_error(compare(got, expected), expected))
                    continue
                own = _unnormalized_wrong(ev, form, seed, shape)
                if own is not None and ev.mismatch(got, own, nonfinite_as_expected=True) is None:
                    carried.append(form)
                    continue
                problems.append(f"{ev.where(name)}, normalize=True, vs the reference: {found}"
                                + (". Its unnormalized output is right, so the normalizer is what differs: divide "
                                   "by z_t . phi(q_t), the masked row sum of the scores"
                                   if _unnormalized_right(ev, form, seed, shape) else ""))
    if not carried:
        return judge(problems, f"both forms match the reference on all {inputs_count()} inputs within {ev.tol:g} "
                               f"({_worst(errors)})")
    notes = [f"{form} ({carried.count(form)} of {inputs_count()} inputs) is judged against its own unnormalized "
             "output divided by its own row sums (the same call with v = 1), because its unnormalized output is "
             "wrong, which loses la_unnormalized: its normalizer is right" for form in dict.fromkeys(carried)]
    return judge(problems, f"normalized outputs within {ev.tol:g} of the reference on "
                           f"{len(errors)} of {2 * inputs_count()} form-and-input pairs", notes)


def inputs_count() -> int:
    return len(inputs.SEEDS) * len(inputs.LA_SHAPES)


def _unnormalized_right(ev: Evidence, form: str, seed: int, shape: tuple) -> bool:
    name, unnormalized = _la_output(ev, form, "unnormalized", seed, shape)
    return not isinstance(unnormalized, str) and ev.mismatch(unnormalized, ev.expected(name)) is None


def forms_agree_at_small_length(ev: Evidence) -> bool:
    """Whether the two forms' normalized outputs agree with each other on every small case."""
    for seed in inputs.SEEDS:
        for shape in inputs.LA_SHAPES:
            outputs = [_la_output(ev, form, "normalized", seed, shape)[1] for form in inputs.LA_FORMS]
            if any(isinstance(o, str) for o in outputs) or ev.mismatch(outputs[0], outputs[1]):
                return False
    return True


def check_la_precision(ev: Evidence) -> Verdict:
    rec, par = inputs.LA_FORMS
    problems, notes, gaps = [], [], []
    agree = forms_agree_at_small_length(ev)
    shape = (inputs.PRECISION_L, inputs.PRECISION_DIM)
    for seed in inputs.PRECISION_SEEDS:
        names = {(form, dtype): inputs.precision_name(form, dtype, seed) for form in inputs.LA_FORMS
                 for dtype in ("float64", "float32")}
        y = {key: ev.returned(name, shape=shape, dtype=key[1]) for key, name in names.items()}
        if agree:
            for dtype in ("float64", "float32"):
                for form in inputs.LA_FORMS:
                    if isinstance(y[form, dtype], str):
                        problems.append(y[form, dtype])
            if problems:
                break
            found = ev.mismatch(y[rec, "float64"], y[par, "float64"])
            if found:
                problems.append(f"at L={inputs.PRECISION_L} in float64 (seed {seed}) {rec} and {par} differ: {found} "
                                "(they agree at small L: look for sums that lose precision over long sequences)")
            gap = _gap(y[rec, "float32"], y[par, "float32"])
            gaps.append(gap)
            if not (math.isfinite(gap) and gap > ev.min_gap):
                problems.append(f"with float32 inputs (seed {seed}, L={inputs.PRECISION_L}) the two forms differ by err "
                                f"{gap:.2g}, not more than {ev.min_gap:g}: a computation really done in float32 shows "
                                "its rounding there; was it done in float64 and cast back?")
        else:
            for form in inputs.LA_FORMS:
                y64, y32 = y[form, "float64"], y[form, "float32"]
                if isinstance(y32, str) or isinstance(y64, str):
                    problems.append(y32 if isinstance(y32, str) else y64)
                    continue
                rounded = y64.astype(np.float32).astype(np.float64)
                result = compare_nonfinite_as_expected(y32, rounded)
                gap = scaled_error(result, rounded) if isinstance(result, Mismatch) else math.nan
                gaps.append(gap)
                if isinstance(result, str):
                    problems.append(f"{form} with float32 inputs (seed {seed}, L={inputs.PRECISION_L}): {result}")
                elif not gap > ev.min_gap:
                    problems.append(f"{form} with float32 inputs (seed {seed}, L={inputs.PRECISION_L}) returns its float64 "
                                    f"result rounded to float32 (err {gap:.2g}, not more than {ev.min_gap:g}): compute in "
                                    "the inputs' dtype")
            notes.append("your two forms already disagree at small L (charged in la_normalized or la_unnormalized), "
                         "so their float64 agreement at L = 512 is not judged, and each form's float32 run is compared "
                         "with its own float64 run on the same (float32-exact) numbers")
    summary = (f"at L={inputs.PRECISION_L} the float64 forms agree within {ev.tol:g}, and with float32 inputs both return "
               f"float32 computed in float32 (gaps {', '.join(f'{g:.1e}' for g in gaps)} > {ev.min_gap:g})" if agree else
               f"with float32 inputs both forms return float32 computed in float32 (gaps "
               f"{', '.join(f'{g:.1e}' for g in gaps)} > {ev.min_gap:g})")
    return judge(problems, summary, notes)


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    result = compare(a, b)
    return scaled_error(result, b) if isinstance(result, Mismatch) else math.nan


# ----------------------------------------------------------------------------- gated linear attention

def _gla_cases(ev: Evidence, form: str, kind: str) -> list[str]:
    return [inputs.gla_name(form, kind, seed, shape, forgetting) for seed in inputs.SEEDS
            for shape in inputs.GLA_SHAPES for forgetting in inputs.GLA_SHIFTS]


def _gla_got(ev: Evidence, name: str) -> np.ndarray | str:
    L, _, dv = ev.plan[name].params["shape"]
    return ev.returned(name, shape=(L, dv))


def scalar_window(ev: Evidence, form: str) -> str | None:
    """The window of gates the form uses with a scalar gate, on every scalar case, or None."""
    try:
        names = _gla_cases(ev, form, "scalar")
        outputs = {n: _gla_got(ev, n) for n in names}
        if any(isinstance(o, str) for o in outputs.values()):
            return None
        for window in reference.WINDOWS:
            if all(ev.mismatch(outputs[n], ev.gla_expected(n, window)) is None for n in names):
                return window
    except Exception:  # noqa: BLE001 - unreadable outputs identify nothing
        return None
    return None


def check_gla_scalar(ev: Evidence) -> Verdict:
    problems, errors = [], []
    for form in inputs.GLA_FORMS:
        window = scalar_window(ev, form)
        diagnosis = (f". Your {form} computes the gated sum with {reference.WINDOW_WORDS[window]}"
                     if window not in (None, "reference") else "")
        for name in _gla_cases(ev, form, "scalar"):
            got = _gla_got(ev, name)
            if isinstance(got, str):
                problems.append(got)
                continue
            expected = ev.gla_expected(name, "reference")
            found = ev.mismatch(got, expected)
            if found:
                problems.append(f"{ev.where(name)} vs the reference gate_{{j+1}} ... gate_t: {found}{diagnosis}")
            else:
                errors.append(scaled_error(compare(got, expected), expected))
    return judge(problems, f"both forms match the reference on all {len(errors) // 2} scalar-gate inputs within "
                           f"{ev.tol:g} ({_worst(errors)})")


def check_gla_vector(ev: Evidence) -> Verdict:
    problems, errors, notes = [], [], []
    for form in inputs.GLA_FORMS:
        window = scalar_window(ev, form)
        carried = window not in (None, "reference")
        for name in _gla_cases(ev, form, "vector"):
            got = _gla_got(ev, name)
            if isinstance(got, str):
                problems.append(got)
                continue
            expected = ev.gla_expected(name, "reference")
            found = ev.mismatch(got, expected)
            if found is None:
                errors.append(scaled_error(compare(got, expected), expected))
            elif carried and ev.mismatch(got, ev.gla_expected(name, window)) is None:
                notes.append(f"{form} is judged against the window of gates it uses with a scalar gate, "
                             f"{reference.WINDOW_WORDS[window].split(' (')[0]}, which loses gla_scalar: with that "
                             "window, each key feature is decayed by its own gate, as it must be")
            else:
                problems.append(f"{ev.where(name)} vs the reference (each key feature c decayed by its own "
                                f"gate_{{i,c}}, the rows of S): {found}"
                                + (f"; nor does it match the window of gates it uses with a scalar gate "
                                   f"({reference.WINDOW_WORDS[window].split(' (')[0]})" if carried else ""))
    count = len(_gla_cases(ev, inputs.GLA_FORMS[0], "vector"))
    if notes:
        return judge(problems, f"per-feature gates: {len(errors)} of {2 * count} form-and-input pairs within {ev.tol:g} "
                               "of the reference", notes)
    return judge(problems, f"both forms match the reference on all {count} per-feature-gate inputs within {ev.tol:g} "
                           f"({_worst(errors)})")


# ----------------------------------------------------------------------------- masks

def _upper_problem(mask: np.ndarray) -> str | None:
    upper = np.triu(mask, 1)
    if mask.shape[0] > 1 and np.any(upper != 0):
        t, j = (int(i) for i in np.argwhere(upper != 0)[0])
        return (f"non-zero entries above the diagonal (first at row {t}, column {j}: {mask[t, j]:.6g}); "
                "entries with j > t must be exactly 0")
    return None


def check_retnet_mask(ev: Evidence) -> Verdict:
    problems = []
    for name in ev.names("retnet/"):
        L = ev.plan[name].params["L"]
        got = ev.returned(name, shape=(L, L))
        if isinstance(got, str):
            problems.append(got)
            continue
        found = ev.mismatch(got, ev.expected(name))
        upper = _upper_problem(got)
        defect = float(np.abs(got[1:, 1:] - got[:-1, :-1]).max(initial=0.0))
        if found:
            problems.append(f"{ev.where(name)} vs gamma^(t-j): {found}")
        elif upper:
            problems.append(f"{ev.where(name)}: {upper}")
        elif not defect < ev.tol:
            problems.append(f"{ev.where(name)} is not Toeplitz: its diagonals differ by {defect:.2g}")
    return judge(problems, f"gamma^(t-j) on and below the diagonal, 0 above and Toeplitz on all "
                           f"{len(ev.names('retnet/'))} cases (gamma as float and as a 0-d tensor)")


def check_gla_mask(ev: Evidence) -> Verdict:
    problems = []
    for name in ev.names("gla_mask/"):
        L = ev.plan[name].params["L"]
        got = ev.returned(name, shape=(L, L))
        if isinstance(got, str):
            problems.append(got)
            continue
        constant = ev.plan[name].params["constant"]
        what = "RetNet's gamma^(t-j)" if constant else "gate_{j+1} ... gate_t (exp of the segment sums of log-gates)"
        found = ev.mismatch(got, ev.expected(name))
        upper = _upper_problem(got)
        if found:
            hint = ". The diagonal must be 1 (an empty product): the key's own gate is not in it" if (
                not np.allclose(np.diag(got), 1.0)) else ""
            problems.append(f"{ev.where(name)} vs {what}: {found}{hint}")
        elif upper:
            problems.append(f"{ev.where(name)}: {upper}")
    return judge(problems, f"the segment products of the gates, 0 above the diagonal, and RetNet's mask for a "
                           f"constant gate, on all {len(ev.names('gla_mask/'))} cases within {ev.tol:g}")


# ----------------------------------------------------------------------------- convolutions

def _conv_got(ev: Evidence, name: str) -> np.ndarray | str:
    return ev.returned(name, shape=ev.arrays(name)["u"].shape)


def _against_oracle(ev: Evidence, names: list[str], what: str) -> tuple[list[str], list[float]]:
    problems, errors = [], []
    for name in names:
        got = _conv_got(ev, name)
        if isinstance(got, str):
            problems.append(got)
            continue
        expected = ev.expected(name)
        found = ev.mismatch(got, expected)
        if found:
            problems.append(f"{ev.where(name)} vs {what}: {found}")
        else:
            errors.append(scaled_error(compare(got, expected), expected))
    return problems, errors


def check_fft_causal(ev: Evidence) -> Verdict:
    names = ev.names("fft/")
    problems, errors = _against_oracle(ev, names, "the causal convolution (the Toeplitz oracle)")
    return judge(problems, f"matches the causal convolution on all {len(names)} cases within {ev.tol:g} "
                           f"({_worst(errors)})")


def check_fft_impulse(ev: Evidence) -> Verdict:
    problems = []
    names = ev.names("impulse/")
    for name in names:
        got = _conv_got(ev, name)
        if isinstance(got, str):
            problems.append(got)
            continue
        p, k = ev.plan[name].params["p"], ev.arrays(name)["k"]
        y = got[0]
        before = np.abs(y[:p])
        if p > 0 and not before.max() < ev.tol:
            n, c = (int(i) for i in np.argwhere(~(before < ev.tol))[0])
            problems.append(f"{ev.where(name)}: the output before p is not 0 (first at position {n}, channel {c}: "
                            f"{y[n, c]:.3g}; largest {before.max():.3g}): inputs leak into earlier outputs (acausal)")
            continue
        found = ev.mismatch(y[p:], k[: len(k) - p])
        if found:
            problems.append(f"{ev.where(name)}: the response from p on vs the filter k[n - p]: {found}")
    return judge(problems, f"0 before the impulse and the filter from it on, in all {len(names)} cases")


def check_toeplitz_oracle(ev: Evidence) -> Verdict:
    names = ev.names("toeplitz/")
    problems, errors = _against_oracle(ev, names, "the explicit causal sum")
    return judge(problems, f"the explicit causal sum on all {len(names)} cases within {ev.tol:g} ({_worst(errors)})")


def check_fft_cyclic(ev: Evidence) -> Verdict:
    cyclic = ev.names("cyclic/")
    problems, _ = _against_oracle(ev, cyclic, "the cyclic sum of k[(n - m) mod L] u[m]")
    gaps = []
    for name in ev.names("unpadded/"):
        got = _conv_got(ev, name)
        if isinstance(got, str):
            problems.append(got)
            continue
        expected = ev.expected(name)
        result = compare(got, expected)
        gap = scaled_error(result, expected) if isinstance(result, Mismatch) else math.nan
        gaps.append(gap)
        if not gap > ev.unpadded_min:
            problems.append(f"{ev.where(name)} is within err {gap:.2g} of the causal convolution, not more than "
                            f"{ev.unpadded_min:g} off: the un-padded transform must wrap future inputs around "
                            "(transform at length L, no padding)")
    return judge(problems, f"the cyclic convolution on all {len(cyclic)} cases, and off the causal convolution by err "
                           f"{', '.join(f'{g:.2f}' for g in gaps)} (more than {ev.unpadded_min:g})")


# ----------------------------------------------------------------------------- key generators

def check_unit_vectors(ev: Evidence) -> Verdict:
    problems = []
    for name in ev.names("unit/"):
        params = ev.plan[name].params
        n, d = params["n"], params["d"]
        if "seed" not in params:
            got = ev.returned(name, shape=(n, d))
            if isinstance(got, str):
                problems.append(got)
            continue
        seed = params["seed"]
        drawn = {key: ev.returned(name, key, shape=(n, d)) for key in ("first", "again", "other")}
        bad = next((v for v in drawn.values() if isinstance(v, str)), None)
        if bad:
            problems.append(bad)
            continue
        x = drawn["first"]
        norms = np.abs(np.linalg.norm(x, axis=1) - 1.0)
        mean = float(np.abs(x.mean(axis=0)).max())
        spread = float(np.abs(x.T @ x / n * d - np.eye(d)).max())
        if not norms.max() < ev.tol:
            row = int(np.argmax(~(norms < ev.tol)))
            problems.append(f"{ev.where(name)}: rows are not unit vectors (row {row} has norm "
                            f"{np.linalg.norm(x[row]):.6g}; max |norm - 1| = {norms.max():.2g}): divide each row by its norm")
        elif not np.array_equal(x, drawn["again"]):
            problems.append(f"{ev.where(name)}: two calls with fresh generators of the same seed {seed} gave different "
                            "vectors: draw from the generator passed in, not the global random state")
        elif np.allclose(x, drawn["other"]):
            problems.append(f"{ev.where(name)}: seeds {seed} and {seed + 100} gave the same vectors")
        elif not (mean < ev.isotropy_mean and spread < ev.isotropy_covariance):
            problems.append(f"{ev.where(name)}: not uniform on the sphere: |mean| up to {mean:.3f} (needs < "
                            f"{ev.isotropy_mean:g}), d * covariance - I up to {spread:.3f} (needs < "
                            f"{ev.isotropy_covariance:g})")
    return judge(problems, "unit rows, reproducible from the generator passed in, different across seeds and isotropic")


def check_orthonormal_vectors(ev: Evidence) -> Verdict:
    problems = []
    for name in ev.names("orthonormal/"):
        params = ev.plan[name].params
        n, d = params["n"], params["d"]
        if name.endswith("too_many"):
            out = ev.output(name)
            if out.status == "ok":
                problems.append(f"{ev.where(name)} did not raise ValueError ({n} orthonormal vectors need d >= {n})")
            elif not (out.error or "").startswith("ValueError"):
                problems.append(f"{ev.failure(name)}; expected a ValueError ({n} orthonormal vectors need d >= {n})")
            continue
        drawn = {key: ev.returned(name, key, shape=(n, d)) for key in ("first", "again", "other", "other_again")}
        bad = next((v for v in drawn.values() if isinstance(v, str)), None)
        if bad:
            problems.append(bad)
            continue
        V = drawn["first"]
        gram = np.abs(V @ V.T - np.eye(n))
        if not gram.max() < ev.tol:
            i, j = (int(x) for x in np.unravel_index(int(np.argmax(gram)), gram.shape))
            problems.append(f"{ev.where(name)}: V V^T - I up to {gram.max():.2g} (at ({i}, {j})), needs < {ev.tol:g}: "
                            "the rows must be orthonormal")
        elif not (np.array_equal(V, drawn["again"]) and np.array_equal(drawn["other"], drawn["other_again"])):
            problems.append(f"{ev.where(name)}: two calls with fresh generators of the same seed gave different vectors: "
                            "draw from the generator passed in")
        elif n > 1 and np.allclose(V, drawn["other"]):
            problems.append(f"{ev.where(name)}: seeds 0 and 1 gave the same vectors")
    return judge(problems, f"orthonormal rows (V V^T = I within {ev.tol:g}), reproducible, different across seeds, "
                           "and ValueError for n > d")


# ----------------------------------------------------------------------------- recall

def _scalar_items(ev: Evidence, names: list[str], what: str) -> tuple[list[str], list[float]]:
    problems, errors = [], []
    for name in names:
        got = ev.scalar(name)
        if isinstance(got, str):
            problems.append(got)
            continue
        expected = float(ev.expected(name))
        error = abs(got - expected) / max(1.0, abs(expected))
        if not error <= ev.tol:
            problems.append(f"{ev.where(name)} = {got:.6g}, {what} {expected:.6g}: err {error:.2g} "
                            f"(tolerance {ev.tol:g})")
        else:
            errors.append(error)
    return problems, errors


def check_recall_error(ev: Evidence) -> Verdict:
    names = ev.names("recall/")
    problems, errors = _scalar_items(ev, names, "the mean per-binding norm of S^T k_j - v_j is")
    return judge(problems, f"matches the reference on all {len(names)} cases within {ev.tol:g} ({_worst(errors)})")


def check_softmax_baseline(ev: Evidence) -> Verdict:
    names = ev.names("softmax/", sharp=False)
    problems, errors = _scalar_items(ev, names, "the softmax readout over the stored keys gives")
    sharp = ev.names("softmax/", sharp=True)
    worst = 0.0
    for name in sharp:
        got = ev.scalar(name)
        if isinstance(got, str):
            problems.append(got)
        elif not got < ev.softmax_max:
            problems.append(f"{ev.where(name)} = {got:.3g}: at a sharp inverse temperature the softmax readout "
                            f"must be below {ev.softmax_max:g}")
        else:
            worst = max(worst, got)
    return judge(problems, f"matches the reference at beta in {{1, 5}} ({_worst(errors)}) and stays below "
                           f"{ev.softmax_max:g} at beta = {inputs.SHARP_BETA:g} (largest {worst:.1e})")


# ----------------------------------------------------------------------------- capacity

HELPERS = {"random_unit_vectors": "unit_vectors", "orthonormal_vectors": "orthonormal_vectors",
           "linear_recall_error": "recall_error"}


def _curve(ev: Evidence, name: str) -> np.ndarray | str:
    return ev.returned(name, shape=(len(ev.plan[name].params["Ks"]),))


def _composition(ev: Evidence, name: str) -> np.ndarray | str:
    """What capacity_curve must return given the student's own helpers, as the probe computed
    it (the mean over seeds of each K's recall errors), or the error that computation raised."""
    params = ev.plan[name].params
    composed = params["composition"]
    problem = ev.failure(composed)
    if problem:
        return ev.output(composed).error or problem
    means = []
    for K in params["Ks"]:
        values = [ev.scalar(composed, inputs.composition_output(K, seed)) for seed in params["seeds"]]
        bad = next((v for v in values if isinstance(v, str)), None)
        if bad:
            return f"linear_recall_error: {bad}"
        means.append(float(np.mean(values)))
    return np.array(means)


def _helpers_of(kind: str) -> list[str]:
    return [inputs.KEY_DRAWS[kind], "orthonormal_vectors", "linear_recall_error"] if kind == "random" else [
        "orthonormal_vectors", "linear_recall_error"]


def capacity_item(ev: Evidence, item: str, figures: Callable[[Spec, np.ndarray], str | None], passed: str,
                  measured: bool = False) -> Verdict:
    """Each curve shows the chapter's figures; or, when a helper it is built on loses its item,
    it returns what the student's own helpers give on the docstring's seeding (or raises the
    error they raise there, which is charged to them). ``measured``: with right helpers, the
    curve must also be that measurement (a curve typed in from the formula is not)."""
    names = [n for n in ev.names("capacity/", item=item) if not ev.plan[n].params.get("composed")]
    problems, carried, exempt = [], [], []
    for name in names:
        spec = ev.plan[name]
        curve = _curve(ev, name)
        problem = curve if isinstance(curve, str) else figures(spec, curve)
        helpers = _helpers_of(spec.params["kind"])
        lost = [h for h in helpers if ev.helper_passed(HELPERS[h]) is False]
        if not lost:
            if problem is None and measured:
                problem = _not_measured(ev, name, curve, helpers)
            if problem:
                problems.append(problem)
            continue
        if problem is None:
            continue
        own = (f"your own {' and '.join(lost)} (which lose{'s' if len(lost) == 1 else ''} "
               f"{' and '.join(f'`{HELPERS[h]}`' for h in lost)})")
        composed = _composition(ev, name)
        raised = ev.output(name).error if ev.output(name).status == "error" else None
        if raised is not None and isinstance(composed, str) and composed == raised:
            exempt.append((spec, own, raised))
        elif isinstance(curve, np.ndarray) and isinstance(composed, np.ndarray) and ev.mismatch(curve, composed) is None:
            carried.append((spec, own, curve))
        else:
            against = (f"they raise {composed}" if isinstance(composed, str) else
                       ev.mismatch(curve, composed) if isinstance(curve, np.ndarray) else "they run")
            problems.append(f"{problem}; nor does it return what {own} give on the docstring's seeding ({against})")
    notes = []
    for own in dict.fromkeys(own for _, own, _ in carried):
        values = "; ".join(f"{spec.label} = {', '.join(f'{x:.4g}' for x in curve)}"
                           for spec, same, curve in carried if same == own)
        notes.append(f"judged against {own}: capacity_curve returns what they give on the docstring's seeding "
                     f"({values})")
    notes += [f"{spec.label} raised {raised}, as the same calls to {own} do: charged there, not here"
              for spec, own, raised in exempt]
    judged = len(names) - len(carried) - len(exempt)
    if notes:
        passed = (f"{judged} of {len(names)} curves show the chapter's figures" if judged else
                  "the chapter's figures are not expected, because a helper the curve is built on is wrong")
    return judge(problems, passed, notes)


def _not_measured(ev: Evidence, name: str, curve: np.ndarray, helpers: list[str]) -> str | None:
    """None when the curve is what the student's own (right) helpers measure on the docstring's
    seeding, else how it differs."""
    composed = _composition(ev, name)
    label = ev.plan[name].label
    seeding = ("per K and seed: gen = torch.Generator().manual_seed(seed), keys from gen, then "
               "values = orthonormal_vectors(K, K, gen), then linear_recall_error; averaged over the seeds")
    if isinstance(composed, str):
        return f"{label}: the same measurement with your own {', '.join(helpers)} raised {composed}"
    found = ev.mismatch(curve, composed)
    if found is None:
        return None
    return (f"{label} = {', '.join(f'{x:.6g}' for x in curve)} is not the measurement its docstring fixes: your own "
            f"{', '.join(helpers)} give {', '.join(f'{x:.6g}' for x in composed)} on that seeding ({seeding}): {found}")


def _orthonormal_figures(ev: Evidence) -> Callable[[Spec, np.ndarray], str | None]:
    def problem(spec: Spec, curve: np.ndarray) -> str | None:
        if np.all(np.abs(curve) < ev.orthonormal_max):
            return None
        return (f"{spec.label} = {[f'{x:.1e}' for x in curve]}: orthonormal keys with K <= d_k recall exactly "
                f"(needs < {ev.orthonormal_max:g})")
    return problem


def check_capacity_orthonormal(ev: Evidence) -> Verdict:
    return capacity_item(ev, "capacity_orthonormal", _orthonormal_figures(ev),
                         f"orthonormal keys with K <= d_k recall below {ev.orthonormal_max:g}")


def check_capacity_rising(ev: Evidence) -> Verdict:
    def problem(spec: Spec, curve: np.ndarray) -> str | None:
        if np.all(np.isfinite(curve)) and np.all(curve[1:] > curve[:-1]):
            return None
        return (f"{spec.label} = {[round(float(x), 4) for x in curve]}: with random unit keys the error must rise "
                f"strictly with K = {list(spec.params['Ks'])}")
    return capacity_item(ev, "capacity_rising", problem, "the recall error rises with K")


def check_capacity_random(ev: Evidence) -> Verdict:
    def problem(spec: Spec, curve: np.ndarray) -> str | None:
        (K,), dk = spec.params["Ks"], spec.params["d_k"]
        predicted = math.sqrt((K - 1) / dk)
        got = float(curve[0])
        if abs(got / predicted - 1) < ev.capacity_rel:
            return None
        return (f"{spec.label} = {got:.4g}, sqrt((K-1)/d_k) = {predicted:.4g}: off by "
                f"{abs(got / predicted - 1):.1%} (needs within {ev.capacity_rel:.0%})")
    return capacity_item(ev, "capacity_random", problem,
                         f"measured with your own helpers, random unit keys give within {ev.capacity_rel:.0%} of "
                         f"sqrt((K-1)/d_k) at (K, d_k) in {list(inputs.CAPACITY_POINTS)}", measured=True)


ITEMS: dict[str, Callable[[Evidence], Verdict]] = {
    "la_normalized": check_la_normalized,
    "la_unnormalized": check_la_unnormalized,
    "la_precision": check_la_precision,
    "gla_scalar": check_gla_scalar,
    "gla_vector": check_gla_vector,
    "retnet_mask": check_retnet_mask,
    "gla_mask": check_gla_mask,
    "fft_causal": check_fft_causal,
    "fft_impulse": check_fft_impulse,
    "toeplitz_oracle": check_toeplitz_oracle,
    "fft_cyclic": check_fft_cyclic,
    "unit_vectors": check_unit_vectors,
    "orthonormal_vectors": check_orthonormal_vectors,
    "recall_error": check_recall_error,
    "softmax_baseline": check_softmax_baseline,
    "capacity_orthonormal": check_capacity_orthonormal,
    "capacity_rising": check_capacity_rising,
    "capacity_random": check_capacity_random,
}
