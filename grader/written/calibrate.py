"""``grader calibrate``: how well the LLM's drafts agree with TA scores, before a class is
graded with them.

The sample set (``rubrics/<name>_calibration.yaml``) holds, per question, answers a TA has
scored; the master notebook's reference answers are added at full points. A sample gives its
TA score either per criterion (``criteria``: every criterion of the question, each within its
points; the total is their sum, and ``why`` says in a line what earned or missed them) or as a
total only (``score``). Every sample is graded exactly as a student's answer would be
(``grade_written``, cache included), then compared per question: exact-match rate, mean
absolute error and quadratic-weighted kappa of the totals; and, where the TA scored criteria,
per criterion: how often the draft gives the TA's points and how far it leans (draft minus TA,
on average), which says whether the model awards the right points for the right reasons.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grader.assignment import Assignment
from grader.report.results import write_result
from grader.rubric import Question, Rubric, RubricError
from grader.score import GradeResult, ItemResult, written_item
from grader.written.stage import WRITTEN_INPUTS, grade_written


@dataclass(frozen=True)
class Sample:
    question_id: str
    answer: str
    ta_score: float
    criteria: dict[str, float] = field(default_factory=dict)   # the TA's points per criterion, when given


SAMPLE_KEYS = {"answer", "score", "criteria", "why"}


def load_samples(path: Path, assignment: Assignment) -> list[Sample]:
    """The TA-scored answers of ``path`` plus the reference answers at full points; raises
    RubricError naming the question and sample that does not fit the rubric."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        entries = [(str(qid), n, entry) for qid, listed in (raw.get("answers") or {}).items()
                   for n, entry in enumerate(listed, start=1)]
    except (OSError, yaml.YAMLError, AttributeError, TypeError) as exc:
        raise RubricError(f"{path}: not a calibration set ({exc})") from exc
    questions = {q.id: q for q in assignment.rubric.questions}
    unknown = {qid for qid, _, _ in entries} - set(questions)
    if unknown:
        raise RubricError(f"{path}: samples for unknown questions {sorted(unknown)}")
    samples = [_sample(questions[qid], entry, f"{path}: {qid}, sample {n}") for qid, n, entry in entries]
    # A reference is full on every criterion; said only where the TAs scored criteria, so a set
    # of totals gets no per-criterion rows made of references alone.
    by_criterion = {s.question_id for s in samples if s.criteria}
    return samples + [Sample(qid, answer.answer, questions[qid].points,
                             {c.id: c.points for c in questions[qid].criteria} if qid in by_criterion else {})
                      for qid, answer in assignment.reference_answers.items()]


def _sample(question: Question, entry: object, where: str) -> Sample:
    """One TA-scored answer, checked against its question's criteria."""
    if not isinstance(entry, dict) or not isinstance(entry.get("answer"), str):
        raise RubricError(f"{where}: needs an `answer` text")
    extra = set(entry) - SAMPLE_KEYS
    if extra:
        raise RubricError(f"{where}: unknown keys {sorted(extra)} (a sample has {', '.join(sorted(SAMPLE_KEYS))})")
    given = entry.get("criteria")
    if given is None:
        if not _number(entry.get("score")) or not 0 <= entry["score"] <= question.points:
            raise RubricError(f"{where}: needs `criteria` or a `score` in [0, {question.points:g}]")
        return Sample(question.id, entry["answer"], float(entry["score"]))
    bounds = {c.id: c.points for c in question.criteria}
    if not isinstance(given, dict) or set(given) != set(bounds):
        named = sorted(map(str, given)) if isinstance(given, dict) else given
        raise RubricError(f"{where}: `criteria` must score each of {sorted(bounds)}, got {named}")
    for cid, points in given.items():
        if not _number(points) or not 0 <= points <= bounds[cid]:
            raise RubricError(f"{where}: criterion {cid} scores {points!r}, not a number in [0, {bounds[cid]:g}]")
    total = round(float(sum(given.values())), 4)
    if "score" in entry and entry["score"] != total:
        raise RubricError(f"{where}: `score` {entry['score']!r} is not the sum of its criteria, {total:g}")
    return Sample(question.id, entry["answer"], total, {cid: float(p) for cid, p in given.items()})


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
class CriterionAgreement:
    criterion_id: str
    count: int         # samples with the TA's points for this criterion and a draft
    exact: float       # share of them where the draft gives the TA's points
    lean: float        # mean of draft minus TA points: > 0, the model is more generous than the TA


@dataclass(frozen=True)
class Agreement:
    question_id: str
    count: int
    exact: float
    mean_abs_error: float
    kappa: float
    graded: int        # samples that got a draft (the rest stayed pending)
    criteria: tuple[CriterionAgreement, ...] = ()


def agreement(question_id: str, points: float, pairs: list[tuple[float, float]], graded: int,
              criteria: tuple[CriterionAgreement, ...] = ()) -> Agreement:
    """Agreement of (TA score, draft score) pairs for one question."""
    categories = int(round(points)) + 1
    ta = [min(categories - 1, int(round(a))) for a, _ in pairs]
    model = [min(categories - 1, int(round(b))) for _, b in pairs]
    exact = sum(a == b for a, b in pairs) / len(pairs)
    mae = sum(abs(a - b) for a, b in pairs) / len(pairs)
    return Agreement(question_id, len(pairs), exact, mae, quadratic_weighted_kappa(ta, model, categories), graded,
                     criteria)


def criterion_agreement(question: Question, scored: list[tuple[dict[str, float], dict[str, float]]]
                        ) -> tuple[CriterionAgreement, ...]:
    """Per criterion of ``question``, agreement of (TA points, draft points) over the samples
    that have both; criteria no such sample scores are left out."""
    found = []
    for criterion in question.criteria:
        pairs = [(ta[criterion.id], draft[criterion.id]) for ta, draft in scored
                 if criterion.id in ta and criterion.id in draft]
        if pairs:
            found.append(CriterionAgreement(criterion.id, len(pairs), sum(a == b for a, b in pairs) / len(pairs),
                                            sum(b - a for a, b in pairs) / len(pairs)))
    return tuple(found)


def _draft_criteria(item: ItemResult) -> dict[str, float]:
    """The draft's points per criterion (empty when the model gave no draft)."""
    listed = (item.details or {}).get("criteria") or []
    return {str(c["id"]): float(c["points"]) for c in listed if isinstance(c, dict) and "id" in c and "points" in c}


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
        pairs, scored, graded = [], [], 0
        for sample, result in zip(samples, results):
            if sample.question_id == qid:
                item = result.items[0]
                graded += item.status != "pending_review"
                pairs.append((sample.ta_score, item.score))
                scored.append((sample.criteria, _draft_criteria(item)))
        if pairs:
            report.append(agreement(qid, question.points, pairs, graded, criterion_agreement(question, scored)))
    return report


def report_table(report: list[Agreement]) -> str:
    """Totals per question; then, for the criteria the TAs scored, agreement per criterion."""
    width = max([len("question"), *(len(a.question_id) for a in report)]) + 2
    lines = [f"{'question':<{width}}{'answers':>8}{'graded':>8}{'exact':>8}{'MAE':>8}{'QWK':>8}"]
    for a in report:
        lines.append(f"{a.question_id:<{width}}{a.count:>8}{a.graded:>8}{a.exact:>8.0%}{a.mean_abs_error:>8.2f}"
                     f"{a.kappa:>8.2f}")
    rows = [(f"{a.question_id}.{c.criterion_id}", c) for a in report for c in a.criteria]
    if rows:
        width = max(len(name) for name, _ in rows) + 2
        lines += ["", "per criterion (lean: mean draft minus TA points; > 0 is more generous than the TA)",
                  f"{'criterion':<{width}}{'scored':>8}{'exact':>8}{'lean':>8}"]
        lines += [f"{name:<{width}}{c.count:>8}{c.exact:>8.0%}{c.lean:>+8.2f}" for name, c in rows]
    return "\n".join(lines)
