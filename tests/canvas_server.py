"""A local stand-in for Canvas's REST API on 127.0.0.1: the parts ``grader publish`` calls
through canvasapi, recording every request it receives.

It serves a course, an assignment and its submissions (GET, and PUT with ``posted_grade`` and a
comment), and the upload of a submission comment's file as Canvas does it: the init POST
answers an ``upload_url`` on this server, the file is POSTed there (multipart, no token), which
redirects to the confirmation, whose JSON names the file's id. Requests need the token
``TOKEN`` (else 401, as Canvas answers a bad token: with WWW-Authenticate).

Failure modes, switched on the instance: ``forbidden`` (403 to every API request),
``missing_users`` (404 for those Canvas user ids' submissions), ``failures`` (statuses the next
API requests get first: [429, 429] throttles twice, [500] fails once, 403 is Canvas's own
throttling, "403 Forbidden (Rate Limit Exceeded)"), ``failing_puts`` (user id -> how many of its
grade PUTs fail with 500), ``lost_answers`` (user id -> how many of its grade PUTs are applied,
then answered 502, as a gateway that timed out after the write) and ``hanging_users`` (their
requests get no answer until ``released`` is set, then the connection closes: a run can be
interrupted there).
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

TOKEN = "canvas-test-token-7f3a9c"
SUBMISSION = re.compile(r"/api/v1/courses/(\d+)/assignments/(\d+)/submissions/(\d+)")


@dataclass
class Request:
    """One request as it arrived: what the tests read."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    form: list[tuple[str, str]] = field(default_factory=list)   # a form body's fields, in order
    files: dict[str, bytes] = field(default_factory=dict)       # a multipart body's files, by field name

    def field(self, name: str) -> list[str]:
        return [value for key, value in self.form if key == name]


class LocalCanvas:
    """The server; ``url`` is what ``--canvas`` gets."""

    def __init__(self, course: int = 12, assignment: int = 34, points_possible: float = 129) -> None:
        self.course, self.assignment, self.points_possible = course, assignment, points_possible
        self.requests: list[Request] = []
        self.submissions: dict[int, dict[str, Any]] = {}   # user id -> the submission as Canvas keeps it
        self.files: dict[int, dict[str, Any]] = {}          # file id -> its name and bytes, once uploaded
        self.forbidden = False
        self.missing_users: set[int] = set()
        self.failures: list[int] = []
        self.failing_puts: dict[int, int] = {}
        self.lost_answers: dict[int, int] = {}
        self.hanging_users: set[int] = set()
        self.released = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                request = Request(self.command, parts.path, parse_qs(parts.query), dict(self.headers.items()), body)
                kind = self.headers.get("Content-Type", "")
                if kind.startswith("application/x-www-form-urlencoded"):
                    request.form = parse_qsl(body.decode(), keep_blank_values=True)
                elif kind.startswith("multipart/form-data"):
                    request.form, request.files = multipart(kind, body)
                with outer.lock:
                    outer.requests.append(request)
                    user = SUBMISSION.match(parts.path)
                    hangs = bool(user) and int(user.group(3)) in outer.hanging_users
                    if not hangs:
                        status, answer, headers = outer.answer(request)
                if hangs:
                    outer.released.wait(60)
                    self.close_connection = True
                    return
                self._send(status, answer, headers)

            do_GET = do_POST = do_PUT = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body, extra headers) for ``request``; called under the lock."""
        if request.path.startswith("/files_api/"):   # the upload and its confirmation: no token, as Canvas's
            return self.upload(request)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {"errors": [{"message": "Invalid access token."}]}, {"WWW-Authenticate": 'Bearer realm="canvas-lms"'}
        if self.forbidden:
            return 403, {"errors": [{"message": "user not authorized to perform that action"}]}, {}
        if self.failures:
            status = self.failures.pop(0)   # a 403 here is Canvas's throttling, as Canvas words it
            return status, "403 Forbidden (Rate Limit Exceeded)" if status == 403 else \
                {"errors": [{"message": f"scripted {status}"}]}, {}
        if request.method == "GET" and request.path == f"/api/v1/courses/{self.course}":
            return 200, {"id": self.course, "name": "Deep learning"}, {}
        if request.method == "GET" and request.path == f"/api/v1/courses/{self.course}/assignments/{self.assignment}":
            return 200, {"id": self.assignment, "course_id": self.course, "name": "Linear attention",
                         "points_possible": self.points_possible}, {}
        found = SUBMISSION.match(request.path)
        if not found or (int(found.group(1)), int(found.group(2))) != (self.course, self.assignment):
            return 404, {"errors": [{"message": "The specified resource does not exist."}]}, {}
        user = int(found.group(3))
        if user in self.missing_users:
            return 404, {"errors": [{"message": "The specified resource does not exist."}]}, {}
        rest = request.path[found.end():]
        if request.method == "POST" and rest == "/comments/files":
            file_id = 500 + len(self.files)
            self.files[file_id] = {"user": user, "name": request.field("name")[0], "data": None}
            return 200, {"upload_url": f"{self.url}/files_api/upload/{file_id}",
                         "upload_params": {"filename": request.field("name")[0], "content_type": "text/html"}}, {}
        if rest:
            return 404, {"errors": [{"message": "The specified resource does not exist."}]}, {}
        if request.method == "PUT":
            if self.failing_puts.get(user):
                self.failing_puts[user] -= 1
                return 500, {"errors": [{"message": "Internal server error"}]}, {}
            updated = self.update(user, request)
            if self.lost_answers.get(user):
                self.lost_answers[user] -= 1
                return 502, {"errors": [{"message": "Bad gateway"}]}, {}
            return 200, updated, {}
        return 200, self.submission(user, "submission_comments" in request.query.get("include[]", [])), {}

    def submission(self, user: int, comments: bool = False) -> dict[str, Any]:
        kept = self.submissions.setdefault(user, {"score": None, "comments": []})
        shown = {"id": 9000 + user, "user_id": user, "assignment_id": self.assignment, "score": kept["score"],
                 "grade": None if kept["score"] is None else f"{kept['score']:g}", "workflow_state": "submitted"}
        return {**shown, "submission_comments": kept["comments"]} if comments else shown

    def update(self, user: int, request: Request) -> dict[str, Any]:
        """A grade PUT: the posted grade, and a comment of the text and the files it names."""
        kept = self.submissions.setdefault(user, {"score": None, "comments": []})
        for grade in request.field("submission[posted_grade]"):
            kept["score"] = float(grade)
        text, file_ids = request.field("comment[text_comment]"), request.field("comment[file_ids][]")
        if text or file_ids:
            attachments = [{"id": int(i), "display_name": self.files[int(i)]["name"]} for i in file_ids]
            kept["comments"].append({"id": 700 + sum(len(s["comments"]) for s in self.submissions.values()),
                                     "comment": text[0] if text else "", "attachments": attachments})
        return self.submission(user, comments=True)

    def upload(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """The POST to upload_url redirects to the confirmation, which answers the file."""
        found = re.fullmatch(r"/files_api/(upload|confirm)/(\d+)", request.path)
        file_id = int(found.group(2)) if found else -1
        if file_id not in self.files:
            return 404, {"errors": [{"message": "no such upload"}]}, {}
        if found.group(1) == "upload" and request.method == "POST":
            self.files[file_id]["data"] = request.files.get("file")
            return 303, {}, {"Location": f"{self.url}/files_api/confirm/{file_id}"}
        return 200, {"id": file_id, "display_name": self.files[file_id]["name"], "content-type": "text/html",
                     "size": len(self.files[file_id]["data"] or b""),
                     "url": f"{self.url}/files/{file_id}/download"}, {}

    def api_requests(self) -> list[Request]:
        """The requests to Canvas's API, uploads and confirmations left out."""
        return [r for r in self.requests if r.path.startswith("/api/")]

    def grade_puts(self) -> dict[int, list[Request]]:
        """Every grade PUT received (answered or failed), by user id."""
        found: dict[int, list[Request]] = {}
        for request in self.requests:
            match = SUBMISSION.fullmatch(request.path)
            if request.method == "PUT" and match:
                found.setdefault(int(match.group(3)), []).append(request)
        return found

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.submissions.clear()
            self.files.clear()
            self.forbidden, self.failures, self.missing_users = False, [], set()
            self.failing_puts, self.lost_answers, self.hanging_users = {}, {}, set()
            self.released.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def multipart(content_type: str, body: bytes) -> tuple[list[tuple[str, str]], dict[str, bytes]]:
    """A multipart/form-data body's text fields and files."""
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    form, files = [], {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename() is not None:
            files[name] = part.get_payload(decode=True)
        else:
            form.append((name, part.get_content()))
    return form, files
