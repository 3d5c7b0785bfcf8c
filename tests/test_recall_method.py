"""Exercise 3 judged by calling train_recall with the grader's seed and budget, and recall_accuracy
on the grader's model and queries (grader/checks/linear_attention/recall.py).

The corpus of tests/recalls/ (see its README) runs through the probe harness's own case code in
this process with the master's LinearAttention: every ``correct_*`` cell earns the three items,
every ``mistake_*`` cell loses exactly the items listed here, with a message that says what its
models were trained on or what its scoring returned.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import cells
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention as checks
from grader.checks.linear_attention.recall import RECALL_ITEMS, scorings
from grader.graft import submission_module_source

from conftest import SCAFFOLDS, as_scaffolds, scaffold_cell
from probe_in_process import assert_measured_both_ways, exercise_probe, exercise_verdicts, probe_in_process

CELLS = Path(__file__).parent / "recalls"
CASES = ("recall_training", "recall_scoring")
BATCHES, LOSS, SCORING = RECALL_ITEMS
# A mistake -> the items it loses, each with words its message must hold.
MISTAKES = {
    "mistake_generator_kept_per_seed": {BATCHES: "all_linear's training batch 1 is draw 4 of the seed's generator, "
                                                 "not draw 1"},
    "mistake_global_generator": {BATCHES: "all_full's training batch 1 is not draw 1 of recall_batch"},
    "mistake_shifted_loss": {LOSS: "reached position 23 of row 0, which are not queries (the queries are positions "
                                   "24 to 35; the pairs are random) (the logits shifted one position"},
    "mistake_values_in_stored_order": {LOSS: "the loss at query position 24 (key 26) pulls up token 58; the value "
                                             "stored with that key is 50"},
    "mistake_scored_one_early": {SCORING: "(the predictions one position early"},
    "mistake_buckets_by_query_order": {SCORING: "(bucketed by query order, not by distance?)"},
}
CORRECT = sorted(p.stem for p in CELLS.glob("correct_*.py"))


def verdicts_of(assignment, cell: str | None) -> dict[str, Verdict]:
    return exercise_verdicts(assignment, exercise_probe(assignment, "train_recall", cell, CASES), RECALL_ITEMS)


@pytest.fixture(scope="module")
def graded(assignment) -> dict[str, dict[str, Verdict]]:
    return {path.stem: verdicts_of(assignment, path.read_text()) for path in sorted(CELLS.glob("*.py"))}


def test_the_corpus_is_measured_both_ways(graded):
    assert_measured_both_ways(graded, CORRECT, {name: set(lost) for name, lost in MISTAKES.items()}, "Exercise 3")


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_is_said_on_its_items(graded, name):
    for item, words in MISTAKES[name].items():
        assert graded[name][item].status == "failed" and words in graded[name][item].message, graded[name][item].message


def test_the_grader_queries_tell_every_named_scoring_mistake_from_the_right_one():
    right, *mistakes = scorings().values()
    assert all(mistake[0] != right[0] for mistake in mistakes)
    assert len(set(right[0])) > 6, "accuracy varies with distance, so an order mixed up shows"


def test_an_exercise_left_undone_or_missing_fails_with_the_reason(assignment):
    missing = verdicts_of(assignment, None)
    assert all(v.status == "failed" and " is not defined" in v.message for v in missing.values()), missing
    todo = next(cells.source(c) for c in assignment.template.cells if c.id == "ex3-recall")
    undone = verdicts_of(assignment, todo)
    assert all(v.status == "failed" and "raised NotImplementedError: TODO" in v.message for v in undone.values()), undone


@pytest.mark.parametrize("returned, words", [
    ('{"accuracy": "high", "overall_accuracy": 1.0}', "expected {'accuracy': [12 shares"),
    ('{"accuracy": [float("nan")] * 12, "overall_accuracy": 0.5}', "recall_accuracy returned accuracy [nan"),
    ('[0.5] * 12', "recall_accuracy returned list"),
    ('{"accuracy": [1.0] * 12, "overall_accuracy": 1.0}', "the grader's scoring of the same answers gives"),
])
def test_a_scoring_that_returns_something_else_fails_on_its_item(assignment, returned, words):
    """Reported numbers pass nothing: only the grader's own scoring of the model's answers does."""
    master = next(cells.source(c) for c in assignment.master.cells if c.id == "ex3-recall")
    cell = master[:master.index("def recall_accuracy")] + (
        f"def recall_accuracy(model, tokens, answers, distances):\n    model(tokens)\n    return {returned}\n")
    verdict = verdicts_of(assignment, cell)[SCORING]
    assert verdict.status == "failed" and words in verdict.message, verdict.message


def test_a_layer_bug_never_costs_exercise_3(assignment):
    """A forward that raises stops the training (not judged, the layer's items charge it); the
    scoring runs on the grader's model and is judged all the same."""
    layer = scaffold_cell(assignment.master, (SCAFFOLDS / "mutant_forward_not_implemented.py").read_text())
    source, _ = submission_module_source(assignment.master, as_scaffolds(assignment.master, layer))
    probe = probe_in_process(source, [c for c in checks.probe_cases(assignment.rubric) if c.name in CASES],
                             checks.PROBE_DRIVER)
    verdicts = checks.evaluate(CheckContext(assignment.rubric, assignment.master_path, probe, None, None,
                                            "not executed in this test"))
    for item in (BATCHES, LOSS):
        assert verdicts[item].status == "error" and "not judged: train_recall stopped when a model's forward raised" \
            in verdicts[item].message, verdicts[item].message
    assert verdicts[SCORING].status == "passed", verdicts[SCORING].message


def test_a_scoring_that_never_asks_the_model_fails(assignment):
    master = next(cells.source(c) for c in assignment.master.cells if c.id == "ex3-recall")
    right = scorings()["right"]
    cell = master[:master.index("def recall_accuracy")] + (
        "def recall_accuracy(model, tokens, answers, distances):\n"
        f"    return {{'accuracy': {right[0]!r}, 'overall_accuracy': {right[1]!r}}}\n")
    verdict = verdicts_of(assignment, cell)[SCORING]
    assert verdict.status == "failed" and "never ran the model it was given" in verdict.message, verdict.message
