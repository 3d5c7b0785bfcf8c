"""Grades into Canvas by its REST API: ``grader publish DIR --canvas URL --course ID --assignment ID --roster CSV``.

The roster is export.py's (``read_roster``): its ``ID`` column is the student's Canvas user id.
For each submission whose grade is final, that student's Canvas submission gets the total as
its grade and one comment with the student's page (``DIR/<id>/report.html``) attached. A grade
is final when the folder's release state (``--release`` on grade or report) shows the student
every item and no item waits for a person: the total is then exactly what the attached page
says. Every other submission is held back and listed with why.

Without ``--apply`` nothing is posted: the plan is printed, per student, with the grade Canvas
holds now (GET requests only). With it, each student is posted and then recorded in
``DIR/published.json`` (the score and a sha256 of the comment's text and attachment), rewritten
atomically after each student: an interrupted run resumes where it stopped, a rerun posts
nothing, and after a regrade or a TA's override only the students whose total or page changed
are posted again. The record is per Canvas address, course and assignment.

What a real Canvas answers, and what happens:

- 401 or 403 (the token, or its user's permissions): the run stops with what to fix;
- 404 for one student's submission, or another refusal of one request: that student is listed,
  the rest go on;
- 429, Canvas's 403 "Rate Limit Exceeded", 5xx, a dropped connection, no answer within
  ``REQUEST_TIMEOUT_S``: retried with exponential backoff (``MAX_RETRIES``, from
  ``FIRST_WAIT_S``), then the run stops, keeping what it posted.

The token comes from the caller (the CLI reads ``CANVAS_API_TOKEN``) and goes only into
canvasapi's Authorization header; no message, file or log line here holds it. No student's text
reaches a request's URL or headers: URLs carry the course and assignment ids given on the
command line and the roster's Canvas ids, each checked to be ASCII digits; the comment's text is
numbers and a digest, and the attachment's name is ``report.html``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
from canvasapi import Canvas
from canvasapi.assignment import Assignment
from canvasapi.exceptions import (CanvasException, Forbidden, InvalidAccessToken, RateLimitExceeded,
                                  ResourceDoesNotExist, Unauthorized)
from canvasapi.submission import Submission
from canvasapi.upload import Uploader

from grader.report.export import ExportError, read_roster
from grader.report.overrides import OVERRIDES_FILE
from grader.report.pages import RELEASES, REPORT_PAGE, release_state
from grader.report.results import GRADEBOOK_FILE, graded_points, is_pending, read_results
from grader.report.terminal import counted
from grader.score import GradeResult

PUBLISHED_FILE = "published.json"
TOKEN_VARIABLE = "CANVAS_API_TOKEN"
# ASCII digits only: int() would also take " 12", "1_2" and other scripts' digits.
CANVAS_ID = re.compile(r"[0-9]{1,20}")
# Plain http only where the token never leaves the machine (a local Canvas, the tests' server).
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_RETRIES = 5          # waits of 1, 2, 4, 8 and 16 s: about half a minute before giving up
FIRST_WAIT_S = 1.0
# One request's wait for Canvas to connect, and then between bytes of its answer (requests'
# timeout): canvasapi sets none, so a Canvas that never answers would hold the run forever.
REQUEST_TIMEOUT_S = 60.0
MAX_REASON_CHARS = 200   # of what Canvas said, in a message

T = TypeVar("T")
Sleep = Callable[[float], None]
Tell = Callable[[str], None]


class PublishError(ValueError):
    """Publishing cannot start or go on: bad input, or Canvas refuses the whole run."""


@dataclass(frozen=True)
class Target:
    """Where grades go: a Canvas address, a course and an assignment, all checked."""

    url: str
    course: int
    assignment: int

    @property
    def key(self) -> str:
        """The target as published.json names it."""
        return f"{self.url}/courses/{self.course}/assignments/{self.assignment}"


@dataclass(frozen=True)
class Grade:
    """What one student gets: the total, the comment's text and the page attached to it."""

    submission_id: str
    canvas_id: int
    score: float
    max_score: float
    comment: str
    page: Path
    digest: str   # sha256 of the comment's text and the attachment's bytes

    def record(self) -> dict[str, Any]:
        """The student's entry in published.json (``posted`` is added when it is written)."""
        return {"canvas_id": self.canvas_id, "score": self.score, "digest": self.digest}


@dataclass
class Plan:
    """What a run would post, and everyone it leaves out, with why."""

    to_post: list[Grade] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)        # posted before, nothing changed since
    held: dict[str, str] = field(default_factory=dict)        # submission id -> why it is not posted
    no_submission: list[str] = field(default_factory=list)    # roster students with no result


@dataclass
class PublishOutcome:
    posted: list[str] = field(default_factory=list)
    already_there: list[str] = field(default_factory=list)    # found in Canvas as it would be posted: recorded
    failed: dict[str, str] = field(default_factory=dict)      # submission id -> what Canvas said


def target(url: str, course: str, assignment: str) -> Target:
    """The checked target of ``--canvas``, ``--course`` and ``--assignment``; raises PublishError."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise PublishError(f"--canvas must be your Canvas's address, like https://canvas.example.edu; got {url!r}")
    if "/api/" in f"{parts.path}/":
        raise PublishError(f"--canvas is Canvas's address without /api/v1 (canvasapi adds it); got {url!r}")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK:
        raise PublishError(f"{url}: plain http would send the token unencrypted; use https://{parts.netloc}")
    ids = {}
    for option, value in (("--course", course), ("--assignment", assignment)):
        if not CANVAS_ID.fullmatch(value):
            raise PublishError(f"{option} must be Canvas's numeric id (the number after /{option[2:]}s/ in "
                               f"its address); got {value!r}")
        ids[option] = int(value)
    return Target(url, ids["--course"], ids["--assignment"])


def token_from_environment() -> str:
    """The access token, from CANVAS_API_TOKEN only: never an option, so that it stays out of the
    shell's history and the process list. Raises PublishError (naming the variable, never its value)."""
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise PublishError(f"set {TOKEN_VARIABLE} to a Canvas access token (in Canvas: Account > Settings > "
                           "New access token) in the environment of this command")
    if not token.isprintable() or any(c.isspace() for c in token):   # it becomes a header line
        raise PublishError(f"{TOKEN_VARIABLE} holds spaces or control characters: copy the token again")
    return token


def plan(out_dir: Path, roster_path: Path, where: Target) -> Plan:
    """What publishing ``out_dir``'s results to ``where`` would post, from the results as
    ``grader report`` left them (overrides applied), the folder's release state, the roster and
    published.json; raises PublishError when one of them is unusable."""
    results = read_results(out_dir)
    if not results:
        raise PublishError(f"{out_dir}: no results.json files to publish")
    _check_overrides_applied(out_dir)
    try:
        release = release_state(out_dir)
        roster = read_roster(roster_path)
    except (ValueError, ExportError) as exc:
        raise PublishError(str(exc)) from exc
    _check_canvas_ids(roster_path, roster)
    published = read_published(out_dir).get(where.key, {})
    by_id = {r.submission_id: r for r in results}
    found = Plan(no_submission=sorted(set(roster) - set(by_id)))
    for result in results:
        sid = result.submission_id
        student = roster.get(sid)
        reasons = ["not in the roster"] if student is None else not_final(result, release, out_dir)
        if reasons:
            found.held[sid] = "; ".join(reasons)
            continue
        grade = _grade(result, int(student["ID"]), out_dir / sid / REPORT_PAGE)
        before = published.get(sid, {})
        if all(before.get(key) == value for key, value in grade.record().items()):
            found.unchanged.append(sid)
        else:
            found.to_post.append(grade)
    return found


def _check_overrides_applied(out_dir: Path) -> None:
    """Refuse totals that miss a TA's latest overrides: ``grader report`` applies overrides.yaml
    and then writes gradebook.csv, so an overrides.yaml newer than the gradebook is not applied
    to the results and pages yet."""
    try:
        edited = (out_dir / OVERRIDES_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        return
    try:
        reported = (out_dir / GRADEBOOK_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        reported = -1
    if edited > reported:
        raise PublishError(f"{out_dir / OVERRIDES_FILE} changed since the last `grader report {out_dir}`: run it "
                           "first, so that the totals and pages posted include those overrides")


def _check_canvas_ids(roster_path: Path, roster: dict[str, dict[str, str]]) -> None:
    """Every roster ID is a Canvas user id (digits), each for one student: it goes into URLs."""
    owners: dict[str, str] = {}
    for sid, student in roster.items():
        canvas_id = student["ID"]
        if not CANVAS_ID.fullmatch(canvas_id):
            raise PublishError(f"{roster_path}: {sid}'s ID {canvas_id!r} is not a Canvas user id (digits only, "
                               "as Canvas's gradebook export has it)")
        if canvas_id in owners:
            raise PublishError(f"{roster_path}: the Canvas ID {canvas_id} is given to both {owners[canvas_id]} "
                               f"and {sid}")
        owners[canvas_id] = sid


def not_final(result: GradeResult, release: str, out_dir: Path) -> list[str]:
    """Why ``result``'s total is not final for Canvas ([] when it is): items its student's page
    does not show yet at the folder's release state, items waiting for a person (counted 0 on
    the page until a TA decides them), or no page to attach."""
    reasons = []
    withheld = [i for i in result.items if i.visibility not in RELEASES[release]]
    if withheld:
        reasons.append(f"{counted(len(withheld), 'item')} not released to students yet (release: {release}; "
                       f"`grader report {out_dir} --release published` releases them)")
    waiting = [i.name for i in result.items if is_pending(i)]
    if waiting:
        reasons.append(f"{counted(len(waiting), 'item')} still {'waits' if len(waiting) == 1 else 'wait'} for a TA's "
                       f"review ({', '.join(waiting)})")
    if not reasons and not (out_dir / result.submission_id / REPORT_PAGE).is_file():
        reasons.append(f"no {REPORT_PAGE} to attach (`grader report {out_dir}` writes it)")
    return reasons


def _grade(result: GradeResult, canvas_id: int, page: Path) -> Grade:
    """The grade and comment for ``result``. The comment names the page's digest, so that a
    run that stopped between posting and recording finds its comment in Canvas (``_already_there``)."""
    score = graded_points(result)   # every item has its score here: the page's total
    attachment = page.read_bytes()
    comment = (f"Grade: {_points(score)} / {_points(result.max_score)} points. Your report is attached "
               f"(report.html, {hashlib.sha256(attachment).hexdigest()[:12]}): what each item checked and, "
               "where points were lost, what differed.")
    digest = hashlib.sha256(comment.encode() + b"\0" + attachment).hexdigest()
    return Grade(result.submission_id, canvas_id, score, result.max_score, comment, page, digest)


def _points(value: float) -> str:
    """Points as Canvas's posted_grade takes them: up to the 4 decimals totals keep, no exponent."""
    return f"{value:.4f}".rstrip("0").rstrip(".")


def read_published(out_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """published.json: target key -> submission id -> what was posted ({} when absent). A damaged
    file is an error: without it, every student would be posted again."""
    path = out_dir / PUBLISHED_FILE
    if path.is_dir():
        raise PublishError(f"{path} is a folder (a submission of that name?): grader publish keeps its record "
                           "there; grade that submission under another name")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path}: not readable ({exc}); it records what was posted: restore it, or delete "
                           "it to post every student again") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise PublishError(f"{path}: not a record of grader publish; restore it, or delete it to post every "
                           "student again")
    return data


def _record(out_dir: Path, where: Target, grade: Grade) -> None:
    """Add ``grade`` to published.json through a temporary file and a rename: a run stopped at
    any moment leaves the old record or the new one, never half a file."""
    published = read_published(out_dir)
    posted = datetime.now(timezone.utc).isoformat(timespec="seconds")
    published.setdefault(where.key, {})[grade.submission_id] = {**grade.record(), "posted": posted}
    path = out_dir / PUBLISHED_FILE
    temporary = path.with_name(f".{PUBLISHED_FILE}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, path)
    except OSError as exc:
        raise PublishError(f"{path}: cannot record {grade.submission_id}, who is posted ({exc}); the next run "
                           "finds that grade in Canvas and records it") from exc


def open_assignment(where: Target, token: str, sleep: Sleep = time.sleep,
                    timeout: float = REQUEST_TIMEOUT_S) -> Assignment:
    """The Canvas assignment grades go to (two GET requests); raises PublishError when Canvas
    refuses the token or the course or assignment is not there. Every request made through it
    (the assignment's, its submissions', their uploads') waits at most ``timeout`` seconds for
    Canvas at a time, then counts as a transient failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # canvasapi warns about http://, which only loopback gets
        canvas = Canvas(where.url, token)
    # canvasapi's Requester sends every request through this one session and passes no timeout:
    # each object fetched from here shares it.
    session = canvas._Canvas__requester._session   # noqa: SLF001 - canvasapi has no option for it
    session.request = functools.partial(session.request, timeout=timeout)
    course = _found(lambda: canvas.get_course(where.course), where, f"course {where.course}", "--course", sleep)
    return _found(lambda: course.get_assignment(where.assignment), where,
                  f"assignment {where.assignment} in course {where.course}", "--assignment", sleep)


def _found(call: Callable[[], T], where: Target, what: str, option: str, sleep: Sleep) -> T:
    """``call()`` (retried), its failures said as what to fix."""
    try:
        return retrying(call, sleep)
    except ResourceDoesNotExist as exc:
        raise PublishError(f"{where.url} has no {what} that this token can see (404): check {option}") from exc
    except (CanvasException, requests.RequestException) as exc:
        raise PublishError(refusal(exc, where)) from exc


def points_mismatch(assignment: Assignment, grades: Plan) -> str:
    """A warning when the Canvas assignment is out of other points than the grader's totals
    ("" when they agree): Canvas takes the grade as points either way."""
    possible = getattr(assignment, "points_possible", None)
    totals = {g.max_score for g in grades.to_post}
    if possible is None or not totals or totals == {float(possible)}:
        return ""
    return (f"warning: the Canvas assignment is out of {_points(float(possible))} points and the grader's totals "
            f"of {', '.join(_points(t) for t in sorted(totals))}; grades are posted as points: set the "
            "assignment's points in Canvas to match")


def publish_grades(grades: Plan, assignment: Assignment, out_dir: Path, where: Target, apply: bool,
                   tell: Tell, sleep: Sleep = time.sleep) -> PublishOutcome:
    """Post each of ``grades.to_post`` (with ``apply``; else only say what would change),
    recording each student as soon as it is posted. One student's 404 (or other refusal of that
    request) is listed and the rest go on; a refusal of the token or of its permissions, or
    Canvas still failing after the retries, raises PublishError, what was posted kept."""
    outcome = PublishOutcome()
    for grade in grades.to_post:
        user = f"{grade.submission_id} (Canvas user {grade.canvas_id})"
        try:
            submission = _fetch(assignment, grade, sleep)
            now = "no grade" if getattr(submission, "score", None) is None else _points(float(submission.score))
            change = f"{now} -> {_points(grade.score)} / {_points(grade.max_score)}, a comment with {REPORT_PAGE}"
            if _already_there(submission, grade):
                if apply:
                    _record(out_dir, where, grade)
                outcome.already_there.append(grade.submission_id)
                tell(f"{'recorded' if apply else 'would record'} {user}: already in Canvas as it would be posted")
            elif not apply:
                tell(f"would post {user}: {change}")
            else:
                _post(assignment, submission, grade, where, sleep)
                _record(out_dir, where, grade)
                outcome.posted.append(grade.submission_id)
                tell(f"posted {user}: {change}")
        except ResourceDoesNotExist:
            outcome.failed[grade.submission_id] = (f"Canvas has no submission of user {grade.canvas_id} in "
                                                   f"assignment {where.assignment} (404): is the student enrolled, "
                                                   "and is the roster's ID right?")
        except (CanvasException, requests.RequestException) as exc:
            if _stops_the_run(exc):
                done = f"; {counted(len(outcome.posted), 'student')} posted before, recorded in {PUBLISHED_FILE}" \
                    if apply else ""
                raise PublishError(refusal(exc, where) + done) from exc
            outcome.failed[grade.submission_id] = f"Canvas refused it: {_said(exc)}"
    return outcome


def _already_there(submission: Submission, grade: Grade) -> bool:
    """Whether Canvas holds this grade and this comment already: a run stopped after posting
    and before recording is not posted twice."""
    comments = getattr(submission, "submission_comments", None) or []
    score = getattr(submission, "score", None)
    return (score is not None and float(score) == grade.score
            and any(isinstance(c, dict) and c.get("comment") == grade.comment for c in comments))


def _fetch(assignment: Assignment, grade: Grade, sleep: Sleep) -> Submission:
    """The student's submission as Canvas holds it, with its comments."""
    return retrying(lambda: assignment.get_submission(grade.canvas_id, include=["submission_comments"]), sleep)


def _post(assignment: Assignment, submission: Submission, grade: Grade, where: Target, sleep: Sleep) -> None:
    """Upload the page, then post the grade and one comment holding the text and the file, in one
    request. Not ``submission.upload_comment``: it posts a comment of its own with the file alone
    (then the text would be a second comment, and a run stopped between the two would post the
    file twice on resuming). canvasapi's Uploader does the same upload (its init request, the
    POST to the upload URL without the token, the confirmation) with the submission's requester."""
    endpoint = f"courses/{where.course}/assignments/{where.assignment}/submissions/{grade.canvas_id}/comments/files"
    confirmed, uploaded = retrying(
        lambda: Uploader(submission._requester, endpoint, grade.page).start(), sleep)   # noqa: SLF001 - see above
    if not confirmed or not isinstance(uploaded, dict) or not isinstance(uploaded.get("id"), int):
        raise CanvasException(f"the upload of {REPORT_PAGE} was not confirmed: {uploaded!r:.{MAX_REASON_CHARS}}")
    sent = False

    def put() -> None:
        nonlocal sent
        # A 5xx or a dropped connection may come after Canvas applied the PUT: look before sending it again.
        if sent and _already_there(_fetch(assignment, grade, sleep), grade):
            return
        sent = True
        submission.edit(submission={"posted_grade": _points(grade.score)},
                        comment={"text_comment": grade.comment, "file_ids": [uploaded["id"]]})

    retrying(put, sleep)


def retrying(call: Callable[[], T], sleep: Sleep = time.sleep) -> T:
    """``call()``, again after FIRST_WAIT_S, then twice as long each time, while Canvas answers
    with a transient failure (``transient``), at most MAX_RETRIES times; the last failure is raised."""
    attempt = 0
    while True:
        try:
            return call()
        except (CanvasException, requests.RequestException) as exc:
            if attempt == MAX_RETRIES or not transient(exc):
                raise
        sleep(FIRST_WAIT_S * 2 ** attempt)
        attempt += 1


def _status(exc: Exception) -> int | None:
    """The HTTP status of canvasapi's catch-all CanvasException: canvasapi 3.6.0 keeps it only in
    the message ("Encountered an error: status code 503")."""
    found = re.search(r"status code (\d{3})\b", str(exc)) if type(exc) is CanvasException else None
    return int(found.group(1)) if found else None


def transient(exc: Exception) -> bool:
    """Whether trying again later may work: 429, Canvas's own throttling (a 403 saying "Rate Limit
    Exceeded"), 5xx, or the connection failing."""
    if isinstance(exc, RateLimitExceeded) or (isinstance(exc, Forbidden) and "Rate Limit Exceeded" in str(exc)):
        return True
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    status = _status(exc)
    return status is not None and status >= 500


def _stops_the_run(exc: Exception) -> bool:
    """Refusals no other student would escape: the token, its permissions, Canvas still failing."""
    return isinstance(exc, (InvalidAccessToken, Unauthorized, Forbidden, requests.RequestException)) or transient(exc)


def refusal(exc: Exception, where: Target) -> str:
    """What stopped the run, and what to fix; never the token."""
    if transient(exc):
        return (f"{where.url} still failed after {MAX_RETRIES} retries ({_said(exc)}); try again later: "
                "the same command resumes")
    if isinstance(exc, InvalidAccessToken):
        return (f"{where.url} refused the token (401): {TOKEN_VARIABLE} is not a valid access token there "
                "(mistyped, expired, revoked, or of another Canvas); make one under Account > Settings > "
                "New access token")
    if isinstance(exc, (Unauthorized, Forbidden)):
        status = 401 if isinstance(exc, Unauthorized) else 403
        return (f"{where.url} does not let the token's user grade course {where.course} ({status}: {_said(exc)}); "
                "the token must belong to a teacher or TA of the course whose role may edit grades")
    return f"{where.url}: {_said(exc)}"


def _said(exc: Exception) -> str:
    """What Canvas (or the connection) said, in a line, cut: the messages of Canvas's
    ``{"errors": [{"message": ...}]}`` when it answered that, else the exception's text."""
    said = getattr(exc, "message", None)
    if isinstance(said, str):
        try:
            said = json.loads(said)
        except ValueError:
            pass
    errors = said.get("errors") if isinstance(said, dict) else said
    messages = [e["message"] for e in errors if isinstance(e, dict) and isinstance(e.get("message"), str)] \
        if isinstance(errors, list) else []
    text = " ".join(("; ".join(messages) or str(exc)).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS] + ("..." if len(text) > MAX_REASON_CHARS else "")
