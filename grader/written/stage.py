"""The written-answers stage: each Question/Answer cell graded against its rubric by an LLM.

Per submission the pipeline keeps what this stage needs beside results.json
(``written_inputs.json``: the answers; the values of each question's grounding variables
exported from the grader's run of the notebook; the same variables in the student's own run,
as the notebook's report cell stored them before grading (``Submission.report``), or why the
notebook carries no report; and whether the two runs agree). After a batch, ``grade_written`` sends every written
item still ``pending_review`` (live, or as one Message Batch), validates each draft, and
rewrites the results. Drafts are cached by everything that decides them, so a regrade of
unchanged answers sends nothing.

Data that addresses the grader gains no points: ``screen`` runs the detector
(``injection.scan``) at grade time on every answer that would be sent and its grounding values,
whatever ``--llm`` says, and flags a question that several cells claim; ``grade_written`` keeps
those flags and adds its own (the detector again, the model's own flag and, with ``guard``, the
rubric-free guard request of ``--llm-guard``). A flagged item is graded on its content, the
suggested score is recorded, and it stays ``pending_review`` until a TA confirms it in
``overrides.yaml``.

The student's reported run is what the answers discuss, and it is student data like the
answer: it goes into the request (labeled, between the delimiters) and into ``run_agreement``,
which compares it with the grader's run where the rubric says the two must agree (the same
code at the same sizes: ``written.rerun.<variable>.agree``). A contradiction is a grade-time
flag for a person, never a score. Without a readable report, the request is grounded on the
grader's run and says so. Without an API key, or with ``--llm off``, nothing is sent and written
items stay ``pending_review``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from grader.assignment import Assignment
from grader.load import Submission
from grader.report.results import write_result
from grader.report.terminal import RunProgress
from grader.rubric import Question, Rubric
from grader.score import WAITING, GradeResult, ItemResult
from grader.written import client as api
from grader.written import evidence
from grader.written.cache import DraftCache, cache_key
from grader.written.injection import scan
from grader.written.prompt import (AGREE, DISAGREE, GUARD_VERSION, PROMPT_VERSION, REPORTED, REPORTED_ABSENT, Draft,
                                   Grounding, Screening, grounding_values, guard_params, read_draft, read_screening,
                                   request_params)

WRITTEN_INPUTS = "written_inputs.json"
USAGE_FILE = "llm_usage.json"
CACHE_FOLDER = ".llm-cache"


def _sent_answers(rubric: Rubric, submission: Submission) -> dict[str, str]:
    """The answers the stage grades, by question id: present, not blank, not the template's text."""
    return {q.id: submission.answers[q.id].answer for q in rubric.questions
            if q.id in submission.answers and not submission.answers[q.id].is_blank
            and q.id not in submission.unchanged}


def inputs_artifact(rubric: Rubric, submission: Submission, exported: Mapping[str, Any]) -> bytes:
    """What the stage needs of one submission: answers to grade, their grounding values in the
    grader's run (``exported``) and in the student's reported run, and whether the runs agree."""
    answers = _sent_answers(rubric, submission)
    agreement = run_agreement(rubric, submission, exported)
    asked = [q for q in rubric.questions if q.id in answers]
    report = submission.report
    return json.dumps({
        "answers": answers,
        "grounding": {q.id: grounding_values(exported, q) for q in asked},
        "reported": {q.id: _reported(submission, q) for q in asked} if report else {},
        "report": {"state": REPORTED if report else submission.report_missing,
                   "grading_mode": report.grading_mode if report else None},
        "agreement": {q.id: {name: agreement[name][0] for name in q.grounding if name in agreement} for q in asked},
    }).encode()


def screen(rubric: Rubric, submission: Submission, exported: Mapping[str, Any]) -> dict[str, list[str]]:
    """The grade-time flags of each flagged question: the detector on the answer that would be
    sent and on its grounding values (``exported``: the executed notebook's answer variables;
    the reported run's too), a reported run that contradicts the grader's where they must
    agree, and the other cells that claim the question when several do."""
    answers = _sent_answers(rubric, submission)
    agreement = run_agreement(rubric, submission, exported)
    flags = {}
    for question in rubric.questions:
        later = submission.duplicate_answers.get(question.id)
        found = [f"also claimed by later cells ({', '.join(map(str, later))}); only the first is graded"] if later else []
        if question.id in answers:
            reported = {f"{name} (the student's run)": value
                        for name, value in _reported(submission, question).items() if value != REPORTED_ABSENT}
            found += scan(answers[question.id], {**grounding_values(exported, question), **reported})
            for name in question.grounding:
                outcome, differ = agreement.get(name, ("", []))
                if outcome == DISAGREE:
                    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
                    found.append("the student's reported run contradicts the grader's re-run where the two must "
                                 f"agree: {'; '.join(differ[:3])}{more}")
                elif outcome and outcome != AGREE:   # the rubric says it must agree, yet it could not be compared
                    found.append(f"the student's reported {name} could not be checked against the grader's re-run: "
                                 f"{outcome}")
        if found:
            flags[question.id] = found
    return flags


def _reported(submission: Submission, question: Question) -> dict[str, str]:
    """The question's grounding variables in the student's reported run, as JSON text."""
    return grounding_values(submission.report.variables, question, REPORTED_ABSENT) if submission.report else {}


_MISSING = object()
MAX_ROWS = 1000   # entries of a ``rows`` list compared (the lists are the student's)


def run_agreement(rubric: Rubric, submission: Submission,
                  exported: Mapping[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Per answer variable with ``agree`` rules in the rubric, whether the student's reported run
    and the grader's run (``exported``) agree where they must: (AGREE, []), (DISAGREE, what
    differs, for a person) or (why they were not compared, []). Empty without a report."""
    if submission.report is None:
        return {}
    found = {}
    for name, rerun in rubric.rerun.items():
        if not rerun.agree:
            continue
        mine, theirs = submission.report.variables.get(name), exported.get(name)
        if not isinstance(mine, dict) or not isinstance(theirs, dict):
            found[name] = (f"the {'student' if not isinstance(mine, dict) else 'grader'}'s run has no such object", [])
            continue
        compared, differ = 0, []
        for rule in rerun.agree:
            if any(k not in mine or k not in theirs or mine[k] != theirs[k] for k in rule.same):
                continue   # other sizes: nothing here must agree
            for label, i, j in _positions(rule.rows, mine, theirs):
                for key in rule.fields:
                    a, b = _entry(mine, key, i), _entry(theirs, key, j)
                    if a is _MISSING and b is _MISSING:
                        continue
                    compared += 1
                    if not _agrees(a, b, rule.factor):
                        differ.append(f"{name}.{key}{label}: {_shown(a)} in the student's run, {_shown(b)} in the "
                                      "grader's")
        found[name] = ((DISAGREE, differ) if differ else (AGREE, []) if compared
                       else ("they ran at different sizes", []))
    return found


def _positions(rows: str, mine: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, int | None, int | None]]:
    """Where a rule compares: the whole fields (no ``rows``), or each entry of the ``rows`` list
    both runs have, with its index in each run."""
    if not rows:
        return [("", None, None)]
    ours, other = mine.get(rows), theirs.get(rows)
    if not isinstance(ours, list) or not isinstance(other, list):
        return []
    plain = (int, float, str)
    where: dict[Any, int] = {}
    for j, row in enumerate(other[:MAX_ROWS]):
        if isinstance(row, plain) and not isinstance(row, bool):
            where.setdefault(row, j)
    return [(f" at {rows} {row}", i, where[row]) for i, row in enumerate(ours[:MAX_ROWS])
            if isinstance(row, plain) and not isinstance(row, bool) and row in where]


def _entry(value: dict[str, Any], key: str, index: int | None) -> Any:
    found = value.get(key, _MISSING)
    if index is None or found is _MISSING:
        return found
    return found[index] if isinstance(found, list) and index < len(found) else _MISSING


def _agrees(a: Any, b: Any, factor: float) -> bool:
    if a is _MISSING or b is _MISSING:
        return False
    if factor and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf") for v in (a, b)):
        return max(a, b) / min(a, b) <= factor
    return a == b


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class WrittenOutcome:
    graded: int = 0          # items with a draft score (from a request or the cache)
    cached: int = 0
    pending: int = 0         # items left pending_review (flagged, failed, over budget)
    guard_cached: int = 0    # guard decisions from the cache (--llm-guard)
    guard_flagged: int = 0   # items the guard said address the grader
    confirmations_sent: int = 0     # answer-free evidence confirmations asked (grader.written.evidence)
    confirmations_cached: int = 0
    usage: api.Usage = field(default_factory=api.Usage)
    note: str = ""


@dataclass
class _Item:
    result: GradeResult
    question: Question
    answer: str
    grounding: Grounding
    key: str
    guard_key: str
    flags: list[str]


def grade_written(out_dir: Path, results: list[GradeResult], assignment: Assignment, rubric: Rubric,
                  mode: str, budget_usd: float | None = None, progress: TextIO = sys.stderr,
                  poll_s: float = 30.0, wait_s: float = 24 * 3600, guard: bool = False) -> WrittenOutcome:
    """Grade every pending written item of ``results`` (mode ``live`` or ``batch``) and
    rewrite their results.json; with ``guard``, each answer also gets the guard request, sent,
    cached and budgeted with the drafts. Returns what was done, tokens and cost included."""
    outcome = WrittenOutcome()
    client = api.make_client(rubric.llm)
    if client is None:
        outcome.note = "no ANTHROPIC_API_KEY: written answers stay pending_review"
        return outcome
    cache = DraftCache(out_dir / CACHE_FOLDER)
    items = _pending_items(out_dir, results, rubric, assignment)
    drafts: dict[str, Draft | str] = {}
    screenings: dict[str, Screening | str] = {}
    jobs: dict[str, api.Job] = {}            # one request per distinct key
    graded_by: dict[str, Question] = {}      # the question of each grading job (the others are guard jobs)
    for item in items:
        if item.key not in drafts and item.key not in jobs:
            cached = cache.get(item.key)
            if cached is not None:
                drafts[item.key] = Draft.from_json(cached)
                outcome.cached += 1
            else:
                jobs[item.key] = api.Job(item.key, request_params(
                    rubric.llm, item.question, assignment.reference_answers[item.question.id], item.answer,
                    item.grounding))
                graded_by[item.key] = item.question
        if guard and item.guard_key not in screenings and item.guard_key not in jobs:
            cached = cache.get(item.guard_key)
            if cached is not None:
                screenings[item.guard_key] = Screening.from_json(cached)
                outcome.guard_cached += 1
            else:
                jobs[item.guard_key] = api.Job(item.guard_key, guard_params(rubric.llm, item.answer, item.grounding))
    budget = api.Budget(budget_usd)
    replies = _send(client, list(jobs.values()), f"written answers ({mode})", mode, rubric, outcome, budget, out_dir,
                    progress, poll_s, wait_s)
    for key in jobs:
        reply = replies.get(key) or api.Reply(None, "no reply")
        if key in graded_by:
            draft = read_draft(reply.content, graded_by[key]) if reply.content is not None else reply.problem
            drafts[key] = draft
            if isinstance(draft, Draft):
                cache.put(key, draft.to_json())
        else:
            screening = read_screening(reply.content) if reply.content is not None else reply.problem
            screenings[key] = screening
            if isinstance(screening, Screening):
                cache.put(key, screening.to_json())
    confirmed = _confirm(client, items, drafts, screenings if guard else None, mode, rubric, outcome, budget, cache,
                         out_dir, progress, poll_s, wait_s)
    changed = {}
    for item in items:
        screening = screenings.get(item.guard_key, "not sent") if guard else None
        outcome.guard_flagged += isinstance(screening, Screening) and screening.addresses_grader
        new = _item_result(item, drafts.get(item.key, "not graded"), screening, confirmed, rubric)
        outcome.graded += new.status != "pending_review"
        outcome.pending += new.status == "pending_review"
        item.result.items = [new if i.name == new.name else i for i in item.result.items]
        changed[item.result.submission_id] = item.result
    for result in changed.values():
        write_result(out_dir, result)
    guard_sent = len(jobs) - len(graded_by)
    usage_extra = {"confirmations": {"sent": outcome.confirmations_sent, "cached": outcome.confirmations_cached}}
    guard_usage = {"guard": {"sent": guard_sent, "cached": outcome.guard_cached,
                             "flagged": outcome.guard_flagged}} if guard else {}
    (out_dir / USAGE_FILE).write_text(json.dumps({"mode": mode, "model": rubric.llm.model, **outcome.usage.to_json(),
                                                  "cached_drafts": outcome.cached, "graded": outcome.graded,
                                                  "pending": outcome.pending, **usage_extra, **guard_usage},
                                                 indent=2))
    u = outcome.usage
    outcome.note = (f"written answers: {outcome.graded} graded ({outcome.cached} from the cache), "
                    f"{outcome.pending} pending review; {outcome.confirmations_sent} evidence confirmations sent "
                    f"({outcome.confirmations_cached} from the cache); {u.requests} requests answered"
                    + (f" and {u.failed} not answered" if u.failed else "")
                    + f", {u.input_tokens} input "
                    f"(+{u.cache_write_tokens} cache write, {u.cache_read_tokens} cache read) and "
                    f"{u.output_tokens} output tokens, about ${u.cost_usd:.4f} ({USAGE_FILE})")
    if guard:
        outcome.note += (f"; the guard: {guard_sent} sent, {outcome.guard_cached} from the cache, "
                         f"{outcome.guard_flagged} flagged")
    return outcome


def _send(client: Any, jobs: list[api.Job], label: str, mode: str, rubric: Rubric, outcome: WrittenOutcome,
          budget: api.Budget, out_dir: Path, progress: TextIO, poll_s: float, wait_s: float) -> dict[str, api.Reply]:
    """``jobs`` sent live or as one Message Batch, with a progress bar, within ``budget``."""
    with RunProgress(progress, label, len(jobs)) as bar:
        def advance(done: int, total: int) -> None:
            bar.advance(to=done)
        if mode == "batch":
            return api.send_batch(client, jobs, rubric.llm, outcome.usage, budget, out_dir, advance, poll_s, wait_s)
        return api.send_live(client, jobs, rubric.llm, outcome.usage, budget, advance)


def _confirm(client: Any, items: list[_Item], drafts: dict[str, Draft | str], screenings: dict[str, Screening | str] | None,
             mode: str, rubric: Rubric, outcome: WrittenOutcome, budget: api.Budget, cache: DraftCache, out_dir: Path,
             progress: TextIO, poll_s: float, wait_s: float) -> dict[str, bool | str]:
    """The answer-free confirmation of every criterion whose evidence was found and screened
    clean (``evidence.needs_confirmation``), by its key: from the cache, or asked (live, or as a
    second Message Batch) within the same budget. Answers already flagged ask nothing: a TA
    decides them whole."""
    found: dict[str, bool | str] = {}
    jobs: dict[str, api.Job] = {}
    for item in items:
        draft = drafts.get(item.key)
        screening = screenings.get(item.guard_key) if screenings is not None else None
        if not isinstance(draft, Draft) or item.flags or draft.injection_suspected or (
                isinstance(screening, Screening) and screening.addresses_grader):
            continue
        for criterion, quotes in evidence.needs_confirmation(item.question, draft.criteria, item.answer,
                                                             rubric.llm.languages).values():
            key = evidence.confirm_key(rubric.llm, item.question, criterion, quotes)
            if key in found or key in jobs:
                continue
            cached = cache.get(key)
            if cached is not None and isinstance(cached.get("earns"), bool):
                found[key] = cached["earns"]
                outcome.confirmations_cached += 1
            else:
                jobs[key] = api.Job(key, evidence.confirm_params(rubric.llm, criterion, quotes))
    outcome.confirmations_sent = len(jobs)
    if jobs:
        replies = _send(client, list(jobs.values()), f"evidence confirmations ({mode})", mode, rubric, outcome,
                        budget, out_dir, progress, poll_s, wait_s)
        for key in jobs:
            reply = replies.get(key) or api.Reply(None, "no reply")
            found[key] = evidence.read_confirmation(reply.content) if reply.content is not None else reply.problem
            if isinstance(found[key], bool):
                cache.put(key, {"earns": found[key]})
    return found


def _pending_items(out_dir: Path, results: list[GradeResult], rubric: Rubric,
                   assignment: Assignment) -> list[_Item]:
    questions = {q.item_name: q for q in rubric.questions}
    # A draft depends on its own question's rubric entry and reference answer, and on what the
    # instructions say of the course (``written.notebook``, the languages answers may use), not on
    # the rest; the guard, on those two only.
    course = (rubric.llm.notebook, rubric.llm.languages)
    rubric_of = {q.id: hashlib.sha256(repr((q, assignment.reference_answers[q.id], *course)).encode()
                                      ).hexdigest() for q in rubric.questions}
    guard_of = hashlib.sha256(repr(("guard", *course)).encode()).hexdigest()
    found = []
    for result in results:
        try:
            inputs = json.loads((out_dir / result.submission_id / WRITTEN_INPUTS).read_text())
        except (OSError, ValueError):
            continue
        for item in result.items:
            question = questions.get(item.name)
            answer = (inputs.get("answers") or {}).get(question.id) if question else None
            if question is None or not isinstance(answer, str) or item.status != "pending_review":
                continue
            grounding = _grounding(inputs, question, rubric)
            # grade time's flags: the detector, runs that contradict each other, a duplicate answer cell
            kept = (item.details or {}).get("flags") or []
            flags = list(dict.fromkeys([*kept, *scan(answer, grounding.sent())]))
            key = cache_key(rubric.llm.model, rubric_of[question.id], PROMPT_VERSION, question.id, answer,
                            grounding.to_json())
            guard_key = cache_key(rubric.llm.model, guard_of, f"guard-{GUARD_VERSION}", "", answer, grounding.sent())
            found.append(_Item(result, question, answer, grounding, key, guard_key, flags))
    return found


def _grounding(inputs: dict[str, Any], question: Question, rubric: Rubric) -> Grounding:
    """One question's grounding as ``inputs_artifact`` stored it, labeled with the rubric's budgets."""
    def texts(part: str) -> dict[str, str]:
        found = inputs.get(part)
        entry = found.get(question.id) if isinstance(found, dict) else None
        return {str(k): str(v) for k, v in entry.items()} if isinstance(entry, dict) else {}

    report = inputs.get("report") if isinstance(inputs.get("report"), dict) else {}
    state = str(report.get("state") or "")
    rerun = texts("grounding")
    return Grounding(rerun=rerun, reported=texts("reported") if state == REPORTED else {},
                     budgets={name: rubric.rerun[name].budget for name in rerun if name in rubric.rerun},
                     report=state,
                     agreement=texts("agreement"))


def _item_result(item: _Item, draft: Draft | str, screening: Screening | str | None, confirmed: dict[str, bool | str],
                 rubric: Rubric) -> ItemResult:
    """The item after its draft, the evidence checks of each criterion (``confirmed``: the
    answer-free confirmations by key) and, with the guard, its screening (None: no guard asked).
    A criterion's points count only when its evidence holds; what does not waits for a TA."""
    old = next(i for i in item.result.items if i.name == item.question.item_name)
    flags = list(item.flags)
    if isinstance(draft, Draft) and draft.injection_suspected:
        flags.append("the model flagged it")
    if isinstance(screening, Screening) and screening.addresses_grader:
        flags.append("the guard request says it addresses the grader"
                     + (f": {json.dumps(screening.evidence, ensure_ascii=False)}" if screening.evidence else ""))
    if isinstance(draft, str):
        return replace(old, score=0.0, status="pending_review",
                       details={"flags": flags, "waiting": [f"LLM grading did not finish: {draft}"]},
                       output=f"LLM grading did not finish: {draft}. {WAITING}")
    decisions = (evidence.decide(rubric.llm, item.question, draft.criteria, item.answer, confirmed) if not flags
                 else {c.id: evidence.CriterionDecision(0.0, "the answer is flagged") for c in item.question.criteria})
    awarded = round(sum(d.awarded for d in decisions.values()), 4)
    lines = [f"LLM draft ({rubric.llm.model}, confidence {draft.confidence:.2f}): "
             f"{draft.total:g} / {item.question.points:g} suggested, {awarded:g} of it on confirmed evidence"]
    criteria = []
    for criterion in item.question.criteria:
        points, rationale, quotes = draft.criteria[criterion.id]
        decision = decisions[criterion.id]
        shown = "; ".join(f"\u201c{q}\u201d" for q in quotes)
        lines.append(f"- {criterion.id}: {decision.awarded:g} / {criterion.points:g}: {rationale}"
                     + (f" Evidence: {shown}" if quotes else "")
                     + (f" ({points:g} suggested, waiting for a TA)" if decision.waits and not flags else ""))
        criteria.append({"id": criterion.id, "points": decision.awarded, "suggested": points,
                         "max_points": criterion.points, "rationale": rationale, "evidence": list(quotes),
                         **({"waits": decision.waits} if decision.waits and not flags else {})})
    lines.append(f"Feedback: {draft.feedback}")
    details = {"model": rubric.llm.model, "confidence": draft.confidence,
               "draft_score": draft.total, "criteria": criteria, "feedback": draft.feedback,
               "flags": flags, "needs_review": draft.needs_review}
    # Why it waits is the TA's (details: flags, waiting, each criterion's reason); the student is told it waits.
    if flags:
        lines.append(WAITING)
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines), details=details)
    if isinstance(screening, str):
        lines.append(WAITING)
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines),
                       details={**details, "waiting": [f"the guard request did not finish: {screening}"]})
    waiting = [c["id"] for c in criteria if "waits" in c]
    if waiting:
        lines.append(f"Criteria {', '.join(waiting)} wait for a TA: their points count once a person decides.")
        # nothing counts while a person must decide (``review_state``): the confirmed points are in details
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines), details=details)
    if draft.needs_review:
        lines.append("The model asks for a person to review this grade.")
    status = "passed" if awarded >= item.question.points else "failed"
    return replace(old, score=awarded, status=status, output="\n".join(lines), details=details)
