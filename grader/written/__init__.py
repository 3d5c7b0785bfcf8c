"""Stage 5, written answers: each Question/Answer cell graded against its rubric by an LLM.

Per submission the pipeline keeps what this stage needs beside results.json
(``written_inputs.json``: the answers, and the values of each question's grounding variables
exported from the executed notebook). After a batch, ``grade_written`` sends every written
item still ``pending_review`` (live, or as one Message Batch), validates each draft, and
rewrites the results. Drafts are cached by everything that decides them, so a regrade of
unchanged answers sends nothing.

An answer that addresses the grader (``injection.suspicious``, or the model's own flag) is
graded on its content but gains no points: the suggested score is recorded and the item stays
``pending_review`` until a TA confirms it in ``overrides.yaml``. Without an API key, or with
``--llm off``, nothing is sent and written items stay ``pending_review``.
"""
from __future__ import annotations

import hashlib
import json
import sys
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
from grader.written.injection import suspicious
from grader.written.prompt import PROMPT_VERSION, Draft, grounding_values, read_draft, request_params

WRITTEN_INPUTS = "written_inputs.json"
USAGE_FILE = "llm_usage.json"
CACHE_FOLDER = ".llm-cache"


def inputs_artifact(rubric: Rubric, submission: Submission, exported: dict[str, Any]) -> bytes:
    """What the stage needs of one submission: answers to grade, and their grounding values."""
    answers = {q.id: submission.answers[q.id].answer for q in rubric.questions
               if q.id in submission.answers and not submission.answers[q.id].is_blank
               and q.id not in submission.unchanged}
    grounding = {q.id: grounding_values(exported, q) for q in rubric.questions if q.id in answers}
    return json.dumps({"answers": answers, "grounding": grounding}).encode()


@dataclass
class WrittenOutcome:
    graded: int = 0          # items with a draft score (from a request or the cache)
    cached: int = 0
    pending: int = 0         # items left pending_review (flagged, failed, over budget)
    usage: api.Usage = field(default_factory=api.Usage)
    note: str = ""


@dataclass
class _Item:
    result: GradeResult
    question: Question
    answer: str
    grounding: dict[str, str]
    key: str
    flags: list[str]


def grade_written(out_dir: Path, results: list[GradeResult], assignment: Assignment, rubric: Rubric,
                  mode: str, budget_usd: float | None = None, progress: TextIO = sys.stderr,
                  poll_s: float = 30.0, wait_s: float = 24 * 3600) -> WrittenOutcome:
    """Grade every pending written item of ``results`` (mode ``live`` or ``batch``) and
    rewrite their results.json; returns what was done, tokens and cost included."""
    outcome = WrittenOutcome()
    client = api.make_client(rubric.llm)
    if client is None:
        outcome.note = "no ANTHROPIC_API_KEY: written answers stay pending_review"
        return outcome
    cache = DraftCache(out_dir / CACHE_FOLDER)
    items = _pending_items(out_dir, results, rubric, assignment)
    drafts: dict[str, Draft | str] = {}
    jobs: dict[str, tuple[api.Job, Question]] = {}   # one request per distinct key
    for item in items:
        if item.key in drafts or item.key in jobs:
            continue
        cached = cache.get(item.key)
        if cached is not None:
            drafts[item.key] = Draft.from_json(cached)
            outcome.cached += 1
        else:
            params = request_params(rubric.llm, item.question, assignment.reference_answers[item.question.id],
                                    item.answer, item.grounding)
            jobs[item.key] = (api.Job(item.key, params), item.question)
    budget = api.Budget(budget_usd)
    to_send = [job for job, _ in jobs.values()]
    with RunProgress(progress, f"written answers ({mode})", len(to_send)) as bar:
        def advance(done: int, total: int) -> None:
            bar.advance(to=done)
        if mode == "batch":
            replies = api.send_batch(client, to_send, rubric.llm, outcome.usage, budget, out_dir, advance,
                                     poll_s, wait_s)
        else:
            replies = api.send_live(client, to_send, rubric.llm, outcome.usage, budget, advance)
    for key, (_, question) in jobs.items():
        reply = replies.get(key) or api.Reply(None, "no reply")
        draft = read_draft(reply.content, question) if reply.content is not None else reply.problem
        drafts[key] = draft
        if isinstance(draft, Draft):
            cache.put(key, draft.to_json())
    changed = {}
    for item in items:
        draft = drafts.get(item.key, "not graded")
        new = _item_result(item, draft, rubric)
        outcome.graded += new.status != "pending_review"
        outcome.pending += new.status == "pending_review"
        item.result.items = [new if i.name == new.name else i for i in item.result.items]
        changed[item.result.submission_id] = item.result
    for result in changed.values():
        write_result(out_dir, result)
    (out_dir / USAGE_FILE).write_text(json.dumps({"mode": mode, "model": rubric.llm.model, **outcome.usage.to_json(),
                                                  "cached_drafts": outcome.cached, "graded": outcome.graded,
                                                  "pending": outcome.pending}, indent=2))
    u = outcome.usage
    outcome.note = (f"written answers: {outcome.graded} graded ({outcome.cached} from the cache), "
                    f"{outcome.pending} pending review; {u.requests} requests, {u.input_tokens} input "
                    f"(+{u.cache_write_tokens} cache write, {u.cache_read_tokens} cache read) and "
                    f"{u.output_tokens} output tokens, about ${u.cost_usd:.4f} ({USAGE_FILE})")
    return outcome


def _pending_items(out_dir: Path, results: list[GradeResult], rubric: Rubric,
                   assignment: Assignment) -> list[_Item]:
    questions = {q.item_name: q for q in rubric.questions}
    # A draft depends on its own question's rubric entry and reference answer, and on how the
    # instructions name the notebook (``written.notebook``), not on the rest.
    rubric_of = {q.id: hashlib.sha256(repr((q, assignment.reference_answers[q.id], rubric.llm.notebook)).encode()
                                      ).hexdigest() for q in rubric.questions}
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
            flags = suspicious(answer) + [f"{name}: {why}" for name, value in grounding.items()
                                          for why in suspicious(value)]
            key = cache_key(rubric.llm.model, rubric_of[question.id], PROMPT_VERSION, question.id, answer, grounding)
            found.append(_Item(result, question, answer, grounding, key, flags))
    return found


def _item_result(item: _Item, draft: Draft | str, rubric: Rubric) -> ItemResult:
    old = next(i for i in item.result.items if i.name == item.question.item_name)
    if isinstance(draft, str):
        return replace(old, score=0.0, status="pending_review",
                       output=f"LLM grading did not finish: {draft}. Awaiting review of the written answer.")
    lines = [f"LLM draft ({rubric.llm.model}, confidence {draft.confidence:.2f}): "
             f"{draft.total:g} / {item.question.points:g}"]
    criteria = []
    for criterion in item.question.criteria:
        points, rationale = draft.criteria[criterion.id]
        lines.append(f"- {criterion.id}: {points:g} / {criterion.points:g}: {rationale}")
        criteria.append({"id": criterion.id, "points": points, "max_points": criterion.points,
                         "rationale": rationale})
    lines.append(f"Feedback: {draft.feedback}")
    flags = item.flags + (["the model flagged it"] if draft.injection_suspected else [])
    details = {"model": rubric.llm.model, "confidence": draft.confidence,
               "draft_score": draft.total, "criteria": criteria, "feedback": draft.feedback,
               "flags": flags, "needs_review": draft.needs_review}
    if flags:
        lines.append(f"FLAGGED: the answer seems to address the grader ({'; '.join(flags)}). It gains no points "
                     f"until a TA confirms: in overrides.yaml, `{item.result.submission_id}: "
                     f"{{{old.name}: {draft.total:g}}}` accepts the suggested score.")
        return replace(old, score=0.0, status="pending_review", output="\n".join(lines), details=details)
    if draft.needs_review:
        lines.append("The model asks for a person to review this grade.")
    status = "passed" if draft.total >= item.question.points else "failed"
    return replace(old, score=draft.total, status=status, output="\n".join(lines), details=details)
