"""Exercise 4's method: ``state_norms`` and ``learned_decays`` called by the probe on layers,
tokens and models of the grader's (``probe_driver.case_decay_norms`` and ``case_learned_decays``).

``decay_state_norms``: for each decay logit given, the layer given was stepped through the
tokens given, from a fresh state, with its gamma_logit set to that value, and the norms returned
are ||S||_F of the states step returned, recomputed here from the states the probe recorded. The
norms are those of the student's own step, so a mistake in step is the layer items' concern,
never this one's. ``decay_learned``: the decays returned are sigmoid of the logits the grader put
in each linear layer, bottom to top, for every model given.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict
from grader.checks.linear_attention.cases import (DECAY_NORMS, GRADING_RUN, LEARNED_DECAYS, learned_logits,
                                                  probe_cases)
from grader.checks.linear_attention.items import exercise_run, not_judged
from grader.checks.linear_attention.observed import observed_decays
from grader.checks.linear_attention.training import also_in_grading_run, grading_run_output, in_grading_run

DECAY_ITEMS = ("decay_state_norms", "decay_learned")
# Norms and decays are computed in float32 by the student's code and in float64 here from the
# same float32 tensors: they agree to about 1e-7 relative; a wrong quantity is off by far more.
RTOL = 1e-4


def decay_checks(context: CheckContext) -> dict[str, Callable[[], Verdict]]:
    return {"decay_state_norms": lambda: also_in_grading_run(judge_state_norms(context),
                                                             grading_run_norms_problem(context)),
            "decay_learned": lambda: also_in_grading_run(judge_learned_decays(context),
                                                         grading_run_learned_problem(context))}


def _run_cell_record(context: CheckContext) -> dict[str, Any]:
    """What the grading run's Exercise 4 run cell got back from the two functions ({} without it)."""
    run = grading_run_output(context)
    record = run[0].get("decay") if run is not None else None
    return record if isinstance(record, dict) else {}


def grading_run_norms_problem(context: CheckContext) -> str | None:
    """state_norms as the notebook's run cell calls it, at its sizes (512 tokens, its logits): the
    norms it returns at the printed token counts are those of the layer's own steps from a fresh
    state, which the grader measured in the same run (None: they are, or there is nothing to
    compare)."""
    figures = observed_decays(context)
    record = _run_cell_record(context)
    if figures is None or figures[0] is None or not record:
        return None
    where = f"{in_grading_run('Exercise 4')}, "
    if "state_norms_error" in record:
        return f"{where}state_norms raised: {record['state_norms_error']}"
    returned = record.get("state_norms")
    positions = GRADING_RUN["norms"]["positions"]
    for label, measured in figures[0].items():
        got = (returned or {}).get(label)
        expected = [measured[n] for n in positions]
        if got is None or not np.allclose(got, expected, rtol=RTOL, atol=0):
            return (f"{where}state_norms[{label!r}] after {', '.join(map(str, positions))} tokens is "
                    f"{_rounded([got])[0] if got else _kind(got)}; the layer's own steps from a fresh state give "
                    f"{_rounded([expected])[0]}, though the grader's own call of the function agreed: compute the "
                    "norms the same way however many tokens and settings you are given")
    return None


def grading_run_learned_problem(context: CheckContext) -> str | None:
    """learned_decays on the Exercise 2 models, as the notebook's run cell calls it: sigmoid of each
    trained linear layer's gamma_logit, bottom to top (None: so, or nothing to compare)."""
    figures = observed_decays(context)
    record = _run_cell_record(context)
    if figures is None or figures[1] is None or not record:
        return None
    where = f"{in_grading_run('Exercise 4')}, "
    if "learned_decays_error" in record:
        return f"{where}learned_decays raised: {record['learned_decays_error']}"
    returned = record.get("learned_decays") or {}
    for name, expected in figures[1].items():
        got = returned.get(name)
        if got is None or [len(row or []) for row in got] != [len(row) for row in expected] or not all(
                np.allclose(g, e, rtol=RTOL, atol=0) for g, e in zip(got, expected)):
            return (f"{where}learned_decays[{name!r}] of the trained model is {_rounded(got) if got else _kind(got)}; "
                    f"its linear layers hold the decays {_rounded(expected)}, bottom to top, though the grader's own "
                    "call of the function agreed: read each model's own gamma_logit")
    return None


def judge_state_norms(context: CheckContext) -> Verdict:
    info, decided = exercise_run(context, "decay_norms", "state_norms", "inputs",
                                 "state_norms stopped when your {raised_in}")
    if decided:
        return decided
    out = context.probe.cases["decay_norms"]
    tokens, logits = DECAY_NORMS["tokens"], DECAY_NORMS["logits"]
    steps = info.get("steps") or []
    x = next(c for c in probe_cases() if c.name == "decay_norms").arrays["x"]   # the tokens it was given
    returned = info.get("returned")
    if not isinstance(returned, dict) or any(not isinstance(returned.get(label), list) for label in logits):
        return Verdict("failed", f"state_norms returned {_kind(returned)}; expected {{label: [one norm per token]}} "
                                 f"with every label it was given ({', '.join(logits)})")
    for label, value in logits.items():
        mine = [n for n, step in enumerate(steps)
                if step["logits"] and np.allclose(step["logits"], value, rtol=0, atol=1e-6)]
        if not mine:
            seen = sorted({round(v, 4) for step in steps for v in step["logits"]})
            return Verdict("failed", f"no step of the layer given ran with gamma_logit = {value} (label {label!r}); "
                                     f"the steps ran with {seen or 'nothing: step was never called'}. Set the logit "
                                     "on the layer you are given (layer.gamma_logit.fill_(value)) before stepping")
        if len(mine) != tokens:
            return Verdict("failed", f"with gamma_logit = {value}, the layer given ran {len(mine)} steps for "
                                     f"{tokens} tokens: step each token once")
        if steps[mine[0]]["given"] not in ("none", "zeros"):
            return Verdict("failed", f"with gamma_logit = {value}, the first step was given "
                                     + ("the state the previous setting ended with" if steps[mine[0]]["given"] ==
                                        "returned" else "a state that is neither None nor zeros")
                                     + ": start each setting from a fresh state (None)")
        if any(steps[n]["given"] != "returned" for n in mine[1:]):
            return Verdict("failed", f"with gamma_logit = {value}, a step was not given the state the step before "
                                     "returned: carry the state from token to token")
        given = np.stack([out.arrays[f"step.{n}.x"][0] for n in mine])
        if given.shape != x[0].shape or not np.allclose(given, x[0], rtol=0, atol=1e-6):
            return Verdict("failed", f"with gamma_logit = {value}, the steps were given other tokens than the inputs "
                                     "passed in: use the same inputs, in order, for every setting")
        if not all(steps[n]["state"] for n in mine):
            return not_judged("step did not return its state as (S, z), so there is no S to take the norm of; "
                              "the state items judge it")
        got = returned[label]
        if got is None or len(got) != tokens:
            return Verdict("failed", f"state_norms[{label!r}] holds {_kind(got)}; expected {tokens} norms, one after "
                                     "each token")
        states = [(out.arrays[f"step.{n}.S"].astype(np.float64), out.arrays[f"step.{n}.z"].astype(np.float64))
                  for n in mine]
        expected = np.array([np.linalg.norm(S) for S, _ in states])
        if not np.allclose(got, expected, rtol=RTOL, atol=0):
            t = int(np.argmax(~np.isclose(got, expected, rtol=RTOL, atol=0)))
            said = _diagnosis(np.array(got), states)
            return Verdict("failed", f"state_norms[{label!r}][{t}] = {got[t]:.6g}; ||S||_F of the state your step "
                                     f"returned after token {t + 1} is {expected[t]:.6g}"
                                     + (f". Diagnosis: {said}" if said else ""))
    return Verdict("passed", f"for each gamma_logit given ({', '.join(map(str, logits.values()))}) the layer given "
                             f"stepped through the {tokens} tokens given from a fresh state, and the norms returned "
                             "are ||S||_F (all heads together) of the states it returned")


# Other quantities students record, and what the returned norms then equal.
def _diagnosis(got: np.ndarray, states: list[tuple[np.ndarray, np.ndarray]]) -> str | None:
    S = [s for s, _ in states]
    candidates = {
        "the norm of the normalizer z, not of S": [np.linalg.norm(z) for _, z in states],
        "the norm of one head's S, not of all heads together": [np.linalg.norm(s[0, 0]) for s in S],
        "the mean of the heads' norms, not the norm of all heads together":
            [np.mean([np.linalg.norm(h) for h in s[0]]) for s in S],
        "the squared norm": [np.linalg.norm(s) ** 2 for s in S],
        "the norm before each token's write (one token late)": [0.0] + [np.linalg.norm(s) for s in S[:-1]],
    }
    return next((said for said, values in candidates.items() if np.allclose(got, values, rtol=RTOL, atol=1e-6)),
                None)


def judge_learned_decays(context: CheckContext) -> Verdict:
    info, decided = exercise_run(context, "learned_decays", "learned_decays", "inputs",
                                 "learned_decays stopped when your {raised_in}")
    if decided:
        return decided
    returned = info.get("returned")
    if not isinstance(returned, dict):
        return Verdict("failed", f"learned_decays returned {info.get('type', 'nothing')}; expected {{pattern "
                                 "name: [[one decay per head] for each linear layer, bottom to top]}")
    logits = learned_logits()
    for name, pattern in LEARNED_DECAYS["patterns"].items():
        layers = [logits[f"logits.{name}.{i}"] for i in range(pattern.count("linear"))]
        expected = [1 / (1 + np.exp(-layer)) for layer in layers]
        got = returned.get(name)
        if got is None or any(row is None for row in got):
            return Verdict("failed", f"learned_decays[{name!r}] is {_kind(got)}; expected {len(expected)} lists of "
                                     f"{LEARNED_DECAYS['num_heads']} decays, one per linear layer"
                                     + (" (an empty list for a model without linear layers)" if not expected else ""))
        if [len(row) for row in got] == [len(row) for row in expected] and all(
                np.allclose(g, e, rtol=RTOL, atol=0) for g, e in zip(got, expected)):
            continue
        said = _decays_diagnosis(got, layers, pattern)
        return Verdict("failed", f"learned_decays[{name!r}] = {_rounded(got)}; the model given has the decays "
                                 f"{_rounded(expected)} in its linear layers, bottom to top"
                                 + (f". Diagnosis: {said}" if said else ""))
    return Verdict("passed", "for every model given, the decays returned are sigmoid(gamma_logit) of each linear "
                             "layer, bottom to top")


def _decays_diagnosis(got: list, layers: list[np.ndarray], pattern: list[str]) -> str | None:
    def same(candidate: list) -> bool:
        return ([len(row) for row in got] == [len(row) for row in candidate]
                and all(np.allclose(g, c, rtol=RTOL, atol=1e-9) for g, c in zip(got, candidate)))
    decays = [1 / (1 + np.exp(-layer)) for layer in layers]
    if same(layers):
        return "these are the raw gamma_logit values; the decay is sigmoid(gamma_logit)"
    if same(decays[::-1]):
        return "the layers are listed top to bottom; list them bottom to top"
    if len(got) == len(pattern) and len(got) > len(decays):
        return "every layer is listed, the full-attention ones too; list the linear layers only"
    return None


def _rounded(rows: Any) -> Any:
    return [[round(float(v), 4) for v in row] for row in rows] if isinstance(rows, list) else rows


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "nothing" if value is None else f"a {type(value).__name__}"
