"""Stage 5, written answers: each Question/Answer cell graded against its rubric by an LLM.

Per submission the pipeline keeps what this stage needs beside results.json
(``written_inputs.json``: the answers, and the values of each question's grounding variables
exported from the executed notebook). After a batch, ``grade_written`` sends every written
item still ``pending_review`` (live, or as one Message Batch), validates each draft, and
rewrites the results. Drafts are cached by everything that decides them, so a regrade of
unchanged answers sends nothing.

Data that addresses the grader gains no points: ``screen`` runs the detector
(``injection.scan``) at grade time on every answer that would be sent and its grounding values,
whatever ``--llm`` says, and flags a question that several cells claim; ``grade_written`` keeps
those flags and adds its own (the detector again, the model's own flag and, with ``guard``, the
rubric-free guard request of ``--llm-guard``). A flagged item is graded on its content, the
suggested score is recorded, and it stays ``pending_review`` until a TA confirms it in
``overrides.yaml``. Without an API key, or with ``--llm off``, nothing is sent and written
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
from grader.score import GradeResult, ItemResult
from grader.written import client as api
from grader.written.cache import DraftCache, cache_key
from grader.written.injection import scan
from grader.written.prompt import (GUARD_VERSION, PROMPT_VERSION, Draft, Screening, grounding_values, guard_params,
                                   read_draft, read_screening, request_params)

WRITTEN_INPUTS = "written_inputs.json"
USAGE_FILE = "llm_usage.json"
CACHE_FOLDER = ".llm-cache"


def _sent_answers(rubric: Rubric, submission: Submission) -> dict[str, str]:
    """The answers the stage grades, by question id: present, not blank, not the template's text."""
    return {q.id: submission.answers[q.id].answer for q in rubric.questions
            if q.id in submission.answers and not submission.answers[q.id].is_blank
            and q.id not in submission.unchanged}


def inputs_artifact(rubric: Rubric, submission: Submission, exported: Mapping[str, Any]) -> bytes:
    """What the stage needs of one submission: answers to grade, and their grounding values."""
    answers = _sent_answers(rubric, submission)
    grounding = {q.id: grounding_values(exported, q) for q in rubric.questions if q.id in answers}
    return json.dumps({"answers": answers, "grounding": grounding}).encode()


def screen(rubric: Rubric, submission: Submission, exported: Mapping[str, Any]) -> dict[str, list[str]]:
    """The grade-time flags of each flagged question: the detector on the answer that would be
    sent and on its grounding values (``exported``: the executed notebook's answer variables),
    and the other cells that claim the question when several do."""
    answers = _sent_answers(rubric, submission)
    flags = {}
    for question in rubric.questions:
        later = submission.duplicate_answers.get(question.id)
        found = [f"also claimed by later cells ({', '.join(map(str, later))}); only the first is graded"] if later else []
        if question.id in answers:
            found += scan(answers[question.id], grounding_values(exported, question))
        if found:
            flags[question.id] = found
    return flags


@dataclass
class WrittenOutcome:
    graded: int = 0          # items with a draft score (from a request or the cache)
    cached: int = 0
    pending: int = 0         # items left pending_review (flagged, failed, over budget)
    guard_cached: int = 0    # guard decisions from the cache (--llm-guard)
    guard_flagged: int = 0   # items the guard said address the grader
    usage: api.Usage = field(default_factory=api.Usage)
    note: str = ""


@dataclass
class _Item:
    result: GradeResult
    question: Question
    answer: str
    grounding: dict[str, str]
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
    to_send = list(jobs.values())
    with RunProgress(progress, f"written answers ({mode})", len(to_send)) as bar:
        def advance(done: int, total: int) -> None:
            bar.advance(to=done)
        if mode == "batch":
            replies = api.send_batch(client, to_send, rubric.llm, outcome.usage, budget, out_dir, advance,
                                     poll_s, wait_s)
        else:
            replies = api.send_live(client, to_send, rubric.llm, outcome.usage, budget, advance)
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
    changed = {}
    for item in items:
        screening = screenings.get(item.guard_key, "not sent") if guard else None
        outcome.guard_flagged += isinstance(screening, Screening) and screening.addresses_grader
        new = _item_result(item, drafts.get(item.key, "not graded"), screening, rubric)
        outcome.graded += new.status != "pending_review"
        outcome.pending += new.status == "pending_review"
        item.result.items = [new if i.name == new.name else i for i in item.result.items]
        changed[item.result.submission_id] = item.result
    for result in changed.values():
        write_result(out_dir, result)
    guard_sent = len(jobs) - len(graded_by)
    guard_usage = {"guard": {"sent": guard_sent, "cached": outcome.guard_cached,
                             "flagged": outcome.guard_flagged}} if guard else {}
    (out_dir / USAGE_FILE).write_text(json.dumps({"mode": mode, "model": rubric.llm.model, **outcome.usage.to_json(),
                                                  "cached_drafts": outcome.cached, "graded": outcome.graded,
                                                  "pending": outcome.pending, **guard_usage}, indent=2))
    u = outcome.usage
    outcome.note = (f"written answers: {outcome.graded} graded ({outcome.cached} from the cache), "
                    f"{outcome.pending} pending review; {u.requests} requests, {u.input_tokens} input "
                    f"(+{u.cache_write_tokens} cache write, {u.cache_read_tokens} cache read) and "
                    f"{u.output_tokens} output tokens, about ${u.cost_usd:.4f} ({USAGE_FILE})")
    if guard:
        outcome.note += (f"; the guard: {guard_sent} sent, {outcome.guard_cached} from the cache, "
                         f"{outcome.guard_flagged} flagged")
    return outcome


def _pending_items(out_dir: Path, results: list[GradeResult], rubric: Rubric,
                   assignment: Assignment) -> list[_Item]:
    questions = {q.item_name: q for q in rubric.questions}
    # A draft depends on its own question's rubric entry and reference answer, and on how the
    # instructions name the notebook (``written.notebook``), not on the rest; the guard, on
    # the notebook's name only.
    rubric_of = {q.id: hashlib.sha256(repr((q, assignment.reference_answers[q.id], rubric.llm.notebook)).encode()
                                      ).hexdigest() for q in rubric.questions}
    guard_of = hashlib.sha256(repr(("guard", rubric.llm.notebook)).encode()).hexdigest()
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
            grounding = {k: str(v) for k, v in ((inputs.get("grounding") or {}).get(question.id) or {}).items()}
            kept = (item.details or {}).get("flags") or []   # grade time's: the detector, a duplicate answer cell
            flags = list(dict.fromkeys([*kept, *scan(answer, grounding)]))
            key = cache_key(rubric.llm.model, rubric_of[question.id], PROMPT_VERSION, question.id, answer, grounding)
            guard_key = cache_key(rubric.llm.model, guard_of, f"guard-{GUARD_VERSION}", "", answer, grounding)
            found.append(_Item(result, question, answer, grounding, key, guard_key, flags))
    return found


def _item_result(item: _Item, draft: Draft | str, screening: Screening | str | None, rubric: Rubric) -> ItemResult:
    """The item after its draft and, with the guard, its screening (None: no guard asked)."""
    old = next(i for i in item.result.items if i.name == item.question.item_name)
    flags = list(item.flags)
    if isinstance(draft, Draft) and draft.injection_suspected:
        flags.append("the model flagged it")
    if isinstance(screening, Screening) and screening.addresses_grader:
        flags.append("the guard request says it addresses the grader"
                     + (f": {json.dumps(screening.evidence, ensure_ascii=False)}" if screening.evidence else ""))
    if isinstance(draft, str):
        return replace(old, score=0.0, status="pending_review", details={"flags": flags} if flags else None,
                       output=f"LLM grading did not finish: {draft}. Awaiting review of the written answer."
                       + (f"\nFLAGGED for review ({'; '.join(flags)})." if flags else ""))
    lines = [f"LLM draft ({rubric.llm.model}, confidence {draft.confidence:.2f}): "
             f"{draft.total:g} / {item.question.points:g}"]
    criteria = []
    for criterion in item.question.criteria:
        points, rationale = draft.criteria[criterion.id]
        lines.append(f"- {criterion.id}: {points:g} / {criterion.points:g}: {rationale}")
        criteria.append({"id": criterion.id, "points": points, "max_points": criterion.points,
                         "rationale": rationale})
    lines.append(f"Feedback: {draft.feedback}")
    details = {"model": rubric.llm.model, "confidence": draft.confidence,
               "draft_score": draft.total, "criteria": criteria, "feedback": draft.feedback,
               "flags": flags, "needs_review": draft.needs_review}
    accept = (f"in overrides.yaml, `{item.result.submission_id}: {{{old.name}: {draft.total:g}}}` accepts the "
              "suggested score.")
    if flags:
        lines.append(f"FLAGGED: the answer seems to address the grader ({'; '.join(flags)}). It gains no points "
                     f"until a TA confirms: {accept}")
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines), details=details)
    if isinstance(screening, str):
        lines.append(f"The guard request did not finish: {screening}. It gains no points until a TA confirms: {accept}")
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines), details=details)
    if draft.needs_review:
        lines.append("The model asks for a person to review this grade.")
    status = "passed" if draft.total >= item.question.points else "failed"
    return replace(old, score=draft.total, status=status, output="\n".join(lines), details=details)
