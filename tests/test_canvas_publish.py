"""`grader publish` against a local Canvas (tests/canvas_server.py), through the real canvasapi:
what reaches Canvas is read from the server's record of every request.

The graded folder is built in process from recorded results (test_reports.recorded), released
and rendered by `grader report`: alice and bob have every written answer decided, carol has one
still waiting for a TA; erin is in the roster without a submission."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from grader.cli import main
from grader.report import canvas
from grader.report.pages import REPORT_PAGE
from grader.report.results import read_results, write_result
from grader.score import WAITING

from canvas_server import TOKEN, LocalCanvas
from test_reports import recorded, write_roster

COURSE, ASSIGNMENT = 12, 34
GRADER = Path(sys.executable).parent / "grader"   # the venv's command
IDS = {"alice": 1000, "bob": 1001, "carol": 1002, "erin": 1003}   # write_roster's ids: 1000 + the row's number


def decided(assignment, submission_id: str, failed: dict[str, str] | None = None, waiting: tuple[str, ...] = ()):
    """A recorded result whose written answers are graded (full points) but for ``waiting``."""
    written = {q.item_name: {"score": q.points, "status": "passed", "output": "Graded."}
               for q in assignment.rubric.questions if q.item_name not in waiting}
    written.update({name: {"score": 0.0, "status": "pending_review", "output": WAITING} for name in waiting})
    return recorded(assignment, submission_id, failed, written)


def quietly(argv: list[str]) -> tuple[int, str, str]:
    """``grader ARGV`` in process: (exit status, stdout, stderr)."""
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(io.StringIO()) as err:
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, assignment) -> Path:
    """The folder as `grader report --release published` leaves it, with its roster."""
    folder = tmp_path_factory.mktemp("graded")
    write_result(folder, decided(assignment, "alice"))
    write_result(folder, decided(assignment, "bob", {"causality": "output 3 changed when token 7 changed"}))
    write_result(folder, decided(assignment, "carol", waiting=(assignment.rubric.questions[0].item_name,)))
    assert quietly(["report", str(folder), "--release", "published"])[0] == 0
    write_roster(folder / "roster.csv", list(IDS))
    return folder


@pytest.fixture(scope="module")
def server():
    local = LocalCanvas(COURSE, ASSIGNMENT)
    yield local
    local.close()


@pytest.fixture
def lms(server, monkeypatch) -> LocalCanvas:
    server.reset()
    monkeypatch.setenv(canvas.TOKEN_VARIABLE, TOKEN)
    return server


@pytest.fixture
def folder(graded, tmp_path) -> Path:
    """A copy of the graded folder for one test to change."""
    return Path(shutil.copytree(graded, tmp_path / "out"))


def publish(folder: Path, server: LocalCanvas, *extra: str) -> tuple[int, str, str]:
    return quietly(["publish", str(folder), "--canvas", server.url, "--course", str(COURSE),
                    "--assignment", str(ASSIGNMENT), "--roster", str(folder / "roster.csv"), *extra])


def total(folder: Path, submission_id: str) -> float:
    return next(r.score for r in read_results(folder) if r.submission_id == submission_id)


def writes(server: LocalCanvas) -> list[str]:
    """Every request that could change something in Canvas, as 'METHOD path'."""
    return [f"{r.method} {r.path}" for r in server.requests if r.method != "GET"]


def posted_users(server: LocalCanvas) -> set[int]:
    return {user for user, puts in server.grade_puts().items() if puts}


def test_a_dry_run_posts_nothing_and_says_what_would_change_per_student(folder, lms, assignment):
    status, out, err = publish(folder, lms)
    assert status == 0, err
    assert writes(lms) == [], "a dry run sends only GET requests"
    assert not (folder / canvas.PUBLISHED_FILE).exists()
    for sid in ("alice", "bob"):
        assert (f"would post {sid} (Canvas user {IDS[sid]}): no grade -> {total(folder, sid):g} / 129, "
                f"a comment with {REPORT_PAGE}") in out
    assert "dry run, nothing is posted (--apply posts)" in out and "would post 2 students" in out
    question = assignment.rubric.questions[0].item_name
    assert f"not posted: carol: 1 item still waits for a TA's review ({question})" in err
    assert "1 roster student without a submission (nothing posted): erin" in err
    assert not [r for r in lms.requests if str(IDS["carol"]) in r.path], "a held student is not even looked up"


def test_apply_posts_exactly_each_final_grade_with_a_comment_holding_the_page(folder, lms):
    status, out, err = publish(folder, lms, "--apply")
    assert status == 0, err
    assert "posted alice (Canvas user 1000)" in out and "posted 2 students" in out
    assert posted_users(lms) == {IDS["alice"], IDS["bob"]}
    record = json.loads((folder / canvas.PUBLISHED_FILE).read_text())
    students = record[f"{lms.url}/courses/{COURSE}/assignments/{ASSIGNMENT}"]
    assert sorted(students) == ["alice", "bob"]
    for sid in ("alice", "bob"):
        user = IDS[sid]
        [put] = lms.grade_puts()[user]
        page = (folder / sid / REPORT_PAGE).read_bytes()
        comment = (f"Grade: {total(folder, sid):g} / 129 points. Your report is attached (report.html, "
                   f"{hashlib.sha256(page).hexdigest()[:12]}): what each item checked and, where points were "
                   "lost, what differed.")
        file_ids = put.field("comment[file_ids][]")
        assert put.field("submission[posted_grade]") == [f"{total(folder, sid):g}"]
        assert put.field("comment[text_comment]") == [comment] and len(file_ids) == 1
        # Canvas holds the grade and one comment, whose one attachment is the student's page, byte for byte
        held = lms.submissions[user]
        assert held["score"] == total(folder, sid)
        assert [c["comment"] for c in held["comments"]] == [comment]
        [attached] = held["comments"][0]["attachments"]
        assert lms.files[attached["id"]] == {"user": user, "name": REPORT_PAGE, "data": page}
        assert students[sid]["score"] == total(folder, sid) and students[sid]["canvas_id"] == user
        assert students[sid]["digest"] == hashlib.sha256(comment.encode() + b"\0" + page).hexdigest()
    # the token goes in the Authorization header of API requests only: never to the upload URL, the output or the record
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in lms.api_requests())
    uploads = [r for r in lms.requests if r.path.startswith("/files_api/")]
    assert len(uploads) == 4 and not any("Authorization" in r.headers for r in uploads)
    assert TOKEN not in out + err + (folder / canvas.PUBLISHED_FILE).read_text()


def test_a_rerun_posts_nothing(folder, lms):
    assert publish(folder, lms, "--apply")[0] == 0
    lms.requests.clear()
    status, out, _ = publish(folder, lms, "--apply")
    assert status == 0 and lms.requests == []
    assert "unchanged since posted (published.json): alice, bob" in out and "nothing to post" in out


def test_after_an_override_or_a_regrade_only_the_changed_student_is_posted(folder, lms, assignment):
    assert publish(folder, lms, "--apply")[0] == 0
    # a TA gives bob's failed check partial credit, and re-renders
    (folder / "overrides.yaml").write_text("bob:\n  causality:\n    score: 3\n    reviewer: jdoe\n")
    lms.requests.clear()
    status, _, err = publish(folder, lms, "--apply")   # not re-rendered yet: the totals would miss it
    assert status == 2 and lms.requests == []
    assert f"{folder / 'overrides.yaml'} changed since the last `grader report {folder}`: run it first" in err
    assert quietly(["report", str(folder)])[0] == 0
    lms.requests.clear()
    status, out, err = publish(folder, lms, "--apply")
    assert status == 0, err
    assert posted_users(lms) == {IDS["bob"]} and lms.submissions[IDS["bob"]]["score"] == total(folder, "bob")
    assert "unchanged since posted (published.json): alice" in out and "posted 1 student" in out
    assert len(lms.submissions[IDS["bob"]]["comments"]) == 2, "the new total comes with the new page"
    # a regrade lowers alice's total
    write_result(folder, decided(assignment, "alice", {"normalization": "rows do not sum to 1"}))
    assert quietly(["report", str(folder)])[0] == 0
    lms.requests.clear()
    assert publish(folder, lms, "--apply")[0] == 0
    assert posted_users(lms) == {IDS["alice"]} and lms.submissions[IDS["alice"]]["score"] == total(folder, "alice")


def test_a_bad_token_stops_at_once_saying_what_to_fix(folder, lms, monkeypatch):
    monkeypatch.setenv(canvas.TOKEN_VARIABLE, "not-the-token-5d2e")
    status, out, err = publish(folder, lms, "--apply")
    assert status == 2
    assert f"refused the token (401): {canvas.TOKEN_VARIABLE} is not a valid access token there" in err
    assert writes(lms) == [] and not (folder / canvas.PUBLISHED_FILE).exists()
    assert "not-the-token-5d2e" not in out + err and "Traceback" not in err
    monkeypatch.delenv(canvas.TOKEN_VARIABLE)
    status, _, err = publish(folder, lms)
    assert status == 2 and f"set {canvas.TOKEN_VARIABLE} to a Canvas access token" in err


def test_a_user_without_grading_rights_stops_with_what_to_fix(folder, lms):
    lms.forbidden = True
    status, _, err = publish(folder, lms, "--apply")
    assert status == 2
    assert (f"does not let the token's user grade course {COURSE} (403: user not authorized to perform that action); "
            "the token must belong to a teacher or TA of the course whose role may edit grades") in err
    assert writes(lms) == [] and not (folder / canvas.PUBLISHED_FILE).exists()


def test_a_404_for_one_student_is_listed_and_the_others_are_posted(folder, lms):
    lms.missing_users = {IDS["alice"]}
    status, out, err = publish(folder, lms, "--apply")
    assert status == 1
    assert (f"not posted: alice: Canvas has no submission of user {IDS['alice']} in assignment {ASSIGNMENT} (404): "
            "is the student enrolled, and is the roster's ID right?") in err
    assert posted_users(lms) == {IDS["bob"]} and "posted 1 student; 0 already in Canvas, 1 failed" in out
    record = json.loads((folder / canvas.PUBLISHED_FILE).read_text())
    assert list(record.popitem()[1]) == ["bob"]
    lms.missing_users = set()   # enrolled now: the next run posts alice alone
    lms.requests.clear()
    assert publish(folder, lms, "--apply")[0] == 0 and posted_users(lms) == {IDS["alice"]}


def _run(folder: Path, server: LocalCanvas, waits: list[float]) -> canvas.PublishOutcome:
    """publish --apply through the module, sleeping into ``waits``."""
    where = canvas.target(server.url, str(COURSE), str(ASSIGNMENT))
    grades = canvas.plan(folder, folder / "roster.csv", where)
    assignment = canvas.open_assignment(where, TOKEN, waits.append)
    return canvas.publish_grades(grades, assignment, folder, where, True, lambda line: None, waits.append)


def test_throttling_and_server_errors_are_retried_with_exponential_backoff(folder, lms):
    lms.failures = [429, 403, 500, 503]   # 403 here is Canvas's own throttling: "403 Forbidden (Rate Limit Exceeded)"
    waits: list[float] = []
    outcome = _run(folder, lms, waits)
    assert waits == [1.0, 2.0, 4.0, 8.0]
    assert outcome.posted == ["alice", "bob"] and posted_users(lms) == {IDS["alice"], IDS["bob"]}
    assert [r.path for r in lms.api_requests()[:5]] == [f"/api/v1/courses/{COURSE}"] * 5   # the same request again
    assert all(len(lms.submissions[IDS[s]]["comments"]) == 1 for s in ("alice", "bob"))


def test_a_canvas_that_keeps_failing_stops_the_run_within_the_bound(folder, lms):
    lms.failures = [500] * (canvas.MAX_RETRIES + 1)
    waits: list[float] = []
    with pytest.raises(canvas.PublishError, match=r"still failed after 5 retries \(Encountered an error: status "
                                                  r"code 500\); try again later: the same command resumes"):
        _run(folder, lms, waits)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0] and writes(lms) == []


def test_a_canvas_that_never_answers_is_a_transient_failure_not_a_wait_without_end(folder, lms):
    """canvasapi sets no timeout: each request is given one (REQUEST_TIMEOUT_S), after which it is
    retried like a dropped connection, and the run stops within the bound, alice kept."""
    lms.hanging_users = {IDS["bob"]}
    where = canvas.target(lms.url, str(COURSE), str(ASSIGNMENT))
    waits: list[float] = []
    assignment = canvas.open_assignment(where, TOKEN, waits.append, timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(canvas.PublishError, match=r"still failed after 5 retries \(.*(timed out|Timeout).*\); "
                                                      r"try again later.*1 student posted before"):
            canvas.publish_grades(canvas.plan(folder, folder / "roster.csv", where), assignment, folder, where, True,
                                  lambda line: None, waits.append)
    finally:
        lms.released.set()
    print(f"\nbob's requests: {canvas.MAX_RETRIES + 1} of them, unanswered, gave up after "
          f"{time.monotonic() - started:.1f} s (timeout 0.5 s each)")
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert list(json.loads((folder / canvas.PUBLISHED_FILE).read_text()).popitem()[1]) == ["alice"]
    assert sum(r.path.endswith(f"/submissions/{IDS['bob']}") and r.method == "GET" for r in lms.requests) == \
        canvas.MAX_RETRIES + 1


def test_a_grade_canvas_applied_before_failing_is_not_posted_again(folder, lms):
    lms.lost_answers = {IDS["alice"]: 1}   # alice's PUT is applied, then answered 502
    waits: list[float] = []
    outcome = _run(folder, lms, waits)
    assert waits == [1.0] and outcome.posted == ["alice", "bob"]
    assert len(lms.grade_puts()[IDS["alice"]]) == 1, "Canvas was asked again, not posted to again"
    assert len(lms.submissions[IDS["alice"]]["comments"]) == 1


def test_an_interrupted_apply_resumes_without_posting_anyone_twice(folder, lms):
    # bob's grade PUT keeps failing: the run stops after alice, who is recorded
    lms.failing_puts = {IDS["bob"]: canvas.MAX_RETRIES + 1}
    with pytest.raises(canvas.PublishError, match="1 student posted before, recorded in published.json"):
        _run(folder, lms, [])
    record = json.loads((folder / canvas.PUBLISHED_FILE).read_text()).popitem()[1]
    assert list(record) == ["alice"] and lms.submissions[IDS["bob"]]["comments"] == []
    lms.requests.clear()
    status, out, _ = publish(folder, lms, "--apply")
    assert status == 0 and "unchanged since posted (published.json): alice" in out
    assert posted_users(lms) == {IDS["bob"]}
    assert all(len(lms.submissions[IDS[s]]["comments"]) == 1 for s in ("alice", "bob"))
    # stopped after bob's PUT and before his record: the next run finds his comment in Canvas and only records it
    path = folder / canvas.PUBLISHED_FILE
    kept = json.loads(path.read_text())
    del next(iter(kept.values()))["bob"]
    path.write_text(json.dumps(kept))
    lms.requests.clear()
    status, out, _ = publish(folder, lms, "--apply")
    assert status == 0 and writes(lms) == []
    assert "recorded bob (Canvas user 1001): already in Canvas as it would be posted" in out
    assert "bob" in json.loads(path.read_text()).popitem()[1]
    assert len(lms.submissions[IDS["bob"]]["comments"]) == 1


def test_ctrl_c_stops_a_run_that_resumes_with_the_students_left(folder, lms):
    """The real command, interrupted by SIGINT while it waits for Canvas on bob."""
    lms.hanging_users = {IDS["bob"]}
    argv = [str(GRADER), "publish", str(folder), "--canvas", lms.url, "--course", str(COURSE), "--assignment",
            str(ASSIGNMENT), "--roster", str(folder / "roster.csv"), "--apply"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        assert "posted alice" in next(line for line in run.stdout if line.startswith("posted"))
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=20)
    lms.released.set()   # bob's request, never answered, is dropped
    assert run.returncode == 130, err
    assert "interrupted; every student posted is recorded in" in err and "Traceback" not in err
    assert list(json.loads((folder / canvas.PUBLISHED_FILE).read_text()).popitem()[1]) == ["alice"]
    lms.hanging_users = set()
    lms.requests.clear()
    assert publish(folder, lms, "--apply")[0] == 0
    assert posted_users(lms) == {IDS["bob"]}
    assert all(len(lms.submissions[IDS[s]]["comments"]) == 1 for s in ("alice", "bob"))


def test_nothing_is_posted_before_its_items_are_released(folder, lms):
    assert quietly(["report", str(folder), "--release", "due"])[0] == 0
    status, out, err = publish(folder, lms, "--apply")
    assert status == 0 and lms.requests == [] and "nothing to post" in out
    for sid in ("alice", "bob"):
        assert (f"not posted: {sid}: 10 items not released to students yet (release: due; `grader report {folder} "
                "--release published` releases them)") in err


def test_no_roster_or_student_text_reaches_a_url_or_a_header(folder, lms):
    hostile = "x\r\nX-Injected: 1"
    roster = folder / "roster.csv"
    rows = roster.read_text().splitlines()
    rows[1] = rows[1].replace('"Student, Alice"', f'"{hostile} <script>"')   # alice's name
    rows.append(f'"../../users/self?{hostile}",Mallory,1004,S9,mallory,L01')  # a submission id that matches none
    roster.write_text("\n".join(rows) + "\n")
    status, _, err = publish(folder, lms, "--apply")
    assert status == 0, err
    allowed = re.compile(rf"/api/v1/courses/{COURSE}(/assignments/{ASSIGNMENT}(/submissions/\d+(/comments/files)?)?)?"
                         r"|/files_api/(upload|confirm)/\d+")
    assert lms.requests and all(allowed.fullmatch(r.path) for r in lms.requests), [r.path for r in lms.requests]
    sent = " ".join(r.path + json.dumps(r.query) + json.dumps(r.headers) for r in lms.requests)
    assert not any(text in sent for text in ("X-Injected", "users/self", "Mallory", "Alice", "alice", "script"))
    assert "\r" not in err and "../../users/self?x" in err   # listed as a roster student without a submission
    # a Canvas id that is not digits is refused before any request
    roster.write_text(roster.read_text().replace(",1001,", ",1001/../../users/self,"))
    lms.requests.clear()
    status, _, err = publish(folder, lms, "--apply")
    assert status == 2 and lms.requests == []
    assert "bob's ID '1001/../../users/self' is not a Canvas user id (digits only" in err


def test_a_submission_folder_named_like_the_record_is_refused(folder, lms):
    (folder / canvas.PUBLISHED_FILE).mkdir()
    status, _, err = publish(folder, lms, "--apply")
    assert status == 2 and lms.requests == [] and "Traceback" not in err
    assert f"{folder / canvas.PUBLISHED_FILE} is a folder (a submission of that name?)" in err


@pytest.mark.parametrize("option, value, said", [
    ("--course", "12/../13", "--course must be Canvas's numeric id"),
    ("--assignment", "٣٤", "--assignment must be Canvas's numeric id"),
    ("--canvas", "http://canvas.example.edu", "plain http would send the token unencrypted"),
    ("--canvas", "https://canvas.example.edu/api/v1", "without /api/v1"),
])
def test_a_bad_target_is_refused_before_any_request(folder, lms, option, value, said):
    argv = {"--canvas": lms.url, "--course": str(COURSE), "--assignment": str(ASSIGNMENT), option: value}
    status, _, err = quietly(["publish", str(folder), "--roster", str(folder / "roster.csv"),
                              *(x for pair in argv.items() for x in pair)])
    assert status == 2 and said in err and "Traceback" not in err
    assert lms.requests == []
