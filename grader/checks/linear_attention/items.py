"""The scaffold items: each judges one concern of the student's LinearAttention.

How a mistake is charged once. First, for each form, the checks find which computation it
does (``Evidence.variant``): the reference, or the reference with named mistakes (see
``model.Variant``). Then each item compares that form's outputs with the variant it matched,
with only the item's own concern put right. A form that forgot the normalizer is judged on
its decay against the unnormalized computation, so it loses ``normalization`` and nothing else.
A form that matches no named computation is judged against the reference itself.

The recurrent form's decay is judged on the (S, z) that step returned after the first segment
of each run (relayed between workers by the probe, so measured here): a readout mistake does
not touch it, and S counts in either orientation. That state is part of what step is found to
compute: a step whose outputs are right but whose state is not (decayed once more, say) is the
variant that explains both.

A form that raised on every case it was given is said so once, plainly, on every item that
needs it (``NEEDS``), instead of each item's own account of a run that did not happen.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import cached_property, partial
from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict, torch
from grader.checks.compare import (RUN_FAILED, DtypeRule, Mismatch, compare, compare_nonfinite_as_expected,
                                   describe, magnitude, scaled, within)
from grader.checks.linear_attention import cases as inputs
from grader.checks.linear_attention.model import (EPS_CONVENTIONS, REFERENCE, Variant, attention, candidates,
                                                  fit_decay, parameters, says, state_after)
from grader.probe import MAX_STATE_ARRAYS, CaseOutput, ProbeCase

FORM_KIND = {"forward": "forward", "step": "steps"}
UNUSED_STATE = "step does not go on from the state it returned, so the state's size shows nothing"
# Factors fitted for one gamma_logit in two runs agree this closely when the decay is a function of it.
FITTED_AGREE = 1e-6
# Decay weights past these are too close to the dtype's range to compare (see overflow_free_tokens).
OVERFLOW_LIMIT = {"float64": 1e200, "float32": 1e25}
# The harness's account of an exception: "Type: message (in your code: line)", a segment after it.
RAISED = re.compile(r"(?P<type>[A-Za-z_][\w.]*): (?P<message>.*?)(?: \(in your code: (?P<line>.*)\))?"
                    r"(?: \(tokens \d+ to \d+\))?", re.DOTALL)


class Evidence:
    """Probe outputs with the inputs that produced them, and what they show about each form."""

    def __init__(self, context: CheckContext, cases: list[ProbeCase]):
        self.context = context
        self.inputs = {c.name: c for c in cases}
        tolerances = context.rubric.tolerances
        self.rule = DtypeRule(tolerances.get("float64_abs", 1e-10), tolerances.get("float32_abs", 1e-4),
                              self.twin, self.received_dtype)

    # ------------------------------------------------------------------ raw outputs

    def twin(self, name: str) -> str | None:
        twin = inputs.twin_name(name) if name.endswith("_float64") else None
        return twin if twin in self.inputs else None

    def received_dtype(self, name: str) -> str | None:
        """float32 if any float array run ``name`` returned is float32, else float64 if it returned
        any: measured here on the arrays received, for the dtype rule's note."""
        out = self.output(name)
        kinds = {str(a.dtype) for a in [*out.arrays.values(), *(a for state in out.states for a in state)]
                 if isinstance(a, np.ndarray) and a.dtype.kind == "f"}
        return "float32" if "float32" in kinds else ("float64" if kinds else None)

    def output(self, name: str) -> CaseOutput:
        return self.context.probe.cases.get(name) or CaseOutput("not_run", "the probe did not run this case")

    def ran(self, name: str) -> str:
        """The float64 run if it ran, else its float32 twin if that ran (the dtype rule)."""
        twin = self.twin(name)
        if self.output(name).status != "ok" and twin and self.output(twin).status == "ok":
            return twin
        return name

    def label(self, name: str) -> str:
        case = self.inputs[name]
        x = case.arrays.get("x")
        shape = f"B={x.shape[0]}, T={x.shape[1]}, " if x is not None else ""
        logits = case.arrays.get("gamma_logit")
        decay = "" if logits is None else f", gamma per head {np.round(1 / (1 + np.exp(-logits)), 4).tolist()}"
        return f"{shape}D={case.config.get('embedding_dim')}, H={case.config.get('num_heads')}{decay}, {case.config['dtype']}"

    def first_segment(self, name: str) -> int:
        """Tokens in the first worker of a ``steps`` run: step from a fresh state, nothing resumed."""
        return self.inputs[name].segments.bounds[0][1]

    def y(self, name: str, tokens: int | None = None) -> np.ndarray | str:
        """The output (B, T, D) of a forward or steps run (its first ``tokens`` only, which a
        run that failed in a later segment may still have), or what is wrong with it."""
        out = self.output(name)
        got = out.arrays.get("y")
        batch, length, dim = self.inputs[name].arrays["x"].shape
        partial = out.status != "ok"
        if partial and (tokens is None or got is None or got.ndim != 3 or got.shape[1] < tokens):
            return f"{RUN_FAILED} (case {self.label(name)}): {out.error or out.status}"
        if got is None:
            return f"case {self.label(name)}: no output was produced"
        if got.ndim != 3 or (got.shape[0], got.shape[2]) != (batch, dim) or (not partial and got.shape[1] != length):
            return f"case {self.label(name)}: expected output shape {(batch, length, dim)}, got {tuple(got.shape)}"
        return got if tokens is None else got[:, :tokens]

    # ------------------------------------------------------------------ expected outputs

    def _layer(self, name: str, tokens: int | None):
        case = self.inputs[name]
        x = torch.as_tensor(case.arrays["x"][:, :tokens], dtype=torch.float64)
        return parameters(case.arrays), x, case.config["num_heads"]

    def expected(self, name: str, variant: Variant, eps: str, tokens: int | None = None) -> np.ndarray:
        return _trusted(self.inputs[name], ("y", variant, eps, tokens),
                        lambda: attention(*self._layer(name, tokens), variant, eps).numpy())

    def expected_state(self, name: str, variant: Variant, tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return _trusted(self.inputs[name], ("state", variant, tokens),
                        lambda: state_after(*self._layer(name, tokens), variant))

    def judged_tokens(self, name: str, variant: Variant, tokens: int | None = None) -> int:
        """The leading positions of run ``name`` that ``variant`` is compared on: all of them,
        unless its decay factor exceeds 1 and its weights leave the run dtype's range."""
        case = self.inputs[name]
        length = case.arrays["x"].shape[1] if tokens is None else tokens
        return variant.overflow_free_tokens(case.arrays["gamma_logit"], length,
                                            OVERFLOW_LIMIT[case.config["dtype"]])

    def output_mismatch(self, name: str, got: np.ndarray, variant: Variant,
                        tokens: int | None) -> tuple[Mismatch | str, np.ndarray]:
        """The closer of ``variant``'s outputs under the two EPS conventions (on the positions
        ``judged_tokens`` keeps)."""
        keep = self.judged_tokens(name, variant, tokens)
        results = [(compare(got[:, :keep], e[:, :keep]), e[:, :keep])
                   for e in (self.expected(name, variant, eps, tokens) for eps in EPS_CONVENTIONS)]
        return min(results, key=lambda r: r[0].max_abs if isinstance(r[0], Mismatch) else math.inf)

    # ------------------------------------------------------------------ what each form computes

    def variant(self, form: str) -> Variant | None:
        return self.forward_variant if form == "forward" else self.step_variant

    @cached_property
    def forward_variant(self) -> Variant | None:
        return self._identify("forward")

    @cached_property
    def step_variant(self) -> Variant | None:
        return self._identify("step")

    def _identify(self, form: str) -> Variant | None:
        """The computation that ``form`` does on the identifying cases (step: in its first
        worker), as the reference, a named variant or, failing those, the reference with a
        decay measured per gamma_logit (``_fitted``); None when it matches none."""
        names = inputs.names(FORM_KIND[form], inputs.GAMMAS, inputs.IDENTIFYING_SHAPES)
        tokens = {n: (self.first_segment(n) if form == "step" else None) for n in names}
        runs = {}
        for name in names:
            found = [(run, self.y(run, tokens[name])) for run in (name, self.twin(name)) if run]
            runs[name] = [(run, got) for run, got in found if not isinstance(got, str)]
            if not runs[name]:
                return None

        def distance(variant: Variant) -> float | None:
            """How far the outputs are from ``variant``, in float32 tolerances (None: too far;
            identifying needs no more precision than the loosest verdict)."""
            worst = 0.0
            for name in names:
                best = math.inf
                for run, got in runs[name]:
                    result, expected = self.output_mismatch(run, got, variant, tokens[name])
                    if isinstance(result, Mismatch):
                        best = min(best, result.max_abs / scaled(self.rule.float32_tolerance, expected))
                if best > 1.0:
                    return None
                worst = max(worst, best)
            return worst

        fallback = None   # a step whose state no candidate explains is identified by its outputs alone
        for group in ([REFERENCE], list(candidates(form, pairs=False)), list(candidates(form, pairs=True))):
            matched = sorted((d, i) for i, d in enumerate(map(distance, group)) if d is not None)
            if matched and form == "forward":
                return group[matched[0][1]]
            fallback = fallback or (group[matched[0][1]] if matched else None)
            for _, i in matched:
                if self._state_matches(group[i], names):
                    return group[i]
        fitted = None if fallback else self._fitted(form)
        if fitted is not None and distance(fitted) is not None and (form == "forward"
                                                                    or self._state_matches(fitted, names)):
            return fitted
        return fallback

    def _fitted(self, form: str) -> Variant | None:
        """The reference with each gamma_logit's decay factor measured on ``form``'s outputs
        (``model.fit_decay``, on the longest runs of every decay setting), when every logit
        gets one factor: a decay that is some other function of each head's own logit."""
        found: dict[float, float] = {}
        for gamma in inputs.GAMMAS:
            name = inputs.name(FORM_KIND[form], inputs.IDENTIFYING_SHAPES[-1], gamma)
            run = next((r for r in (name, self.twin(name)) if r and not isinstance(
                self.y(r, self.first_segment(r) if form == "step" else None), str)), None)
            if run is None:
                return None
            tokens = self.first_segment(run) if form == "step" else None
            params, x, heads = self._layer(run, tokens)
            factors = fit_decay(params, x, heads, self.y(run, tokens))
            if factors is None:
                return None
            for logit, factor in zip(self.inputs[run].arrays["gamma_logit"].tolist(), factors.tolist()):
                if abs(found.setdefault(logit, factor) - factor) > FITTED_AGREE:
                    return None   # not a function of the logit alone
        return Variant(decay_s="fitted", decay_z="fitted", fitted=tuple(sorted(found.items())))

    def _state_matches(self, variant: Variant, names: list[str]) -> bool:
        """Whether the state step returned after its first segment is ``variant``'s, within the
        float32 tolerance, on every case of ``names`` (in the float64 run or its twin)."""
        return all(any(self._state_problem(run, variant, self.rule.float32_tolerance) is None
                       for run in (name, self.twin(name)) if run) for name in names)

    def _state_problem(self, run: str, variant: Variant, tolerance: float, diagnosis: str = "") -> str | None:
        """What is wrong with the state step returned after its first segment of ``run``, against
        ``variant``'s (None: nothing), a mismatch followed by ``diagnosis``; without a normalizer
        a step may keep no z."""
        out = self.output(run)
        if not out.states:   # a run that failed after its first segment still has that state
            return f"{RUN_FAILED} (case {self.label(run)}): {out.error or 'step returned no state'}"
        tokens = self.first_segment(run)
        got = out.states[0]
        if len(got) != 2:
            return (f"case {self.label(run)}: step returned its state as {len(got)} arrays; "
                    "expected the pair (S, z)")
        S_expected, z_expected = self.expected_state(run, variant, tokens)
        S = min((compare(got[0], e) for e in (S_expected, S_expected.swapaxes(-1, -2))),
                key=lambda r: r.max_abs if isinstance(r, Mismatch) else math.inf)
        parts = [("S", S, S_expected)]
        if variant.normalizer != "missing":
            parts.append(("z", compare(got[1], z_expected), z_expected))
        for part, result, expected in parts:
            if not within(result, scaled(tolerance, expected)):
                return (f"case {self.label(run)}, the state after {tokens} steps from a fresh start: "
                        f"{part}: {describe(result)}{diagnosis}")
        return None

    def diagnosis(self, form: str, concern: str | None) -> str:
        variant = self.variant(form)
        found = says(variant, form, concern) if variant is not None and concern else None
        return f". Diagnosis: {found}" if found else ""

    # ------------------------------------------------------------------ judging a family of cases

    def outputs_item(self, form: str, names: list[str], variant: Variant, concern: str, what: str,
                     first_segment: bool = False) -> Verdict:
        """The form's outputs on ``names`` against ``variant``, by the dtype rule."""
        def problem(run: str, tolerance: float) -> str | None:
            tokens = self.first_segment(run) if first_segment else None
            got = self.y(run, tokens)
            if isinstance(got, str):
                return got
            result, expected = self.output_mismatch(run, got, variant, tokens)
            if within(result, scaled(tolerance, expected)):
                return None
            return f"case {self.label(run)}: {describe(result)}{self.diagnosis(form, concern)}"
        return self.rule.judge(names, problem, what)

    def last_position_item(self, names: list[str], concern: str, what: str) -> Verdict:
        """forward's last position on ``names`` against the reference's (under the closer EPS
        convention): the position no later token can reach, for a forward that matches no known
        computation, so that a causality leak costs this item nothing."""
        def problem(run: str, tolerance: float) -> str | None:
            got = self.y(run)
            if isinstance(got, str):
                return got
            last = got.shape[1] - 1
            results = [(compare(got[:, last:], e[:, last:]), e[:, last:])
                       for e in (self.expected(run, REFERENCE, eps) for eps in EPS_CONVENTIONS)]
            result, expected = min(results, key=lambda r: r[0].max_abs if isinstance(r[0], Mismatch) else math.inf)
            if within(result, scaled(tolerance, expected)):
                return None
            if isinstance(result, Mismatch) and result.where:   # its position in the whole output
                result = replace(result, where=(result.where[0], last, result.where[2]))
            found = describe(result, ("batch", "position", "channel"))
            return (f"case {self.label(run)}, at the last position (t = {last}, whose future is empty, so no leak of "
                    f"later tokens reaches it): {found}. Your forward matches no known computation, so it is judged "
                    f"where only {concern} can differ")
        return self.rule.judge(names, problem, f"{what} (at the last position)")

    def state_item(self, names: list[str], variant: Variant, concern: str | None, what: str) -> Verdict:
        """The state step returned after its first segment on ``names`` against ``variant``'s."""
        def problem(run: str, tolerance: float) -> str | None:
            return self._state_problem(run, variant, tolerance, self.diagnosis("step", concern))
        return self.rule.judge(names, problem, what)

    def raised(self, form: str) -> str | None:
        """How ``form`` failed, when it raised on every case of its kind in both dtypes (None
        otherwise): one plain sentence for every item that needs it."""
        runs = [run for name in inputs.names(FORM_KIND[form]) for run in (name, self.twin(name)) if run]
        outputs = [self.output(run) for run in runs]
        if not outputs or any(out.status != "error" for out in outputs):
            return None
        error = next((out.error for out in outputs if out.error and not out.error.startswith("not run")), None)
        found = RAISED.fullmatch(error or "")
        if found is None:
            return f"{form} raised an error on every input it was given ({error or 'no message'})"
        message = f": {found['message']}" if found["message"] else ""
        where = f", at `{found['line']}`" if found["line"] else ""
        return f"{form} raised {found['type']}{message}{where}"

    def given_state_ignored(self) -> str | None:
        """Whether step ignores the state it is handed: one step from a state the grader built and
        one from the zero state, on the same token, return the same state, or step raises from the
        grader's state (None: it uses the state it is given, or did not finish). Such a step is no
        recurrence (its history is kept elsewhere, or it is not written): the step's side of an
        item about what the recurrence does shows nothing, and state_resume charges the cause."""
        run = self.ran("grader_state_float64")
        out = self.output(run)
        if out.status == "error":
            return f"step raised from a state the grader built ({out.error})"
        if out.status != "ok":   # it did not finish: the items' own runs say so
            return None
        from_given = _saved_state(out, partial(inputs.state_part_output, "from_given"))
        from_zero = _saved_state(out, partial(inputs.state_part_output, "from_zero"))
        if len(from_given) == len(from_zero) and all(
                a.shape == b.shape and np.array_equal(a, b) for a, b in zip(from_given, from_zero)):
            return ("one step from a state the grader built returned exactly the state one step from the zero state "
                    "returned: step ignores the state it is given")
        return None

    def step_not_judged(self) -> Verdict | None:
        """The step's side of a property item, not judged when step is no recurrence: it ignores
        the state it is given (``given_state_ignored``) and the state it returns is not the (S, z)
        of its tokens (``real_state_problem``), so its outputs come from elsewhere (a history kept
        outside the state, or code that is not step at all). A step that reads a history but
        returns the tokens' (S, z), or one that uses its state wrongly, is judged."""
        ignored = self.given_state_ignored()
        if ignored is None or self.real_state_problem() is None:
            return None
        return not_judged(f"{ignored}, and the state it returns is not the (S, z) of its tokens, so it is no "
                          "recurrence and the step's side of this item shows nothing (state_resume charges it)")

    def real_state_problem(self) -> str | None:
        """Whether step's first-segment state is the (S, z) of the tokens it was given, as the
        computation it was found to do predicts (None: it is)."""
        names = inputs.names("steps", ("per_head",), inputs.IDENTIFYING_SHAPES)
        verdict = self.state_item(names, self.step_variant or REFERENCE, None, "the state step returned")
        return None if verdict.status == "passed" else verdict.message


# Trusted outputs depend on a case's inputs only, so every submission one process grades shares
# them: a regrade from kept raw outputs costs the comparisons, not the reference computation.
# Keyed by the identity of the inputs (twins share theirs), which each entry keeps alive, so a key
# is never reused by other inputs; the cases themselves are built once (``cases.probe_cases``).
_TRUSTED: dict[tuple, tuple[object, object]] = {}
TRUSTED_ENTRIES = 4096


def _trusted(case: ProbeCase, key: tuple, compute: Callable[[], object]) -> object:
    full = (id(case.arrays), *key)
    if full not in _TRUSTED:
        if len(_TRUSTED) >= TRUSTED_ENTRIES:
            _TRUSTED.clear()
        value = compute()
        for array in value if isinstance(value, tuple) else (value,):
            array.flags.writeable = False   # shared by every submission: no check may change it
        _TRUSTED[full] = (case.arrays, value)
    return _TRUSTED[full][1]


# ----------------------------------------------------------------------------- the items

# Where the student's own outputs are compared with each other there is no trusted value:
# neither is "expected".
EQUIVALENCE_LABELS = ("forward", "step loop")
RESUME_LABELS = ("uninterrupted", "resumed")
SNAPSHOT_LABELS = ("when returned", "later")
MUTATED_STATE = ("step writes in place into the state it is given (or into a state it returned); return new tensors "
                 "(S = gamma * S + ..., not S.mul_(gamma).add_(...)), or update a clone")


def check_equivalence(ev: Evidence) -> Verdict:
    """forward and a loop of step calls agree: the student's two forms against each other.
    Where both were found to compute one variant whose decay overflows, only the positions
    before the overflow are compared (the decay items charge the decay)."""
    shared = ev.forward_variant if ev.forward_variant == ev.step_variant else None

    def problem(run: str, tolerance: float) -> str | None:
        steps_run = run.replace("forward_", "steps_", 1)
        forward, step = ev.y(run), ev.y(steps_run)
        for form, got in (("step", step), ("forward", forward)):
            if isinstance(got, str):
                return f"{form} {got}" if got.startswith(RUN_FAILED) else f"{form}, {got}"
        if shared is not None:
            keep = ev.judged_tokens(run, shared)
            forward, step = forward[:, :keep], step[:, :keep]
        for form, got in (("step", step), ("forward", forward)):
            if not np.all(np.isfinite(got)):
                return f"case {ev.label(run)}: {form}'s output is not finite ({describe(compare(got, got))})"
        result = compare(step, forward.astype(np.float64))
        if within(result, scaled(tolerance, step)) or _apart_only_by_eps(ev, run, steps_run, tolerance):
            return None
        return (f"case {ev.label(run)}: {describe(result, labels=EQUIVALENCE_LABELS)}"
                f"{_which_form(ev, ev.inputs[steps_run], step, forward, tolerance)}")
    return ev.rule.judge(inputs.names("forward"), problem, "forward vs a loop of step calls")


def _apart_only_by_eps(ev: Evidence, forward_run: str, steps_run: str, tolerance: float) -> bool:
    """Whether each form is, at ``tolerance``, the computation it was found to do, and those two
    are one computation but for where EPS sits (a state decayed once more divides gamma N by
    gamma D + EPS): EPS is no concern, so such forms agree."""
    forward, step = ev.forward_variant, ev.step_variant
    if forward is None or step is None or forward == step:
        return False
    apart = compare(ev.expected(steps_run, step, "none"), ev.expected(forward_run, forward, "none"))
    if not within(apart, scaled(tolerance, ev.expected(forward_run, forward, "none"))):
        return False
    for run, variant in ((forward_run, forward), (steps_run, step)):
        result, expected = ev.output_mismatch(run, ev.y(run), variant, None)
        if not within(result, scaled(tolerance, expected)):
            return False
    return True


def _which_form(ev: Evidence, case: ProbeCase, step: np.ndarray, forward: np.ndarray, tolerance: float) -> str:
    """Which form is wrong, when the checks can tell."""
    starts = [start for start, _ in case.segments.bounds][1:]
    wrong = np.argwhere(np.abs(step.astype(np.float64) - forward) > scaled(tolerance, forward))
    first = int(wrong[:, 1].min()) if wrong.size else None
    if first in starts and ev.step_variant is not None:
        return (f". Everything before token {first} agrees; token {first} is where the probe went on from the "
                "state your step returned, in a fresh process on a fresh layer: step must compute from "
                "(x_t, state) alone, not from history kept elsewhere")
    forward_ok, step_ok = ev.forward_variant == REFERENCE, ev.step_variant == REFERENCE
    if forward_ok == step_ok:
        return ""
    wrong_form = "step" if forward_ok else "forward"
    found = says(ev.variant(wrong_form), wrong_form) if ev.variant(wrong_form) else None
    return (f". forward {'matches' if forward_ok else 'does not match'} the reference and step "
            f"{'matches' if step_ok else 'does not'}" + (f". Diagnosis: {found}" if found else ""))


def check_normalization(ev: Evidence) -> Verdict:
    """forward at gamma = 1 against the variant it was found to compute with its normalization
    put right; a forward that matches no known computation is compared with the reference at
    the last position of each case (T = 1: its only one), whose future is empty, so a leak of
    later tokens (causality's concern) cannot reach what is judged."""
    if ev.forward_variant is None:
        return ev.last_position_item(inputs.names("forward", ("none",)), "normalization",
                                     "forward at gamma = 1 vs the normalized reference")
    return ev.outputs_item("forward", inputs.names("forward", ("none",)), ev.forward_variant.put_right("normalization"),
                           "normalization", "forward at gamma = 1 vs the normalized reference")


def check_decay_parallel(ev: Evidence) -> Verdict:
    """forward's decay under every setting: gamma = 1 too (a decay clamped below 1 shows there
    only); at the last position of each case when forward matches no known computation (as in
    ``check_normalization``)."""
    if ev.forward_variant is None:
        verdict = ev.last_position_item(inputs.names("forward"), "decay", "forward with decay vs the reference")
    else:
        verdict = ev.outputs_item("forward", inputs.names("forward"), ev.forward_variant.put_right("decay"), "decay",
                                  "forward with decay vs the reference")
    return _all_of([verdict, _numerics_item(ev, "forward")])


def check_decay_recurrent(ev: Evidence) -> Verdict:
    """The decay of the state step builds, under every setting as in ``check_decay_parallel``.
    A step that matches no known computation, or whose state is not the one the computation
    it was found to do builds, is judged on the decay alone: one step from a state the grader
    built and one from the zero state, on the same token, differ by gamma_h times the state
    handed in, whatever step adds (``_grader_state_decay``). A step that ignores the state it is
    given is not judged (``Evidence.given_state_ignored``)."""
    if ev.step_not_judged():
        verdict = ev.step_not_judged()
    elif ev.step_variant is None or ev.real_state_problem():
        verdict = _grader_state_decay(ev)
    else:
        verdict = ev.state_item(inputs.names("steps"), ev.step_variant.put_right("decay"), "decay",
                                "the state step builds with decay vs the reference")
    return _all_of([verdict, _numerics_item(ev, "step")])


# float32's unit roundoff, and the roundings per token a float32 run may accumulate against the
# same code's float64 run: each output is a sum over at most T positions (or T updates of the state),
# each term off by a few roundings (a power of gamma, a product, the sum itself).
FLOAT32_UNIT = 2.0 ** -24
NUMERICS_ROUNDINGS = 8


def _numerics_item(ev: Evidence, form: str) -> Verdict:
    """The decay's numerics at the notebook's own sizes (``cases.NUMERICS_SHAPE``: 512 tokens,
    gamma 0.5 among the heads): the float32 run must be finite and within T * NUMERICS_ROUNDINGS
    float32 roundings (scaled) of the same code's float64 run, so whatever else the form computes
    is the same on both sides. Where the float64 run is not finite either, or did not run, there
    is nothing float32 changed: the items of the cause charge it. A form found to compute a
    normalization mistake (a feature map that is not positive, say, whose denominators come near
    0) amplifies every rounding: only a run that is not finite in float32 counts against it,
    and the same for a form that matches no known computation; a float32 run that merely
    differs is then the normalization's doing, which ``normalization`` charges."""
    kind = FORM_KIND[form]
    variant = ev.variant(form)
    conditioned = variant is not None and variant.put_right("normalization") == variant
    tokens = inputs.NUMERICS_SHAPE[1]
    tolerance = tokens * NUMERICS_ROUNDINGS * FLOAT32_UNIT
    run64, run32 = f"numerics_{kind}_float64", f"numerics_{kind}_float32"
    exact, single = ev.y(run64), ev.y(run32)
    what = f"{form} in float32 at the notebook's own sizes (T = {tokens}, gamma down to 0.5)"
    if isinstance(exact, str) or not np.all(np.isfinite(exact)):
        return Verdict("passed", f"{what}: not compared, its float64 run is not finite or did not run (other items "
                                 "judge that run)")
    if ev.output(run32).status == "timeout":   # slow code (Python loops over (t, i)) is no numerics mistake
        return Verdict("passed", f"{what}: not compared, its float32 run did not finish in the case's time "
                                 f"({ev.output(run32).error})")
    if isinstance(single, str):
        return Verdict("failed", f"{what}: {single}")
    label = ev.label(run32)
    finite = np.isfinite(single)
    if not finite.all():
        b, t, c = (int(i) for i in np.argwhere(~finite)[0])
        return Verdict("failed", f"{what}: case {label}: the output is not finite from position {t} on (batch {b}, "
                                 f"channel {c}: {single[b, t, c]}), while the same code in float64 is. Diagnosis: "
                                 f"{NUMERICS_DIAGNOSIS[form]}")
    result = compare(single, exact.astype(np.float64))
    bound = scaled(tolerance, exact)
    if within(result, bound):
        return Verdict("passed", f"{what}: finite and within {tolerance:.3g} of its float64 run")
    if not conditioned:
        return Verdict("passed", f"{what}: finite; not compared with its float64 run, which a computation without "
                                 "the reference's normalization makes ill-conditioned (normalization judges it)")
    beyond = np.argwhere(np.abs(single.astype(np.float64) - exact) > bound)[0]
    found = describe(result, ("batch", "position", "channel"), ("float64 run", "float32 run"))
    return Verdict("failed", f"{what}: case {label}: {found}, "
                             f"beyond {bound:.3g} ({tokens} tokens x {NUMERICS_ROUNDINGS} float32 roundings), first at "
                             f"position {int(beyond[1])}. Diagnosis: {NUMERICS_DIAGNOSIS[form]}")


NUMERICS_DIAGNOSIS = {
    "forward": "powers of gamma leave float32's range: gamma^-t (or 1 / gamma^t) reaches 2^t for gamma = 0.5, past "
               "float32's largest number (3.4e38) after 128 tokens, and gamma^t underflows to 0 after ~150; build "
               "each weight as gamma^(t-i) with t - i >= 0 (the future masked before any power or exp), never as "
               "gamma^t * gamma^-i",
    "step": "the state leaves float32's range over the run: keep S and z as the recurrence says (S = gamma S + "
            "phi(k) v^T), never rescaled by a growing power gamma^-t",
}


def _grader_state_decay(ev: Evidence) -> Verdict:
    name = "grader_state_float64"

    def problem(run: str, tolerance: float) -> str | None:
        out = ev.output(run)
        if out.status != "ok":
            return f"{RUN_FAILED} (case {ev.label(run)}): step from a state the grader built: {out.error or out.status}"
        arrays = ev.inputs[run].arrays
        gamma = 1 / (1 + np.exp(-arrays["gamma_logit"]))
        given = [arrays["given.0"], arrays["given.1"]]
        from_given = _saved_state(out, partial(inputs.state_part_output, "from_given"))
        from_zero = _saved_state(out, partial(inputs.state_part_output, "from_zero"))
        if len(from_given) != 2 or len(from_zero) != 2:
            return (f"case {ev.label(run)}: step returned its state as {len(from_given)} arrays; expected the pair "
                    "(S, z)")
        for index, (part, axes) in enumerate(STATE_PARTS):
            if from_given[index].shape != given[index].shape or from_zero[index].shape != given[index].shape:
                return (f"case {ev.label(run)}: given {part} shaped {list(given[index].shape)}, step returned "
                        f"{part} shaped {list(from_given[index].shape)} and, from the zero state, "
                        f"{list(from_zero[index].shape)}")
            kept = from_given[index].astype(np.float64) - from_zero[index]
            scale = gamma.reshape((1, -1) + (1,) * (given[index].ndim - 2))
            expected = scale * given[index]
            result = compare(kept, expected)
            if within(result, scaled(tolerance, expected)):
                continue
            flat = given[index].reshape(given[index].shape[0], len(gamma), -1)
            measured = (kept.reshape(flat.shape) * flat).sum(axis=(0, 2)) / (flat * flat).sum(axis=(0, 2))
            return (f"case {ev.label(run)}, one step from a state (S, z) the grader built minus one step from the "
                    f"zero state, on the same token (what step adds cancels): {part} {describe(result, axes)}; that "
                    f"difference must be gamma_h times the {part} handed in. Measured factor per head: "
                    f"{np.round(measured, 6).tolist()}, gamma per head {np.round(gamma, 6).tolist()}")
        return None
    return ev.rule.judge([name], problem, "step decays the state it is given by gamma_h (from a state the grader "
                                          "built)")


def check_decay_per_head(ev: Evidence) -> Verdict:
    """Each head its own decay, in both forms: against the matched computation with the heads
    put right; by heads that differ only in gamma (``_heads_apart``) for a form that matches no
    known computation, a step whose state is not its matched computation's, or a form that
    applies no decay (its heads then agree, and the decay items charge the missing decay)."""
    judged = []
    forward, step = ev.forward_variant, ev.step_variant
    if forward is None or not forward.applies_decay:
        judged.append(_heads_apart(ev, "forward"))
    else:
        judged.append(ev.outputs_item("forward", inputs.names("forward", ("per_head",)),
                                      forward.put_right("heads"), "heads",
                                      "forward with a different decay per head"))
    if ev.step_not_judged():
        judged.append(ev.step_not_judged())
    elif step is None or not step.applies_decay or ev.real_state_problem():
        judged.append(_heads_apart(ev, "step"))
    else:
        judged.append(ev.state_item(inputs.names("steps", ("per_head",)), step.put_right("heads"),
                                    "heads", "the state step builds with a different decay per head"))
    problem = _decay_property_problem(ev)
    if problem:
        judged.append(Verdict("failed", problem))
    return _all_of(judged)


def _heads_apart(ev: Evidence, form: str) -> Verdict:
    """Per-head decay observed on its own, for a form that matches no known computation (or a
    step whose state is not the one it was found to compute): heads with one set of weights
    that differ only in gamma (``cases.per_head_arrays``). Head h of the run with every head's
    own logit must equal head h of the run where every head has head h's logit: forward's
    output, step's state (S, z) after the run, as the decay items judge each form. What else
    the form computes is the same in both runs."""
    heads, d = inputs.PER_HEAD_SHAPE[3], inputs.PER_HEAD_SHAPE[2] // inputs.PER_HEAD_SHAPE[3]
    gammas = np.round(1 / (1 + np.exp(-np.array(inputs.PER_HEAD_LOGITS[:heads]))), 4).tolist()

    def parts(run: str) -> list[tuple[str, tuple[str, ...], list[np.ndarray]]] | str:
        """(what, axes, per head) of one run: forward's output channels, step's S and z."""
        if form == "forward":
            got = ev.y(run)
            if isinstance(got, str):
                return f"forward {got}" if got.startswith(RUN_FAILED) else f"forward, {got}"
            return [("output", ("batch", "position", "channel of the head"),
                     [got[..., h * d:(h + 1) * d] for h in range(heads)])]
        out = ev.output(run)
        if out.status != "ok" or not out.states:
            return f"{RUN_FAILED} (case {ev.label(run)}): {out.error or 'step returned no state'}"
        state = out.states[-1]
        shapes = [[inputs.PER_HEAD_SHAPE[0], heads, d, d], [inputs.PER_HEAD_SHAPE[0], heads, d]]
        if [list(a.shape) for a in state] != shapes:
            return (f"case {ev.label(run)}: step returned a state of arrays shaped {[list(a.shape) for a in state]}; "
                    f"expected (S, z) shaped {shapes}")
        return [(name, axes[:1] + axes[2:], [a[:, h] for h in range(heads)])
                for (name, axes), a in zip(STATE_PARTS, state)]

    def problem(run: str, tolerance: float) -> str | None:
        everyone = parts(run)
        uniform = [parts(run.replace("_all_", f"_uniform{h}_")) for h in range(heads)]
        for found in (everyone, *uniform):
            if isinstance(found, str):
                return found
        for index, (what, axes, per_head) in enumerate(everyone):
            for h in range(heads):
                expected = uniform[h][index][2][h].astype(np.float64)
                result = compare(per_head[h], expected)
                if within(result, scaled(tolerance, expected)):
                    continue
                same = [j for j in range(heads) if within(compare(per_head[h], uniform[j][index][2][j].astype(
                    np.float64)), scaled(tolerance, expected))]
                said = (f"head {h} computes what every head computes with head {same[0]}'s gamma "
                        f"({gammas[same[0]]}): each head uses another head's decay (heads are mixed up)" if same else
                        f"head {h} matches no run where every head has one head's gamma: head h must use its own "
                        "gamma_h")
                return (f"heads with the same weights that differ only in gamma (gamma per head {gammas}, "
                        f"{ev.label(run).split(', gamma')[0]}): head {h}'s {what} {describe(result, axes)} from "
                        f"head {h}'s {what} in the run where every head has gamma {gammas[h]}. Diagnosis: {said}")
        return None
    what = "forward's output" if form == "forward" else "the state step builds"
    return ev.rule.judge([inputs.per_head_name(form, None)], problem,
                         f"{what}, for heads that differ only in gamma, uses each head's own")


def _decay_property_problem(ev: Evidence) -> str | None:
    name = ev.ran(inputs.name("forward", 3, "per_head"))
    decay = ev.output(name).arrays.get("decay")
    expected = 1 / (1 + np.exp(-ev.inputs[name].arrays["gamma_logit"]))
    if decay is None or decay.shape != expected.shape or np.abs(decay - expected).max() > ev.rule.float32_tolerance:
        return f"decay should equal sigmoid(gamma_logit) = {np.round(expected, 6).tolist()}"
    return None


def not_judged(reason: str) -> Verdict:
    """An item the evidence cannot decide: ``error`` (0 points, and the TA's review list says
    why), never a failure that charges the student for a mistake another item charges."""
    return Verdict("error", f"not judged: {reason}")


def exercise_run(context: CheckContext, case: str, function: str, given: str,
                 stopped: str) -> tuple[dict[str, Any], Verdict | None]:
    """The probe's record of an exercise function it called (case ``case``), and the verdict
    when that run decides the item already: not run, not defined, stopped by the layer (not
    judged; ``stopped`` says who stopped, with ``{raised_in}``), or raising. ``given`` names
    what the grader gave it, for messages."""
    out = context.probe.cases.get(case) or CaseOutput("not_run", "the probe did not run this case")
    if out.status != "ok":
        return {}, Verdict("failed", f"{function} could not be run on the grader's {given}: {out.error or out.status}")
    info = out.info
    if info.get("missing"):
        return info, Verdict("failed", f"{function} is not defined: "
                                       + context.ungraded.get(function, "no cell defines it"))
    if info.get("raised_in"):
        return info, not_judged(f"{stopped.format(raised_in=info['raised_in'])} raised ({info.get('error')}); the "
                                "layer's own items judge it")
    if info.get("error"):
        return info, Verdict("failed", f"{function} raised {info['error']} on the grader's {given}")
    return info, None


def _all_of(verdicts: list[Verdict]) -> Verdict:
    """Failed if a part failed; else not judged if a part could not be; else passed."""
    for status in ("failed", "error"):
        found = [v for v in verdicts if v.status == status]
        if found:
            return Verdict(status, found[0].message)
    return Verdict("passed", "; ".join(v.message for v in verdicts))


def check_alignment(ev: Evidence) -> Verdict:
    """A token's output includes its own key and value, in both forms, observed on its own:
    two runs whose inputs differ only in token t's key and value (its query, and every other
    token, kept: ``cases.alignment_arrays``) must give different outputs at position t. Nothing
    else the form computes (its state, its decay, a leak of later tokens) decides it; a step that
    ignores the state it is given is no recurrence, and its side is not judged."""
    return _all_of([_alignment_problem_item(ev, "forward"),
                    ev.step_not_judged() or _alignment_problem_item(ev, "step")])


def _alignment_problem_item(ev: Evidence, form: str) -> Verdict:
    kind, t = FORM_KIND[form], inputs.ALIGN_TOKEN

    def problem(run: str, tolerance: float) -> str | None:
        original, changed = ev.y(run), ev.y(run.replace("_original_", "_changed_"))
        for got in (original, changed):
            if isinstance(got, str):
                return f"{form} {got}" if got.startswith(RUN_FAILED) else f"{form}, {got}"
        before, after = original[:, t].astype(np.float64), changed[:, t].astype(np.float64)
        for got in (before, after):
            if not np.all(np.isfinite(got)):
                found = describe(compare(got, got))
                return f"case {ev.label(run)}: {form}'s output at position {t} is not finite ({found})"
        moved = np.abs(after - before).max(axis=-1)   # per sequence
        bound = scaled(tolerance, before)
        if moved.min() > bound:
            return None
        b = int(np.argmin(moved))
        return (f"case {ev.label(run)}: changing only the key and value of token {t} (its query and every other "
                f"token kept) changed {form}'s output at position {t} by at most {moved[b]:.3g} (batch {b}), not "
                f"more than {bound:.3g}: the output at t leaves out token t's own phi(k_t) v_t^T. "
                f"Diagnosis: {_alignment_diagnosis(ev, form)}")
    verdict = ev.rule.judge([f"align_{kind}_original_float64"], problem,
                            f"{form}'s output at t responds to token t's own key and value")
    return verdict


def _alignment_diagnosis(ev: Evidence, form: str) -> str:
    variant = ev.variant(form)
    found = says(variant, form, "alignment") if variant is not None else None
    if found:
        return found
    return says(Variant(diagonal="hidden"), form) or ""


def check_causality(ev: Evidence) -> Verdict:
    def problem(run: str, tolerance: float) -> str | None:
        changed_run = run.replace("_original_", "_changed_")
        original, changed = ev.y(run), ev.y(changed_run)
        for got in (original, changed):
            if isinstance(got, str):
                return got
        cut = ev.inputs[run].config["cut"]
        rows = inputs.unchanged_rows(original.shape[0])
        before = original[:rows, : cut + 1].astype(np.float64)
        after = changed[:rows, : cut + 1].astype(np.float64)
        diff = np.abs(before - after)
        bound = scaled(tolerance, before)
        if diff.max(initial=0.0) <= bound:
            return None
        b, t, c = (int(i) for i in np.argwhere(diff > bound)[0])
        changed_what = (f"tokens after position {cut}" if rows == original.shape[0] else
                        f"tokens after position {cut} and the batch's last sequence (batch {original.shape[0] - 1})")
        return (f"changing only {changed_what} changed the output at position {t} (batch {b}, "
                f"channel {c}) by {diff[b, t, c]:.3g}; {_leak(ev)} (case {ev.label(run)})")
    names = [f"causal_s{s}_original_float64" for s in inputs.CAUSAL_SHAPES]
    return ev.rule.judge(names, problem,
                         "outputs at or before t ignore every token after t and every other sequence")


def _leak(ev: Evidence) -> str:
    """Why later tokens, or another sequence's, reach earlier outputs: the named mistake forward
    was found to make (a mask without the causal cut, another that lets the future in, a batch
    whose sequences mix), else what the rule is."""
    variant = ev.forward_variant
    found = None
    if variant is not None:
        leaks = variant.future != "hidden" or variant.batch != "own"
        found = says(variant, "forward", "causality" if leaks else None)
    return (f"Diagnosis: {found}" if found else
            "the mask must be 0 where i > t, and no sequence may read another's tokens")


def check_state_resume(ev: Evidence) -> Verdict:
    """A run cut in two workers, the second resuming from the state the first returned, must
    match the student's own run in one worker: this item is about using (S, z), whatever the
    step computes."""
    cut = inputs.RESUME_SEGMENTS[0][1]

    def problem(run: str, tolerance: float) -> str | None:
        whole, split = ev.y(run), ev.y(run.replace("_whole_", "_split_"))
        for got in (whole, split):
            if isinstance(got, str):
                return got
        result = compare(split, whole.astype(np.float64))   # the student's two runs: no trusted value
        if within(result, scaled(tolerance, whole)):
            return None
        if not isinstance(result, Mismatch) or not np.all(np.isfinite(whole)):
            return describe(result if isinstance(result, str) else compare(whole, whole))
        return (f"continuing from the state step returned after token {cut - 1}, in a fresh process on a "
                f"fresh layer, differs from one uninterrupted run: {describe(result, labels=RESUME_LABELS)}. "
                "step must compute "
                "from the (S, z) it is given, not from history kept elsewhere")
    verdict = ev.rule.judge(["resume_whole_float64"], problem, "resuming from a state")
    if verdict.status == "passed":
        return Verdict("passed", "step continues from the state it is given exactly as an uninterrupted run")
    return verdict


def check_state_fixed_size(ev: Evidence, resume: Verdict) -> Verdict:
    """(S, z) keeps one size however many tokens arrive, and it is what step goes on from
    (``resume``): a fixed-size state that step does not use proves nothing. The sizes are
    measured here, on the states exported after 1, 10 and 1000 steps and on those relayed
    between workers; what the student's process reports (how much the layer keeps besides
    its state) can only fail the item."""
    name = ev.ran("state_growth_float64")
    out = ev.output(name)
    if out.status != "ok":
        return Verdict("failed", f"1000 step calls: {out.error or out.status}")
    config = ev.inputs[name].config
    batch, heads = ev.inputs[name].arrays["x"].shape[0], config["num_heads"]
    d = config["embedding_dim"] // heads
    expected_shapes = [[batch, heads, d, d], [batch, heads, d]]
    size = batch * (heads * d * d + heads * d)
    for step in inputs.STATE_CHECKPOINTS:
        shapes = [list(part.shape) for part in _saved_state(out, partial(inputs.checkpoint_output, step))]
        if shapes != expected_shapes:
            held = f"arrays shaped {shapes}" if shapes else "no tensor"
            return Verdict("failed", f"after {step} steps the state step returned is {held}; "
                                     f"expected (S, z) shaped {expected_shapes}")
    relayed = _relayed_state_problem(ev)
    if relayed:
        return Verdict("failed", relayed)
    growth = _reported_growth(out)
    if growth is None:
        return Verdict("failed", "the probe received no report of the tensor data the layer keeps besides its state")
    if len(set(growth)) > 1:
        return Verdict("failed", f"the layer keeps more tensor data as tokens arrive ({growth[0]} values "
                                 f"after 1 step, {growth[-1]} after 1000): step must not store the history; "
                                 "everything it needs must live in the fixed-size (S, z)")
    if resume.status != "passed":
        return not_judged(f"{UNUSED_STATE} ({resume.message})")
    return Verdict("passed", f"(S, z) keeps {size} values after 1, 10 and 1000 steps")


def _saved_state(out: CaseOutput, name: Callable[[int], str]) -> list[np.ndarray]:
    """The tensors of a state a case exported part by part, part i as ``name(i)``."""
    parts = [out.arrays.get(name(i)) for i in range(MAX_STATE_ARRAYS)]
    return parts[: next((i for i, part in enumerate(parts) if part is None), len(parts))]


def _reported_growth(out: CaseOutput) -> list[int] | None:
    """The tensor elements the layer kept besides its state, at each checkpoint, as the
    student's process reported them (None: no such report)."""
    checkpoints = out.info.get("checkpoints")
    entries = [checkpoints.get(str(s)) if isinstance(checkpoints, dict) else None for s in inputs.STATE_CHECKPOINTS]
    growth = [entry.get("retained_growth") if isinstance(entry, dict) else None for entry in entries]
    return growth if all(isinstance(g, int) for g in growth) else None


def _relayed_state_problem(ev: Evidence) -> str | None:
    """The states the harness handed from one worker to the next, measured here. The resume
    run must have handed one on; every segmented run that ran must have handed on (S, z) of
    the right shapes."""
    resume = ev.ran("resume_split_float64")
    if ev.output(resume).status != "ok":
        return f"resuming from a state: {ev.output(resume).error}"
    for name in [resume] + [ev.ran(n) for n in inputs.names("steps")]:
        out, case = ev.output(name), ev.inputs[name]
        batch, heads = case.arrays["x"].shape[0], case.config["num_heads"]
        d = case.config["embedding_dim"] // heads
        expected = [[batch, heads, d, d], [batch, heads, d]]
        for state in out.states if out.status == "ok" else []:
            shapes = [list(part.shape) for part in state]
            if shapes != expected:
                return (f"on case {ev.label(name)} step returned a state of arrays shaped {shapes}; "
                        f"expected (S, z) shaped {expected}")
    return None


# How a message names part i of (S, z), and the axes of each.
STATE_PARTS = (("S", ("batch", "head", "row", "column")), ("z", ("batch", "head", "channel")))


def _state_part(index: int) -> tuple[str, tuple[str, ...] | None]:
    return STATE_PARTS[index] if index < len(STATE_PARTS) else (f"state tensor {index}", None)


def _same(first: np.ndarray | None, second: np.ndarray | None, tolerance: float) -> Mismatch | str | None:
    """How ``second`` differs from ``first``, two arrays of the student's own (None: it does not,
    within ``tolerance`` scaled by ``first``; non-finite entries must match)."""
    if first is None:
        return "no output was produced"
    result = compare_nonfinite_as_expected(second, first.astype(np.float64))
    return None if within(result, tolerance * magnitude(first)) else result


def _contract_state(out: CaseOutput, stage: str) -> list[np.ndarray]:
    """The tensors of the state the state_contract case saved at ``stage``."""
    return _saved_state(out, partial(inputs.state_part_output, stage))


def _mutated_state(out: CaseOutput, tolerance: float) -> str | None:
    """The first state of the chain that changed after step returned it: the object the caller
    kept, read after every step, against the copy taken on return (None: every one is intact)."""
    for t in range(inputs.CONTRACT_TOKENS):
        returned, kept = _contract_state(out, f"returned.{t}"), _contract_state(out, f"kept.{t}")
        if not returned:
            return f"step returned no tensor as its state after token {t}; expected the tuple (S, z)"
        if len(kept) != len(returned):
            return (f"the state step returned after token {t} held {len(returned)} tensors when returned and "
                    f"{len(kept)} after later steps")
        for index, (snapshot, later) in enumerate(zip(returned, kept)):
            found = _same(snapshot, later, tolerance)
            if found is not None:
                part, axes = _state_part(index)
                return (f"the state step returned after token {t}, kept and passed to step again, changed after "
                        f"later steps: {part} differs from its copy taken when step returned it, "
                        f"{describe(found, axes, SNAPSHOT_LABELS)}")
    return None


def _token(y: np.ndarray | None, t: int) -> np.ndarray | None:
    """Token ``t`` of an output (B, T, D), or None when it has none."""
    return y[:, t] if y is not None and y.ndim == 3 and y.shape[1] > t else None


def _replay_problem(out: CaseOutput, tolerance: float) -> str | None:
    """Where stepping again from a kept state gave another result than the first time: token
    CONTRACT_TWICE_FROM + 1 stepped twice from one state, and the tokens after CONTRACT_BACK_TO
    stepped again from the state kept after it (None: both agree)."""
    twice, back, last = inputs.CONTRACT_TWICE_FROM, inputs.CONTRACT_BACK_TO, inputs.CONTRACT_TOKENS - 1
    calls, passes = ("first call", "second call"), ("first pass", "second pass")
    repeated = f"stepping token {twice + 1} twice from the state kept after token {twice}"
    resumed = f"stepping again from the state kept after token {back}"
    compared = [(f"{repeated}, the output", out.arrays.get("twice.0.y"), out.arrays.get("twice.1.y"),
                 ("batch", "channel"), calls)]
    for index, pair in enumerate(zip(_contract_state(out, "twice.0"), _contract_state(out, "twice.1"))):
        part, axes = _state_part(index)
        compared.append((f"{repeated}, the new {part}", *pair, axes, calls))
    chain, again = out.arrays.get("chain.y"), out.arrays.get("again.y")
    for t in range(back + 1, last + 1):
        compared.append((f"{resumed}, the output of token {t}", _token(chain, t), _token(again, t - back - 1),
                         ("batch", "channel"), passes))
    for index, pair in enumerate(zip(_contract_state(out, f"returned.{last}"), _contract_state(out, "again"))):
        part, axes = _state_part(index)
        compared.append((f"{resumed}, the {part} after token {last}", *pair, axes, passes))
    for what, first, second, axes, labels in compared:
        found = _same(first, second, tolerance)
        if found is not None:
            return f"{what}: {describe(found, axes, labels)}"
    return None


def check_state_not_mutated(ev: Evidence) -> Verdict:
    """step leaves the states it is given unchanged. A chain of steps keeps every state step
    returned; each, read again after the later steps (which were given it), must equal the copy
    taken when it was returned. step is compared with itself only, so a step wrong in other
    ways loses nothing here. It counts only for a step that uses the state it is given
    (``Evidence.given_state_ignored``): a state step does not compute from shows nothing by
    staying unchanged. Stepping twice from one saved state and back down the chain shows what a change
    costs; where those disagree on states that did not change, step reads more than
    (x_t, state), which state_resume charges."""
    def problem(run: str, tolerance: float) -> str | None:
        out = ev.output(run)
        if out.status != "ok":
            return f"{RUN_FAILED} (case {ev.label(run)}): {out.error or out.status}"
        mutated = _mutated_state(out, tolerance) or _grader_state_changed(ev, tolerance)
        if mutated is None:
            return None
        replay = _replay_problem(out, tolerance)
        return (f"case {ev.label(run)}: step changed a state in place: {mutated}"
                + (f"; so {replay}" if replay else "")
                + f". Diagnosis: {MUTATED_STATE}")
    ignored = ev.step_not_judged()
    if ignored:
        return ignored
    verdict = ev.rule.judge(["state_contract_float64"], problem, "the states step was given")
    if verdict.status != "passed":
        return verdict
    replay = _replay_problem(ev.output(ev.ran("state_contract_float64")), ev.rule.float32_tolerance)
    said = (f"step left every state it was given unchanged, but {replay}: it computes from more than "
            "(x_t, state) (see state_resume)" if replay else
            "step left every state it was given unchanged; stepping twice from one saved state and again down the "
            "chain gave the same outputs and states")
    return Verdict("passed", f"{said}; {verdict.message}")


def _grader_state_changed(ev: Evidence, tolerance: float) -> str | None:
    """Whether the (S, z) the grader built and handed to step changed during the call, read
    byte for byte after it (None: unchanged, or step could not run from it: then the chain of
    its own states decides alone)."""
    run = ev.ran("grader_state_float64")
    out = ev.output(run)
    if out.status != "ok":
        return None
    for index, after in enumerate(_saved_state(out, partial(inputs.state_part_output, "given_after"))):
        given = ev.inputs[run].arrays[f"given.{index}"]
        found = _same(given, after, tolerance)
        if found is not None:
            part, axes = _state_part(index)
            return (f"the state the grader built and handed to step changed during the call: {part} "
                    f"{describe(found, axes, ('handed in', 'after the call'))}")
    return None


def needing(forms: tuple[str, ...], check: Callable[[Evidence], Verdict]) -> Callable[[Evidence], Verdict]:
    """``check``, unless a form it needs raised on every case: then that, said plainly."""
    def decided(ev: Evidence) -> Verdict:
        said = [f"{found}; every item that needs {form} is 0 for that reason"
                for form, found in ((form, ev.raised(form)) for form in forms) if found]
        return Verdict("failed", "; ".join(said)) if said else check(ev)
    return decided


# The forms each item runs: a form that raised everywhere costs exactly these items.
NEEDS = {"equivalence": ("forward", "step"), "normalization": ("forward",), "alignment": ("forward", "step"),
         "causality": ("forward",), "decay_parallel": ("forward",), "decay_recurrent": ("step",),
         "decay_per_head": ("forward", "step"), "state_fixed_size": ("step",), "state_resume": ("step",),
         "state_not_mutated": ("step",), "hybrid_lm": ("forward",)}

SCAFFOLD_CHECKS: dict[str, Callable[[Evidence], Verdict]] = {name: needing(NEEDS[name], check) for name, check in {
    "equivalence": check_equivalence,
    "normalization": check_normalization,
    "alignment": check_alignment,
    "causality": check_causality,
    "decay_parallel": check_decay_parallel,
    "decay_recurrent": check_decay_recurrent,
    "decay_per_head": check_decay_per_head,
    "state_fixed_size": lambda ev: check_state_fixed_size(ev, check_state_resume(ev)),
    "state_resume": check_state_resume,
    "state_not_mutated": check_state_not_mutated,
}.items()}
