"""Every assignment's TA-scored calibration set (rubrics/<name>_calibration.yaml): it loads,
covers every written question and every criterion with answers of varied quality, and
`grader calibrate` runs on it against the local stand-in for the Anthropic API
(tests/llm_server.py, whose default rule gives every criterion its full points)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grader.assignment import Assignment
from grader.cli import main
from grader.rubric import RubricError
from grader.written.calibrate import Sample, load_samples

from conftest import ROOT
from test_written import api, server  # noqa: F401  (the local API's fixtures)

ASSIGNMENTS = sorted(p.stem for p in (ROOT / "rubrics").glob("*.yaml") if not p.stem.endswith("_calibration"))
MIN_SAMPLES = 3   # TA-scored answers per question, besides the reference


def calibration_set(name: str) -> Path:
    return ROOT / "rubrics" / f"{name}_calibration.yaml"


def ta_samples(name: str) -> tuple[Assignment, list[Sample]]:
    """The assignment and the set's own samples (load_samples appends the reference answers)."""
    assignment = Assignment(name)
    samples = load_samples(calibration_set(name), assignment)
    references = samples[len(samples) - len(assignment.reference_answers):]
    points = {q.id: q.points for q in assignment.rubric.questions}
    assert [(s.question_id, s.answer, s.ta_score) for s in references] == [
        (qid, a.answer, points[qid]) for qid, a in assignment.reference_answers.items()]
    return assignment, samples[: len(samples) - len(references)]


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_assignment_ships_a_calibration_set_for_every_question(name):
    assert len(ASSIGNMENTS) >= 2, ASSIGNMENTS
    assert calibration_set(name).is_file(), f"{name} has no calibration set"
    assignment, samples = ta_samples(name)
    for question in assignment.rubric.questions:
        scores = [s.ta_score for s in samples if s.question_id == question.id]
        assert len(scores) >= MIN_SAMPLES, (question.id, scores)
        # varied quality: not one score for all, and something short of the reference's full points
        assert len(set(scores)) >= 2 and min(scores) < question.points, (question.id, scores)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_calibration_set_scores_every_criterion_both_ways(name):
    """Each sample is scored on every criterion of its question, and each criterion is earned by
    some answer and missed by another, so the set says whether the model awards the right points."""
    assignment, samples = ta_samples(name)
    for question in assignment.rubric.questions:
        scored = [s for s in samples if s.question_id == question.id]
        assert all(set(s.criteria) == {c.id for c in question.criteria} for s in scored), question.id
        for criterion in question.criteria:
            given = [s.criteria[criterion.id] for s in scored]
            assert max(given) == criterion.points and min(given) < criterion.points, (question.id, criterion.id, given)
    raw = yaml.safe_load(calibration_set(name).read_text())["answers"]
    assert all(str(entry.get("why", "")).strip() for entries in raw.values() for entry in entries)


QUESTION = "ex11_1_outer_products"    # criteria: symbolic (1), numeric (1)


@pytest.mark.parametrize("entry, words", [
    ({"answer": "a", "criteria": {"symbolic": 1}}, "must score each of ['numeric', 'symbolic'], got ['symbolic']"),
    ({"answer": "a", "criteria": {"symbolic": 1, "numeric": 1, "style": 1}}, "got ['numeric', 'style', 'symbolic']"),
    ({"answer": "a", "criteria": {"symbolic": 2, "numeric": 0}}, "criterion symbolic scores 2, not a number in [0, 1]"),
    ({"answer": "a", "criteria": {"symbolic": "yes", "numeric": 0}}, "criterion symbolic scores 'yes'"),
    ({"answer": "a", "criteria": {"symbolic": 1, "numeric": 0}, "score": 2}, "`score` 2 is not the sum of its criteria, 1"),
    ({"answer": "a", "score": 3}, "needs `criteria` or a `score` in [0, 2]"),
    ({"answer": "a", "criteria": {"symbolic": 1, "numeric": 0}, "wyh": "typo"}, "unknown keys ['wyh']"),
    ({"criteria": {"symbolic": 1, "numeric": 0}}, "needs an `answer` text"),
])
def test_a_sample_that_does_not_fit_its_rubric_is_refused_with_the_place(tmp_path, entry, words):
    path = tmp_path / "set.yaml"
    path.write_text(yaml.safe_dump({"answers": {QUESTION: [{"answer": "fine", "criteria": {"symbolic": 1, "numeric": 1}},
                                                           entry]}}))
    with pytest.raises(RubricError) as raised:
        load_samples(path, Assignment("linear_attention_hyena"))
    assert f"{QUESTION}, sample 2: " in str(raised.value) and words in str(raised.value)


def test_calibrate_runs_on_the_hyena_set_and_compares_every_criterion(api, tmp_path, capsys):
    """The stand-in gives full points everywhere: the table must say how far each TA score is."""
    name = "linear_attention_hyena"
    assert main(["calibrate", "--assignment", name, "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line.strip()}
    assignment = Assignment(name)
    raw = yaml.safe_load(calibration_set(name).read_text())["answers"]
    for question in assignment.rubric.questions:
        totals = [sum(e["criteria"].values()) for e in raw[question.id]] + [question.points]   # + the reference
        exact = sum(t == question.points for t in totals) / len(totals)
        mae = sum(question.points - t for t in totals) / len(totals)
        assert rows[question.id] == [str(len(totals)), str(len(totals)), f"{exact:.0%}", f"{mae:.2f}", "0.00"]
        for criterion in question.criteria:
            given = [e["criteria"][criterion.id] for e in raw[question.id]] + [criterion.points]
            share = sum(g == criterion.points for g in given) / len(given)
            lean = sum(criterion.points - g for g in given) / len(given)
            assert rows[f"{question.id}.{criterion.id}"] == [str(len(given)), f"{share:.0%}", f"{lean:+.2f}"]
    sent = sum(map(len, raw.values())) + len(assignment.reference_answers)
    assert len(api.posts("/v1/messages", "record_grade")) == sent
    asked = len(api.posts("/v1/messages"))   # the drafts and their evidence confirmations
    assert main(["calibrate", "--assignment", name, "--out", str(tmp_path)]) == 0
    assert len(api.posts("/v1/messages")) == asked      # the second run comes from the cache
