"""Sending grading requests through the ``anthropic`` SDK: live (a bounded number in flight,
the SDK retrying 429 / 529 / 5xx / timeouts with backoff) or as one Message Batch (half
price; resumable from the batch id kept in the output folder). Usage, cost and the budget
are accounted here."""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grader.rubric import LLMSettings, Prices

if TYPE_CHECKING:   # imported when a client is made: every grading process imports this module, few send
    import anthropic

BATCH_STATE = "llm_batch.json"     # the batch in flight, for resuming after an interruption


@dataclass
class Job:
    key: str                 # the cache key: also the batch custom_id (opaque: no student name or id)
    params: dict[str, Any]   # messages.create keyword arguments


@dataclass
class Reply:
    content: list[dict[str, Any]] | None   # the message's content blocks, or None
    problem: str | None = None             # why there is no reply


@dataclass
class Usage:
    """Tokens and estimated cost of one run (prices from the rubric)."""

    requests: int = 0     # answered (the tokens and cost below are theirs)
    failed: int = 0       # sent and not answered: refused, timed out, unreachable, a batch entry errored
    input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def cost_of(self, usage: Any, prices: Prices, batch: bool) -> float:
        per_token = (getattr(usage, "input_tokens", 0) * prices.input
                     + (getattr(usage, "cache_creation_input_tokens", 0) or 0) * prices.cache_write
                     + (getattr(usage, "cache_read_input_tokens", 0) or 0) * prices.cache_read
                     + getattr(usage, "output_tokens", 0) * prices.output) / 1e6
        return per_token * (prices.batch_discount if batch else 1.0)

    def add(self, usage: Any, prices: Prices, batch: bool) -> float:
        cost = self.cost_of(usage, prices, batch)
        self.requests += 1
        self.input_tokens += getattr(usage, "input_tokens", 0)
        self.cache_write_tokens += getattr(usage, "cache_creation_input_tokens", 0) or 0
        self.cache_read_tokens += getattr(usage, "cache_read_input_tokens", 0) or 0
        self.output_tokens += getattr(usage, "output_tokens", 0)
        self.cost_usd += cost
        return cost

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost_usd": round(self.cost_usd, 6)}


class Budget:
    """Stops sending once the estimate would pass ``limit_usd`` (None: no limit). A request
    is estimated from its size before it is sent, and settled at its real cost after."""

    def __init__(self, limit_usd: float | None):
        self.limit, self.committed = limit_usd, 0.0
        self._lock = threading.Lock()

    @staticmethod
    def estimate(params: dict[str, Any], prices: Prices, batch: bool) -> float:
        # About four characters a token; every prompt token priced as uncached input, and
        # every possible output token spent: an upper bound.
        prompt_tokens = len(json.dumps(params)) / 3.5
        cost = (prompt_tokens * prices.input + params["max_tokens"] * prices.output) / 1e6
        return cost * (prices.batch_discount if batch else 1.0)

    def reserve(self, amount: float) -> bool:
        with self._lock:
            if self.limit is not None and self.committed + amount > self.limit:
                return False
            self.committed += amount
            return True

    def settle(self, reserved: float, actual: float) -> None:
        with self._lock:
            self.committed += actual - reserved

    def refusal(self) -> str:
        return f"not sent: the LLM budget of ${self.limit:g} would be passed (--llm-budget)"


def make_client(settings: LLMSettings) -> anthropic.Anthropic | None:
    """The SDK client from ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL), or None without a key."""
    key = os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        return None
    import anthropic
    return anthropic.Anthropic(api_key=key, base_url=os.environ.get("ANTHROPIC_BASE_URL") or None,
                               max_retries=settings.max_retries, timeout=settings.timeout_s)


def _problem(exc: Exception) -> str:
    import anthropic   # a client made this exception: imported already
    if isinstance(exc, anthropic.APITimeoutError):
        return "the API did not answer in time (after retries)"
    if isinstance(exc, anthropic.APIConnectionError):
        return f"the API could not be reached: {exc}"
    if isinstance(exc, anthropic.APIStatusError):
        return f"the API answered {exc.status_code}: {str(exc)[:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [block.model_dump() if hasattr(block, "model_dump") else dict(block) for block in content or []]


def send_live(client: anthropic.Anthropic, jobs: list[Job], settings: LLMSettings, usage: Usage,
              budget: Budget, progress: Callable[[int, int], None]) -> dict[str, Reply]:
    """Every job as its own request, ``settings.concurrency`` at a time."""
    replies: dict[str, Reply] = {}
    lock = threading.Lock()

    def one(job: Job) -> None:
        estimate = Budget.estimate(job.params, settings.prices, False)
        if not budget.reserve(estimate):
            reply = Reply(None, budget.refusal())
        else:
            try:
                message = client.messages.create(**job.params)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a reason on the item
                budget.settle(estimate, 0.0)
                reply = Reply(None, _problem(exc))
                with lock:
                    usage.failed += 1
            else:
                with lock:
                    cost = usage.add(message.usage, settings.prices, False)
                budget.settle(estimate, cost)
                reply = Reply(_blocks(message.content))
        with lock:
            replies[job.key] = reply
            progress(len(replies), len(jobs))

    with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
        list(pool.map(one, jobs))
    return replies


def send_batch(client: anthropic.Anthropic, jobs: list[Job], settings: LLMSettings, usage: Usage,
               budget: Budget, out_dir: Path, progress: Callable[[int, int], None],
               poll_s: float = 30.0, wait_s: float = 24 * 3600) -> dict[str, Reply]:
    """All jobs in one Message Batch, polled until it ends (or ``wait_s`` passes: the batch id
    stays in ``out_dir/llm_batch.json`` and the next run resumes it instead of paying twice)."""
    replies: dict[str, Reply] = {}
    state_path = out_dir / BATCH_STATE
    by_key = {job.key: job for job in jobs}
    state = _read_state(state_path)
    if state and set(state["keys"]) <= set(by_key):
        batch_id, sent = state["id"], state["keys"]
    else:
        sent = []
        for job in jobs:
            if budget.reserve(Budget.estimate(job.params, settings.prices, True)):
                sent.append(job.key)
            else:
                replies[job.key] = Reply(None, budget.refusal())
        if not sent:
            return replies
        try:
            batch = client.messages.batches.create(
                requests=[{"custom_id": key, "params": by_key[key].params} for key in sent])
        except Exception as exc:  # noqa: BLE001
            return {**replies, **{key: Reply(None, _problem(exc)) for key in sent}}
        batch_id = batch.id
        state_path.write_text(json.dumps({"id": batch_id, "keys": sent}))
    for key in set(by_key) - set(sent) - set(replies):
        replies[key] = Reply(None, "not in the batch being resumed; it is sent by the next run")
    deadline = time.monotonic() + wait_s
    try:
        while True:
            batch = client.messages.batches.retrieve(batch_id)
            counts = batch.request_counts
            progress(len(sent) - counts.processing, len(sent))
            if batch.processing_status == "ended":
                break
            if time.monotonic() + poll_s > deadline:
                return {**replies, **{key: Reply(None, f"batch {batch_id} is still running; run the same "
                                                       "command again to collect it") for key in sent}}
            time.sleep(poll_s)
        for entry in client.messages.batches.results(batch_id):
            if entry.custom_id not in by_key:
                continue
            if entry.result.type == "succeeded":
                usage.add(entry.result.message.usage, settings.prices, True)
                replies[entry.custom_id] = Reply(_blocks(entry.result.message.content))
            else:
                usage.failed += 1
                replies[entry.custom_id] = Reply(None, f"the batch request {entry.result.type}")
    except Exception as exc:  # noqa: BLE001 - the batch id is kept: the next run resumes
        return {**replies, **{key: Reply(None, f"{_problem(exc)}; the batch is kept and the next run resumes it")
                              for key in sent if key not in replies}}
    state_path.unlink(missing_ok=True)
    for key in sent:
        replies.setdefault(key, Reply(None, "the batch returned no result for this request"))
    return replies


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
        return state if isinstance(state.get("id"), str) and isinstance(state.get("keys"), list) else None
    except (OSError, ValueError, AttributeError):
        return None
