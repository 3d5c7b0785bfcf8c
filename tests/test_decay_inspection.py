"""Exercise 4 judged by calling its functions on the grader's layer, tokens and models
(grader/checks/linear_attention/decay_inspection.py).

The corpus of tests/decay_inspections/ (see its README) runs through the probe harness's own
case code in this process with the master's LinearAttention: every ``correct_*`` cell earns both
items, every ``mistake_*`` cell loses exactly the item listed here, with a message that names
what it recorded.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import cells
from grader.checks import Verdict
from grader.checks.linear_attention.decay_inspection import DECAY_ITEMS
from grader.probe import ProbeResult

from probe_in_process import assert_measured_both_ways, exercise_probe, exercise_verdicts

CELLS = Path(__file__).parent / "decay_inspections"
NORMS, LEARNED = DECAY_ITEMS
# A mistake -> the item it loses and words its message must hold.
MISTAKES = {
    "mistake_norm_of_z": (NORMS, "Diagnosis: the norm of the normalizer z, not of S"),
    "mistake_mean_head_norm": (NORMS, "Diagnosis: the mean of the heads' norms, not the norm of all heads together"),
    "mistake_state_carried_over": (NORMS, "with gamma_logit = 2.5, the first step was given the state the previous "
                                          "setting ended with"),
    "mistake_state_not_carried": (NORMS, "a step was not given the state the step before returned"),
    "mistake_own_inputs": (NORMS, "the steps were given other tokens than the inputs passed in"),
    "mistake_raw_logits": (LEARNED, "Diagnosis: these are the raw gamma_logit values"),
    "mistake_top_to_bottom": (LEARNED, "Diagnosis: the layers are listed top to bottom"),
}
CORRECT = sorted(p.stem for p in CELLS.glob("correct_*.py"))
CASES = ("decay_norms", "learned_decays")


def verdicts_of(assignment, probe: ProbeResult) -> dict[str, Verdict]:
    return exercise_verdicts(assignment, probe, DECAY_ITEMS)


@pytest.fixture(scope="module")
def graded(assignment) -> dict[str, dict[str, Verdict]]:
    return {path.stem: verdicts_of(assignment, exercise_probe(assignment, "state_norms", path.read_text(), CASES))
            for path in sorted(CELLS.glob("*.py"))}


def test_the_corpus_is_measured_both_ways(graded):
    assert_measured_both_ways(graded, CORRECT, {name: {item} for name, (item, _) in MISTAKES.items()}, "Exercise 4")


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_is_named_on_its_item(graded, name):
    item, words = MISTAKES[name]
    assert graded[name][item].status == "failed" and words in graded[name][item].message, graded[name][item].message


def test_an_exercise_left_undone_or_missing_fails_with_the_reason(assignment):
    missing = verdicts_of(assignment, exercise_probe(assignment, "state_norms", None, CASES))
    assert {v.status for v in missing.values()} == {"failed"}
    assert "state_norms is not defined" in missing[NORMS].message
    assert "learned_decays is not defined" in missing[LEARNED].message
    todo = next(cells.source(c) for c in assignment.template.cells if c.id == "ex4-decay")
    undone = verdicts_of(assignment, exercise_probe(assignment, "state_norms", todo, CASES))
    assert {v.status for v in undone.values()} == {"failed"}
    assert all("raised NotImplementedError: TODO" in v.message for v in undone.values()), undone
