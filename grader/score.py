"""Stage 5, score: turn verdicts into the per-item results of ``results.json``."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grader import untrusted
from grader.checks import Verdict
from grader.load import Submission
from grader.rubric import WRITTEN_TAG, Question, Rubric

STATUSES = ("passed", "failed", "error", "pending_review")
PENDING = "awaiting review of the written answer"
NOT_SUBMITTED = "not submitted (the answer is blank, or unchanged from the template)"
WAITING = "This answer waits for a TA, who sets its score."   # what a student is told; why is the TA's


@dataclass
class ItemResult:
    name: str
    title: str
    score: float
    max_score: float
    status: str
    output: str
    tags: list[str]
    visibility: str = "visible"
    override: dict[str, Any] | None = None   # a TA's override, with the original score (audit)
    details: dict[str, Any] | None = None    # what the pages show beyond the text (a written draft)


@dataclass(frozen=True)
class ReviewState:
    """An item as every output shows it after overrides (``review_state``)."""

    state: str           # "graded"; "waiting" for a person; "decided" by a TA's override
    counted: float       # the points it adds to a total now (a waiting item adds nothing yet)
    output: str          # what the student is told: results.json's output, the student's page
    reasons: list[str]   # why a person must look (the TA's page, the queue); empty unless waiting


def review_state(item: ItemResult) -> ReviewState:
    """The one decision of what an item's review has come to. A TA's decision shows as that
    decision only (whatever the item said while it waited); a waiting item tells the student
    that it waits, never why: its flags and waiting criteria are reasons for the TA."""
    if item.override:
        by = f" ({item.override['reviewer']})" if item.override.get("reviewer") else ""
        comment = f" {item.override['comment']}" if item.override.get("comment") else ""
        return ReviewState("decided", item.score,
                           f"Reviewed by a TA{by}: {item.score:g} / {item.max_score:g}.{comment}", [])
    if item.status == "pending_review":
        details = item.details or {}
        reasons = [*(details.get("flags") or []), *(details.get("waiting") or []),
                   *(f"criterion {c.get('id')} waits: {c['waits']}" for c in details.get("criteria") or []
                     if isinstance(c, dict) and c.get("waits"))]
        return ReviewState("waiting", 0.0, item.output, [str(r) for r in reasons])
    return ReviewState("graded", item.score, item.output, [])


@dataclass
class GradeResult:
    submission_id: str
    assignment: str
    grader_version: str
    submission_sha256: str
    items: list[ItemResult]
    notes: list[str] = field(default_factory=list)
    execution_time: float = 0.0
    cache_key: str = ""
    artifacts: dict[str, bytes] = field(default_factory=dict)   # extra files for DIR/<id>/
    isolation: str = ""   # how the student's code was isolated (sandbox.ISOLATION_LEVELS); "" if it never ran
    sources: dict[str, Any] = field(default_factory=dict)   # the file each part came from (package-style only)
    # The grader's own state, as data (never read back from note text, which a file name can
    # forge): items whose check crashed ("*" for the whole submission), regraded by the next run.
    grader_errors: list[str] = field(default_factory=list)
    submitted_as: str = ""   # the file or folder name as submitted, when the id had to differ
    # The grader's execution and evaluation digests the result was graded under (grader.digests).
    digests: dict[str, str] = field(default_factory=dict)
    # Timings (decide nothing): where the grading time went, as ordered (stage, seconds) pairs,
    # and the peak memory of its sandbox runs together; see ``timings``.
    stages: list[tuple[str, float]] = field(default_factory=list)
    peak_memory_mib: float | None = None
    # Attempts on the grader read from the student's code (``grader.checks.tampering``), for TAs:
    # each {kind, where, code, detail}; they change no score.
    attempts: list[dict[str, str]] = field(default_factory=list)

    @property
    def score(self) -> float:
        return round(sum(i.score for i in self.items), 4)

    @property
    def max_score(self) -> float:
        return round(sum(i.max_score for i in self.items), 4)

    @property
    def timings(self) -> dict[str, Any]:
        """results.json's ``extra_data.timings``: ``stages`` as [name, seconds] pairs in order
        (``sandbox_start``, ``kernel_start``, each code cell that ran as the student counts it,
        ``probe_start``, ``probe_cases``, ``checks``, ``written``, ``report``; a stage that did
        not happen is absent), ``wall_s`` (``execution_time``) and ``peak_memory_mib`` (PSS of the
        sandboxes' processes and their tmpfs, the most at once over the submission's runs; absent
        when nothing ran). Empty for a result that was never graded."""
        if not self.stages:
            return {}
        return {"stages": [[name, value] for name, value in self.stages], "wall_s": round(self.execution_time, 3),
                **({"peak_memory_mib": self.peak_memory_mib} if self.peak_memory_mib is not None else {})}

    def to_json(self) -> dict[str, Any]:
        """Gradescope's autograder schema (a test's ``status`` is only passed or failed there,
        so the grader's own state and the stable item id go in its ``extra_data``), plus the
        contract's fields at the top level, also copied into the top-level ``extra_data``, which
        also says how the student's code was isolated (``isolation``, once it ran), for a
        submission with package files which file each part came from (``sources``), the items
        an internal grader error left ungraded (``grader_errors``) and the name as submitted
        when the id differs (``submitted_as``), the grader's execution and evaluation digests
        (``digests``), where the grading time went (``timings``) and the attempts on the grader
        read from the student's code (``attempts``, for TAs)."""
        contract = {"submission_id": self.submission_id, "assignment": self.assignment,
                    "grader_version": self.grader_version, "submission_sha256": self.submission_sha256,
                    "cache_key": self.cache_key}
        return {
            "score": self.score,
            "output": "\n".join(self.notes) if self.notes else "Graded.",
            "output_format": "text",
            "execution_time": round(self.execution_time, 2),
            "tests": [{"name": i.title, "score": i.score, "max_score": i.max_score,
                       "status": "passed" if i.status == "passed" else "failed",
                       "output": shown, "output_format": "text",
                       "visibility": i.visibility, "tags": i.tags,
                       "extra_data": {"id": i.name, "state": i.status,
                                      # the item's own message, when a decision is what the student is shown
                                      **({"message": i.output} if shown != i.output else {}),
                                      **({"override": i.override} if i.override else {}),
                                      **({"details": i.details} if i.details else {})}}
                      for i, shown in ((i, review_state(i).output) for i in self.items)],
            **contract,
            "extra_data": {**contract, **({"isolation": self.isolation} if self.isolation else {}),
                           **({"sources": self.sources} if self.sources else {}),
                           **({"grader_errors": self.grader_errors} if self.grader_errors else {}),
                           **({"submitted_as": self.submitted_as} if self.submitted_as else {}),
                           **({"digests": self.digests} if self.digests else {}),
                           **({"timings": self.timings} if self.stages else {}),
                           **({"attempts": self.attempts} if self.attempts else {})},
        }


def score_items(rubric: Rubric, verdicts: dict[str, Verdict], submission: Submission,
                flags: Mapping[str, list[str]] | None = None) -> list[ItemResult]:
    """One result per rubric item, autograded items first, then written questions. ``flags``:
    the written stage's grade-time flags by question id (``grader.written.screen``); a flagged
    answer waits for a TA."""
    flags = flags or {}
    results = []
    for item in rubric.items:
        verdict = verdicts.get(item.name) or Verdict("error", "no check decided this item (grader bug)")
        results.append(ItemResult(item.name, item.title, round(item.points * verdict.score_fraction, 4),
                                  item.points, verdict.status, verdict.message, list(item.tags),
                                  item.visibility))
    for question in rubric.questions:
        answer = submission.answers.get(question.id)
        if submission.notebook is None:
            status, output = "error", f"not graded: {submission.fatal}"
        elif answer is None:
            status, output = "failed", "the Question/Answer cell for this question was not found"
        elif answer.is_blank or question.id in submission.unchanged:
            status, output = "failed", NOT_SUBMITTED
        else:
            status, output = "pending_review", PENDING
        results.append(written_item(rubric, question, status, output, flags.get(question.id)))
    return results


def written_item(rubric: Rubric, question: Question, status: str, output: str,
                 flags: list[str] | None = None) -> ItemResult:
    """A written question's item as the pipeline leaves it for the written stage (0 points).
    A flagged one is ``pending_review`` whatever it would have been, its flags in ``details``
    (where the written stage keeps them and the review queue reads them); its output says only
    that it waits for a TA."""
    details = None
    if flags:
        status, details = "pending_review", {"flags": list(flags)}
        output += f"\n{WAITING}"
    return ItemResult(question.item_name, question.title, 0.0, question.points, status, output, [WRITTEN_TAG],
                      rubric.llm.visibility, details=details)


def result_from_json(data: dict[str, Any]) -> GradeResult:
    """Read back a results.json written by ``GradeResult.to_json``."""
    items = []
    for test in data.get("tests", []):
        extra = test.get("extra_data") or {}
        override = extra.get("override") if isinstance(extra.get("override"), dict) else None
        details = extra.get("details") if isinstance(extra.get("details"), dict) else None
        output = str(extra.get("message", test.get("output", "")))
        items.append(ItemResult(extra["id"], str(test.get("name", "")), float(test["score"]),
                                float(test["max_score"]), extra.get("state", test.get("status", "failed")),
                                output, list(test.get("tags", [])), test.get("visibility", "visible"), override,
                                details))
    notes = [] if data.get("output") == "Graded." else str(data.get("output", "")).splitlines()
    top = data.get("extra_data") or {}
    return GradeResult(data["submission_id"], data["assignment"], data["grader_version"],
                       data["submission_sha256"], items, notes, _execution_time(data, top),
                       data.get("cache_key", ""), isolation=str(top.get("isolation", "")),
                       sources=top["sources"] if isinstance(top.get("sources"), dict) else {},
                       grader_errors=[str(e) for e in top.get("grader_errors") or []],
                       submitted_as=str(top.get("submitted_as", "")),
                       digests={str(k): str(v) for k, v in (top.get("digests") or {}).items()}
                       if isinstance(top.get("digests"), dict) else {},
                       attempts=[{str(k): str(v) for k, v in a.items()} for a in top.get("attempts") or []
                                 if isinstance(a, dict)] if isinstance(top.get("attempts"), list) else [],
                       **_timings_from_json(top.get("timings")))


def _execution_time(data: dict[str, Any], top: dict[str, Any]) -> float:
    """The grading time: ``timings.wall_s`` of the top-level ``extra_data`` (``top``) where
    results.json has it (to the millisecond, as it was written; the top-level ``execution_time``
    is rounded to 1/100 s, so reading that one would give a result that writes a different
    results.json), else ``execution_time``."""
    timings = top.get("timings")
    wall = timings.get("wall_s") if isinstance(timings, dict) else None
    if isinstance(wall, (int, float)) and not isinstance(wall, bool):
        return float(wall)
    return float(data.get("execution_time", 0))


def _timings_from_json(timings: Any) -> dict[str, Any]:
    """``stages`` and ``peak_memory_mib`` from results.json's ``timings`` (what is not well formed is left out)."""
    if not isinstance(timings, dict):
        return {}
    peak = timings.get("peak_memory_mib")
    return {"stages": untrusted.stages(timings.get("stages"), strict=False),
            "peak_memory_mib": float(peak) if isinstance(peak, (int, float)) else None}
