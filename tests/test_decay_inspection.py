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
from grader.checks.linear_attention.cases import GRADING_RUN_CASE
from grader.checks.linear_attention.decay_inspection import DECAY_ITEMS
from grader.probe import ProbeResult

from probe_in_process import assert_measured_both_ways, exercise_probe, exercise_verdicts, scaffold_probe

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


# Honest at the grader's sizes, wrong at the notebook's: halved norms for 512 tokens, and a fixed
# 0.9 for models that were trained (their parameters hold gradients; the grader's own are fresh).
ONLY_AT_THE_NOTEBOOKS_SIZES = '''

def state_norms(layer, inputs, logits):
    found = _honest_state_norms(layer, inputs, logits)
    if inputs.shape[1] >= 512:
        return {label: [value / 2 for value in norms] for label, norms in found.items()}
    return found


def learned_decays(models):
    found = _honest_learned_decays(models)
    if any(p.grad is not None for model in models.values() for p in model.parameters()):
        return {name: [[0.9] * len(row) for row in rows] for name, rows in found.items()}
    return found
'''


def test_functions_honest_only_at_the_graders_sizes_lose_their_items_in_the_grading_run(assignment):
    """Exercise 4's functions called as the notebook's run cell calls them, in the grading run:
    a cheat that answers right on the grader's own layer and models loses both items there, with
    the reason; every correct cell keeps both."""
    honest = next(cells.source(c) for c in assignment.master.cells if c.id == "ex4-decay").replace(
        "def state_norms(", "def _honest_state_norms(").replace("def learned_decays(", "def _honest_learned_decays(")
    cheat = scaffold_probe(assignment, {"state_norms": honest + ONLY_AT_THE_NOTEBOOKS_SIZES}, (*CASES, GRADING_RUN_CASE))
    alone = ProbeResult(cheat.import_status, cheat.import_error,
                        {k: v for k, v in cheat.cases.items() if k != GRADING_RUN_CASE})
    assert {v.status for v in verdicts_of(assignment, alone).values()} == {"passed"}   # the cheat hides there
    caught = verdicts_of(assignment, cheat)
    for item, words in ((NORMS, "state_norms['50'] after 1, 8, 64, 128, 256, 512 tokens is"),
                        (LEARNED, "learned_decays['all_linear'] of the trained model is")):
        print(f"\n{item}: {caught[item].message[:220]}")
        assert caught[item].status == "failed", caught[item].message
        assert "in the grader's run of the notebook's Exercise 4 cell" in caught[item].message and \
            words in caught[item].message, caught[item].message
    kept = {path.stem: verdicts_of(assignment, scaffold_probe(assignment, {"state_norms": path.read_text()},
                                                              (*CASES, GRADING_RUN_CASE)))
            for path in sorted(CELLS.glob("correct_*.py"))}
    print(f"correct Exercise 4 cells keeping both items beside the grading run: "
          f"{sum(all(v.status == 'passed' for v in found.values()) for found in kept.values())} of {len(kept)}")
    assert all(v.status == "passed" for found in kept.values() for v in found.values()), kept
