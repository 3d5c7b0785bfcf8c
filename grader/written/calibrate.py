"""``grader calibrate``: how well the LLM's drafts agree with TA scores, before a class is
graded with them.

The sample set (``rubrics/<name>_calibration.yaml``) holds, per question, answers a TA has
scored; the master notebook's reference answers are added at full points. Every sample is
graded exactly as a student's answer would be (``grade_written``, cache included), then
compared per question: exact-match rate, mean absolute error and quadratic-weighted kappa.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from grader.assignment import Assignment
from grader.report.results import write_result
from grader.rubric import Rubric, RubricError
from grader.score import GradeResult, written_item
from grader.written import WRITTEN_INPUTS, grade_written


@dataclass(frozen=True)
class Sample:
    question_id: str
    answer: str
    ta_score: float


def load_samples(path: Path, assignment: Assignment) -> list[Sample]:
    """The TA-scored answers of ``path`` plus the reference answers at full points."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        samples = [Sample(str(qid), str(entry["answer"]), float(entry["score"]))
                   for qid, entries in (raw.get("answers") or {}).items() for entry in entries]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise RubricError(f"{path}: not a calibration set ({exc})") from exc
    points = {q.id: q.points for q in assignment.rubric.questions}
    unknown = {s.question_id for s in samples} - set(points)
    if unknown:
        raise RubricError(f"{path}: samples for unknown questions {sorted(unknown)}")
    return samples + [Sample(qid, answer.answer, points[qid]) for qid, answer in assignment.reference_answers.items()]


def quadratic_weighted_kappa(ta: list[int], model: list[int], categories: int) -> float:
    """Cohen's kappa with quadratic weights over scores 0 .. categories - 1 (1.0: perfect
    agreement; 0: no better than chance). Defined as 1.0 when both raters give one score."""
    observed = [[0.0] * categories for _ in range(categories)]
    for a, b in zip(ta, model):
        observed[a][b] += 1
    n = len(ta)
    ta_hist = [sum(row) for row in observed]
    model_hist = [sum(observed[i][j] for i in range(categories)) for j in range(categories)]
    weight = [[(i - j) ** 2 / max(1, (categories - 1) ** 2) for j in range(categories)] for i in range(categories)]
    disagreement = sum(weight[i][j] * observed[i][j] for i in range(categories) for j in range(categories))
    chance = sum(weight[i][j] * ta_hist[i] * model_hist[j] / n for i in range(categories) for j in range(categories))
    return 1.0 if chance == 0 else 1.0 - disagreement / chance


@dataclass(frozen=True)
class Agreement:
    question_id: str
    count: int
    exact: float
    mean_abs_error: float
    kappa: float
    graded: int        # samples that got a draft (the rest stayed pending)


def agreement(question_id: str, points: float, pairs: list[tuple[float, float]], graded: int) -> Agreement:
    """Agreement of (TA score, draft score) pairs for one question."""
    categories = int(round(points)) + 1
    ta = [min(categories - 1, int(round(a))) for a, _ in pairs]
    model = [min(categories - 1, int(round(b))) for _, b in pairs]
    exact = sum(a == b for a, b in pairs) / len(pairs)
    mae = sum(abs(a - b) for a, b in pairs) / len(pairs)
    return Agreement(question_id, len(pairs), exact, mae, quadratic_weighted_kappa(ta, model, categories), graded)


def calibrate(assignment: Assignment, rubric: Rubric, samples: list[Sample], out_dir: Path,
              mode: str = "live") -> list[Agreement]:
    """Grade every sample into ``out_dir`` and compare the drafts with the TA scores."""
    questions = {q.id: q for q in rubric.questions}
    results = []
    for index, sample in enumerate(samples):
        question = questions[sample.question_id]
        sid = f"sample-{index:03d}"
        items = [written_item(rubric, question, "pending_review", "awaiting review")]
        result = GradeResult(sid, rubric.assignment, "calibration", "", items)
        write_result(out_dir, result)
        (out_dir / sid / WRITTEN_INPUTS).write_text(json.dumps(
            {"answers": {question.id: sample.answer}, "grounding": {question.id: {}}}))
        results.append(result)
    outcome = grade_written(out_dir, results, assignment, rubric, mode)
    if outcome.graded == 0 and outcome.note.startswith("no ANTHROPIC_API_KEY"):
        raise RubricError("calibration needs ANTHROPIC_API_KEY: it compares real drafts with TA scores")
    report = []
    for qid, question in questions.items():
        pairs, graded = [], 0
        for sample, result in zip(samples, results):
            if sample.question_id == qid:
                item = result.items[0]
                graded += item.status != "pending_review"
                pairs.append((sample.ta_score, item.score))
        if pairs:
            report.append(agreement(qid, question.points, pairs, graded))
    return report


def report_table(report: list[Agreement]) -> str:
    lines = [f"{'question':<24}{'answers':>8}{'graded':>8}{'exact':>8}{'MAE':>8}{'QWK':>8}"]
    for a in report:
        lines.append(f"{a.question_id:<24}{a.count:>8}{a.graded:>8}{a.exact:>8.0%}{a.mean_abs_error:>8.2f}"
                     f"{a.kappa:>8.2f}")
    return "\n".join(lines)
