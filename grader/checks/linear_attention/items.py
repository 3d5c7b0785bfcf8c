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
from functools import cached_property, partial
from typing import Any, Callable

import numpy as np
import torch

from grader.checks import CheckContext, Verdict
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
    expected = (ev.forward_variant or REFERENCE).put_right("normalization")
    return ev.outputs_item("forward", inputs.names("forward", ("none",)), expected, "normalization",
                           "forward at gamma = 1 vs the normalized reference")


def check_decay_parallel(ev: Evidence) -> Verdict:
    """forward's decay under every setting: gamma = 1 too (a decay clamped below 1 shows there only)."""
    expected = (ev.forward_variant or REFERENCE).put_right("decay")
    return ev.outputs_item("forward", inputs.names("forward"), expected, "decay",
                           "forward with decay vs the reference")


def check_decay_recurrent(ev: Evidence) -> Verdict:
    """The decay of the state step builds, under every setting as in ``check_decay_parallel``."""
    expected = (ev.step_variant or REFERENCE).put_right("decay")
    return ev.state_item(inputs.names("steps"), expected, "decay",
                         "the state step builds with decay vs the reference")


def check_decay_per_head(ev: Evidence) -> Verdict:
    """Each head its own decay, in every form that applies one (a form without any decay has
    lost the decay items already)."""
    judged = []
    forward, step = ev.forward_variant, ev.step_variant
    if forward is None or forward.applies_decay:
        judged.append(ev.outputs_item("forward", inputs.names("forward", ("per_head",)),
                                      (forward or REFERENCE).put_right("heads"), "heads",
                                      "forward with a different decay per head"))
    if step is None or step.applies_decay:
        judged.append(ev.state_item(inputs.names("steps", ("per_head",)), (step or REFERENCE).put_right("heads"),
                                    "heads", "the state step builds with a different decay per head"))
    if not judged:
        return not_judged("neither form applies a decay, so no per-head decay can be seen "
                          "(see decay_parallel and decay_recurrent)")
    problem = _decay_property_problem(ev)
    if problem:
        judged.append(Verdict("failed", problem))
    return _all_of(judged)


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
    """A token's output includes its own key and value, in both forms. The step form counts
    only with a state that is really the tokens' (S, z): any other way of computing the first
    outputs proves nothing about the recurrence."""
    forward, step = ev.forward_variant, ev.step_variant
    if forward is not None:
        forward_verdict = ev.outputs_item("forward", inputs.names("forward"), forward.put_right("alignment"),
                                          "alignment", "forward includes token t in out_t")
    else:
        forward_verdict = _first_token_item(ev, "forward")
    state_problem = ev.real_state_problem()
    if state_problem:
        step_verdict = _unusable_state(state_problem, "step's part, because")
    elif step is not None:
        step_verdict = ev.outputs_item("step", inputs.names("steps"), step.put_right("alignment"), "alignment",
                                       "step includes token t in its output", first_segment=True)
    else:
        step_verdict = _first_token_item(ev, "step")
    return _all_of([forward_verdict, step_verdict])


def _unusable_state(state_problem: str, judged: str) -> Verdict:
    """An item that reads step's state when that state is not the tokens' (S, z): failed when
    step could not run (the run is the item's evidence, and it failed), else not judged."""
    if RUN_FAILED in state_problem:
        return Verdict("failed", f"step {state_problem}")
    return not_judged(f"{judged} the state step returned is not the (S, z) of the tokens it was given "
                      f"({state_problem})")


def _first_token_item(ev: Evidence, form: str) -> Verdict:
    """For a form that matches no named computation: its first output depends on token 0
    alone and must be out_proj(c * v_0) with c > 0, whatever else the form does."""
    def problem(run: str, tolerance: float) -> str | None:
        got = ev.y(run)
        if isinstance(got, str):
            return got
        case = ev.inputs[run]
        arrays, heads = case.arrays, case.config["num_heads"]
        if not np.all(np.isfinite(got[:, 0])):
            return f"first token of case {ev.label(run)}: the output is not finite"
        y0 = got[:, 0].astype(np.float64)
        inside = np.linalg.solve(arrays["out_proj.weight"], (y0 - arrays["out_proj.bias"]).T).T
        v0 = case.arrays["x"][:, 0] @ arrays["v_proj.weight"].T + arrays["v_proj.bias"]
        batch = v0.shape[0]
        u, v = inside.reshape(batch, heads, -1), v0.reshape(batch, heads, -1)
        coefficient = (u * v).sum(-1) / (v * v).sum(-1)
        residual = np.abs(u - coefficient[..., None] * v).max()
        if residual > 1e-4 * (1 + np.abs(v).max()) or coefficient.min() <= 1e-3:
            hint = (says(Variant(diagonal="hidden"), form) if np.abs(u).max() < 1e-6 * (1 + np.abs(v).max())
                    else "the first token's output is not a multiple of its own value vector")
            return f"first token of case {ev.label(run)}: {hint}"
        return None
    return ev.rule.judge(inputs.names(FORM_KIND[form]), problem, f"{form}'s first output is its own value")


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
    ways loses nothing here. It counts only with a state that is really the tokens' (S, z), as
    in ``check_alignment``: a state step does not compute from shows nothing by staying
    unchanged. Stepping twice from one saved state and back down the chain shows what a change
    costs; where those disagree on states that did not change, step reads more than
    (x_t, state), which state_resume charges."""
    state_problem = ev.real_state_problem()
    if state_problem:
        return _unusable_state(state_problem, "a state staying unchanged shows nothing when")

    def problem(run: str, tolerance: float) -> str | None:
        out = ev.output(run)
        if out.status != "ok":
            return f"{RUN_FAILED} (case {ev.label(run)}): {out.error or out.status}"
        mutated = _mutated_state(out, tolerance)
        if mutated is None:
            return None
        replay = _replay_problem(out, tolerance)
        return (f"case {ev.label(run)}: step changed a state in place: {mutated}"
                + (f"; so {replay}" if replay else "")
                + f". Diagnosis: {MUTATED_STATE}")
    verdict = ev.rule.judge(["state_contract_float64"], problem, "the states step was given")
    if verdict.status != "passed":
        return verdict
    replay = _replay_problem(ev.output(ev.ran("state_contract_float64")), ev.rule.float32_tolerance)
    said = (f"step left every state it was given unchanged, but {replay}: it computes from more than "
            "(x_t, state) (see state_resume)" if replay else
            "step left every state it was given unchanged; stepping twice from one saved state and again down the "
            "chain gave the same outputs and states")
    return Verdict("passed", f"{said}; {verdict.message}")


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
