"""Exercise 2 judged by calling train_and_compare on the grader's token streams, sizes and budget
(grader/checks/linear_attention/training.py).

The corpus of tests/trainings/ (see its README) runs through the probe harness's own case code
in this process with the master's LinearAttention: every ``correct_*`` cell earns the three
items, every ``mistake_*`` cell loses exactly the items listed here, with a message that says
what the models were given.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import cells
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention as checks
from grader.checks.linear_attention.training import TRAINING_ITEMS
from grader.graft import submission_module_source

from conftest import SCAFFOLDS, as_scaffolds, scaffold_cell
from probe_in_process import assert_measured_both_ways, exercise_probe, exercise_verdicts, probe_in_process

CELLS = Path(__file__).parent / "trainings"
SAME, HELD_OUT, PARAMETERS = TRAINING_ITEMS
# A mistake -> the items it loses, each with words its message must hold.
MISTAKES = {
    "mistake_seed_per_pattern": {SAME: "all_linear's training batch 1 differs from all_full's"},
    "mistake_eval_on_train": {HELD_OUT: "all_full was evaluated on windows of the training split"},
    "mistake_more_steps_for_linear": {SAME: "all_linear ran 6 training forward passes (with gradients); the budget "
                                            "given has 3 steps"},
    "mistake_module_sizes": {PARAMETERS: "built from the config given it has"},
    "mistake_matrices_counted": {PARAMETERS: "results['all_full']['parameters'] ="},
    # Issue 41: the budget's sequence of batches under one optimizer and schedule.
    "mistake_train_lm_per_step": {SAME: "all_full's training batch 2 is the seed's first batch again"},
    "mistake_optimizer_per_step": {SAME: "all_full was trained by 3 optimizers and 3 schedules"},
    "mistake_generator_seeded_per_step": {SAME: "all_full's training batch 2 is not draw 2 of get_batch"},
    "mistake_peek_batch_first": {SAME: "all_full's training batch 1 is draw 2 of the seed's generator, not draw 1"},
}
CORRECT = sorted(p.stem for p in CELLS.glob("correct_*.py"))


def verdicts_of(assignment, cell: str | None) -> dict[str, Verdict]:
    return exercise_verdicts(assignment, exercise_probe(assignment, "train_and_compare", cell, ("training",)),
                             TRAINING_ITEMS)


@pytest.fixture(scope="module")
def graded(assignment) -> dict[str, dict[str, Verdict]]:
    return {path.stem: verdicts_of(assignment, path.read_text()) for path in sorted(CELLS.glob("*.py"))}


def test_the_corpus_is_measured_both_ways(graded):
    assert_measured_both_ways(graded, CORRECT, {name: set(lost) for name, lost in MISTAKES.items()}, "Exercise 2")


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_is_said_on_its_items(graded, name):
    for item, words in MISTAKES[name].items():
        assert graded[name][item].status == "failed" and words in graded[name][item].message, graded[name][item].message


def test_an_exercise_left_undone_or_missing_fails_with_the_reason(assignment):
    missing = verdicts_of(assignment, None)
    assert all(v.status == "failed" and "train_and_compare is not defined" in v.message for v in missing.values())
    todo = next(cells.source(c) for c in assignment.template.cells if c.id == "ex2-train")
    undone = verdicts_of(assignment, todo)
    assert all(v.status == "failed" and "raised NotImplementedError: TODO" in v.message for v in undone.values()), undone


@pytest.mark.parametrize("mutant, status", [("mutant_forward_not_implemented", "error"),
                                            ("mutant_future_mask", "passed"), ("mutant_nan_output", "passed")])
def test_a_layer_bug_never_costs_exercise_2(assignment, mutant, status):
    """The layer's items charge its bugs: a forward that raises stops the training (not judged);
    one that computes wrong numbers, even NaN, trains on the same batches all the same."""
    layer = scaffold_cell(assignment.master, (SCAFFOLDS / f"{mutant}.py").read_text())
    source, _ = submission_module_source(assignment.master, as_scaffolds(assignment.master, layer))
    probe = probe_in_process(source, [c for c in checks.probe_cases(assignment.rubric) if c.name == "training"],
                             checks.PROBE_DRIVER)
    verdicts = checks.evaluate(CheckContext(assignment.rubric, assignment.master_path, probe, None, None,
                                            "not executed in this test"))
    assert {verdicts[item].status for item in TRAINING_ITEMS} == {status}, {i: verdicts[i].message for i in TRAINING_ITEMS}
    if status == "error":
        assert all("not judged: train_and_compare stopped when a model's forward raised" in verdicts[i].message
                   for i in TRAINING_ITEMS)
