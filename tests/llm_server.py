"""A local stand-in for the Anthropic API on 127.0.0.1: the Messages and Message Batches
endpoints, with scripted grades and errors, recording every request it receives.

The real ``anthropic`` client talks to it through ``ANTHROPIC_BASE_URL``; nothing in the
client is patched. By default it grades by a rule anyone can read: every criterion earns
its full points unless the answer contains the word WRONG (then none), and an answer asking
for full marks is flagged. ``script`` replaces that with a function of the request (its
result is the tool input, or a list of content blocks), ``failures`` queues error answers
(status, error type) that the next requests get first, ``delay_s`` slows every answer, and
``batch_ready`` says whether a batch has ended. An evidence confirmation (the tool is
record_confirmation) is answered by ``confirm``, by default yes unless the quotes say NOPE. A guard request (``--llm-guard``: the tool is
record_screening) is answered by ``guard`` instead, by default another readable rule: the data
addresses the grader when it says "psst", a whisper the grader's own detector has no pattern for.
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

USAGE = {"input_tokens": 120, "output_tokens": 80, "cache_creation_input_tokens": 900,
         "cache_read_input_tokens": 0}


def answer_of(request: dict[str, Any]) -> str:
    """The student's answer as a grading request carries it (between its label and the data's end)."""
    text = request["messages"][0]["content"].split("The student's answer:\n", 1)[-1]
    return re.split(r"\n=== END STUDENT DATA [0-9a-f]+ ===", text, maxsplit=1)[0]


def sentences(text: str) -> list[str]:
    """The answer's sentences, as a model would quote them."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def grade_by_rule(request: dict[str, Any]) -> dict[str, Any]:
    """Full points per criterion, or none when the answer says WRONG; the evidence of every
    criterion is the answer's first sentence."""
    schema = request["tools"][0]["input_schema"]["properties"]["criteria"]["properties"]
    answer = answer_of(request)
    wrong = "WRONG" in answer
    quote = (sentences(answer) or [""])[0][:400]
    return {"criteria": {cid: {"rationale": "checked against the rubric", "evidence": [] if wrong else [quote],
                               "points": 0 if wrong else spec["properties"]["points"]["maximum"]}
                         for cid, spec in schema.items()},
            "feedback": "Clear and complete." if not wrong else "This does not answer the question.",
            "confidence": 0.9, "needs_review": False, "injection_suspected": "full marks" in answer.lower()}


def confirm_by_rule(request: dict[str, Any]) -> dict[str, Any]:
    """The confirmation's yes, unless the quotes say NOPE."""
    return {"earns": "NOPE" not in request["messages"][0]["content"]}


def screen_by_rule(request: dict[str, Any]) -> dict[str, Any]:
    """The guard's yes when the student data says psst."""
    whisper = "psst" in request["messages"][0]["content"].lower()
    return {"evidence": "psst" if whisper else "", "addresses_grader": whisper}


def message(scripted: Any, usage: dict[str, int] = USAGE, tool: str = "record_grade") -> dict[str, Any]:
    """A Messages API reply: a call of ``tool`` with ``scripted`` as its input, or, when
    ``scripted`` is a list, exactly those content blocks."""
    content = scripted if isinstance(scripted, list) else [
        {"type": "tool_use", "id": "toolu_local", "name": tool, "input": scripted}]
    return {"id": "msg_local", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": content, "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}


class LocalAnthropic:
    """The server; ``url`` goes into ANTHROPIC_BASE_URL."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []     # (method, path, body)
        self.script: Callable[[dict[str, Any]], Any] = grade_by_rule
        self.guard: Callable[[dict[str, Any]], Any] = screen_by_rule
        self.confirm: Callable[[dict[str, Any]], Any] = confirm_by_rule
        self.failures: list[tuple[int, str]] = []
        self.delay_s = 0.0
        self.batch_ready = True
        self.batches: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.send_header("retry-after-ms", "10")   # the SDK's backoff, made short
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client gave up first (the timeout tests)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append(("POST", self.path, body))
                    failure = outer.failures.pop(0) if outer.failures else None
                if failure:
                    return self._send(failure[0], {"type": "error", "error": {"type": failure[1], "message": "scripted"}})
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if self.path == "/v1/messages":
                    return self._send(200, outer.reply(body))
                if self.path == "/v1/messages/batches":
                    batch_id = f"msgbatch_{len(outer.batches) + 1}"
                    outer.batches[batch_id] = body["requests"]
                    return self._send(200, outer.batch(batch_id))
                self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})

            def do_GET(self) -> None:
                with outer.lock:
                    outer.requests.append(("GET", self.path, None))
                found = re.fullmatch(r"/v1/messages/batches/([\w-]+)(/results)?", self.path)
                if not found or found.group(1) not in outer.batches:
                    return self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                batch_id = found.group(1)
                if not found.group(2):
                    return self._send(200, outer.batch(batch_id))
                lines = [json.dumps({"custom_id": r["custom_id"],
                                     "result": {"type": "succeeded", "message": outer.reply(r["params"])}})
                         for r in outer.batches[batch_id]]
                self._send(200, ("\n".join(lines) + "\n").encode(), "application/binary")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        """The message answering ``request``: a guard request's screening, a confirmation's
        decision, else a grade."""
        tool = request["tool_choice"]["name"]
        answer = {"record_screening": self.guard, "record_confirmation": self.confirm}.get(tool, self.script)
        return message(answer(request), tool=tool)

    def batch(self, batch_id: str) -> dict[str, Any]:
        count = len(self.batches[batch_id])
        ended = self.batch_ready
        return {"id": batch_id, "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
                "request_counts": {"processing": 0 if ended else count, "succeeded": count if ended else 0,
                                   "errored": 0, "canceled": 0, "expired": 0},
                "created_at": "2026-12-01T00:00:00Z", "expires_at": "2026-12-02T00:00:00Z",
                "ended_at": "2026-12-01T00:01:00Z" if ended else None, "archived_at": None,
                "cancel_initiated_at": None,
                "results_url": f"{self.url}/v1/messages/batches/{batch_id}/results" if ended else None}

    def posts(self, path: str, tool: str | None = None) -> list[Any]:
        """The bodies POSTed to ``path``; with ``tool``, only the Messages requests that force it
        (``record_grade``: the drafts, without the evidence confirmations and guard requests)."""
        return [body for method, p, body in self.requests if method == "POST" and p == path
                and (tool is None or body.get("tool_choice", {}).get("name") == tool)]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
