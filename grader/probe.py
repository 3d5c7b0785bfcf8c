"""Stage 3, probe: run the grafted module (``grader.graft``) on grader-chosen inputs, inside the sandbox.

Outputs come back through the harness's supervisor (which never runs student code) as npy /
JSON, and are read here with pickle disabled and size limits.
"""
from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grader.execute import GRADING_ENV
from grader.harness import HARNESS_DIR
from grader.harness.cpu_time import BACKSTOP, IDLE
from grader.rubric import Limits
from grader.sandbox import MemoryShare, Sandbox
from grader.untrusted import float_array, json_object, seconds

MAX_PROBE_OUTPUT_BYTES = 256 * 2**20   # everything the supervisor relays in one run
MAX_ARRAYS = 400                       # in one worker's message
MAX_STATE_ARRAYS = 8                   # a state is relayed as at most this many arrays
MAX_RESTARTS = 12
MAX_FORKS_PER_FRAME = 1   # a frame's record counts the workers its case or segment started: one, or none
HARNESS_SCRIPTS = ("probe_harness.py", "cpu_time.py", "syscall_filter.py")   # the harness and what it imports
GIVE_UP_AFTER = 2   # hung or crashed cases of one group before the rest of that group is skipped
FILTER_NOTE = ("the probe ran without its seccomp filter (not x86_64, or refused): its workers could "
               "exec programs and use System V IPC")


@dataclass(frozen=True)
class Segments:
    """A case run as a chain of workers that hand on a state.

    Each worker gets its own slice ``bounds[k]`` of the input ``array`` along ``axis`` and the
    state the previous worker's handler saved, relayed by the supervisor as plain arrays; no
    worker sees the rest. The outputs the case keeps are joined along ``axis``. ``unit`` and
    ``state`` only word the messages: what the axis counts, and what the state must be.
    """

    array: str
    bounds: tuple[tuple[int, int], ...]
    axis: int = 1
    unit: str = "positions"
    state: str = "a tensor or a tuple of tensors"


@dataclass(frozen=True)
class ProbeCase:
    """One run of the student's code on grader-chosen inputs, as data.

    ``kind`` names the harness handler: ``call`` (functions of the module by name, with the
    arguments ``config["calls"]`` lists) or one the checks module's driver file defines.
    ``keep`` lists the output arrays the checks read; the rest of a worker's message is
    dropped. Cases of one ``group`` (default: their kind) are given up together after
    ``GIVE_UP_AFTER`` of them hang or crash the probe.

    Consecutive cases with the same non-empty ``batch`` share one worker, one after another
    (the harness's docstring says how they are kept apart). Give a key only to cases whose
    every verdict compares them with values computed from their own inputs, or with cases
    given the same arrays: code that runs a later case of the batch may have kept what the
    earlier ones received. Never to cases compared for what differs between their inputs
    (a causality pair), or to unsegmented cases that measure a state. Segmented cases with
    one key run in passes: the first segment of each in one worker, then the second of each
    in another, so no worker sees two segments of one case and every state is still the one
    the harness relayed across a cut.
    """

    name: str
    kind: str
    config: dict[str, Any]
    arrays: dict[str, np.ndarray]
    keep: tuple[str, ...] = ()
    segments: Segments | None = None
    group: str = ""
    batch: str = ""

    @property
    def family(self) -> str:
        return self.group or self.kind


@dataclass
class CaseOutput:
    status: str                    # ok | error | timeout | not_run
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # segmented cases: the state saved at the end of each segment, as the supervisor relayed
    # it (measured here, never reported by the student's process)
    states: list[list[np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class CaseCost:
    """What one probe case cost the supervisor: wall seconds, and workers forked (a timing)."""

    seconds: float = 0.0
    forks: int = 0

    def __add__(self, other: CaseCost) -> CaseCost:
        return CaseCost(round(self.seconds + other.seconds, 4), self.forks + other.forks)


@dataclass
class ProbeResult:
    import_status: str             # ok | error | not_run
    import_error: str | None
    cases: dict[str, CaseOutput]
    notes: list[str] = field(default_factory=list)
    # Timings (decide nothing), over every run of the harness: from launch until its supervisor
    # was ready to start workers, and from then on (the import check and the cases).
    start_seconds: float = 0.0
    cases_seconds: float = 0.0
    # Per case (and ``import``): the supervisor's wall seconds for it and the workers it started,
    # summed over the runs; read by ``make bench`` (where the probe's time goes), never graded.
    costs: dict[str, CaseCost] = field(default_factory=dict)

    def costs_by_kind(self, cases: list[ProbeCase]) -> dict[str, tuple[int, CaseCost]]:
        """Per kind of ``cases``, in their order: how many ran (a recorded wall time) and what
        they cost together (``make bench`` prints it)."""
        found: dict[str, tuple[int, CaseCost]] = {}
        for case in cases:
            cost = self.costs.get(case.name)
            if cost is not None and cost.seconds > 0:
                count, total = found.get(case.kind, (0, CaseCost()))
                found[case.kind] = (count + 1, total + cost)
        return found

    def stages(self) -> list[tuple[str, float]]:
        """Where the probe's time went: ``probe_start``, then ``probe_cases``."""
        return [("probe_start", round(self.start_seconds, 3)), ("probe_cases", round(self.cases_seconds, 3))]

    def backstop(self) -> str | None:
        """What a wall-clock backstop stopped (the import, a case, or the whole run), or None.
        The supervisor's and the sandbox's words begin these errors; student code's never do."""
        found = [f"importing your code: {self.import_error}"] if (self.import_error or "").startswith(BACKSTOP) else []
        found += [f"probe case {name}: {out.error}" for name, out in self.cases.items()
                  if out.status == "timeout" and (out.error or "").startswith(BACKSTOP)]
        found += [note for note in self.notes if note.startswith(BACKSTOP)]
        return found[0] if found else None


# ----------------------------------------------------------------------------- kept

KEPT_DTYPE = re.compile(r"[<>|=]?f(2|4|8|16)")   # the float arrays the probe keeps (see float_array)


def probe_record(result: ProbeResult, blobs: list[bytes]) -> dict[str, Any]:
    """``result`` as JSON for the kept run (``grader.pipeline``): each array's bytes are
    appended to ``blobs``, and it is recorded as [its index there, its dtype, its shape]."""
    def blob(value: np.ndarray) -> list[Any]:
        blobs.append(np.ascontiguousarray(value).tobytes())
        return [len(blobs) - 1, value.dtype.str, list(value.shape)]
    return {"import_status": result.import_status, "import_error": result.import_error, "notes": list(result.notes),
            "cases": {name: {"status": out.status, "error": out.error, "info": out.info,
                             "arrays": {key: blob(value) for key, value in out.arrays.items()},
                             "states": [[blob(a) for a in state] for state in out.states]}
                      for name, out in result.cases.items()}}


def probe_from_record(record: Any, blobs: list[bytes]) -> ProbeResult | None:
    """``probe_record`` read back, or None when it is not one. The arrays hold what student code
    produced: only float dtypes, each blob exactly its shape's size, copied out (no pickle, no
    object arrays, no view of the file)."""
    def array(entry: Any) -> np.ndarray:
        index, dtype, shape = entry
        if not (type(index) is int and 0 <= index < len(blobs) and isinstance(dtype, str)
                and KEPT_DTYPE.fullmatch(dtype) and isinstance(shape, list)
                and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError("not a kept array")
        kind = np.dtype(dtype)
        if math.prod(shape) * kind.itemsize != len(blobs[index]):
            raise ValueError("a kept array of the wrong size")
        return np.frombuffer(blobs[index], dtype=kind).reshape(shape).copy()
    try:
        cases = {}
        for name, out in record["cases"].items():
            if not (isinstance(out["status"], str) and isinstance(out["error"], (str, type(None)))
                    and isinstance(out["info"], dict) and isinstance(out["arrays"], dict)):
                return None
            cases[name] = CaseOutput(out["status"], out["error"], out["info"],
                                     {str(key): array(entry) for key, entry in out["arrays"].items()},
                                     [[array(entry) for entry in state] for state in out["states"]])
        status, error, notes = record["import_status"], record["import_error"], record["notes"]
        if not (isinstance(status, str) and isinstance(error, (str, type(None)))
                and all(isinstance(n, str) for n in notes)):
            return None
        return ProbeResult(status, error, cases, list(notes))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# ----------------------------------------------------------------------------- run

def run_probe(module_source: str, probe_cases: list[ProbeCase], sandbox: Sandbox, scratch: Path,
              case_timeout: float, driver: Path | None = None,
              backstop_factor: float = Limits.wall_backstop_factor, share: MemoryShare | None = None,
              idle_timeout: float = Limits.idle_timeout_s) -> ProbeResult:
    """Run every case, restarting the harness after its supervisor dies (killed by student
    code, or by a sandbox limit).

    The harness runs read-only: it gets its request on stdin and answers on stdout (see
    harness/probe_harness.py), so nothing a worker writes can reach the grader or another
    worker. Each worker's message is parsed here, with pickle disabled and size limits.
    ``driver`` is the checks module's driver file (its handlers), sent with the request.
    ``case_timeout`` is CPU seconds per worker, as is the whole run's limit (every worker's
    and some to spare); each has a wall-clock backstop ``backstop_factor`` times as long.
    A worker idle for ``idle_timeout`` seconds is stopped as hung, and so is the whole run once
    idle for longer than its groups' give-ups allow; a run stopped as hung is not restarted.
    The runs' memory is counted in ``share``, with the submission's other runs.
    """
    driver_source = driver.read_text(encoding="utf-8") if driver else None
    by_name = {c.name: c for c in probe_cases}
    outputs: dict[str, CaseOutput] = {}
    notes: list[str] = []
    remaining = [c.name for c in probe_cases]
    import_status, import_error = "not_run", None
    deaths: dict[str, int] = {}
    start_seconds = cases_seconds = 0.0
    costs: dict[str, CaseCost] = {}
    harness = scratch / "probe_harness.py"
    for script in HARNESS_SCRIPTS:
        shutil.copy(HARNESS_DIR / script, scratch / script)
    for _ in range(MAX_RESTARTS + 1):
        cases = [by_name[n] for n in remaining]
        workers = sum(len(c.segments.bounds) if c.segments else 1 for c in cases)
        cpu_limit = case_timeout * (workers + 1) + 30
        # Idle workers, each stopped at idle_timeout, until every group has given up: no longer.
        idle_limit = idle_timeout * (GIVE_UP_AFTER * len({c.family for c in cases}) + 1)
        # The notebook's environment (grading mode), so that the student's code cannot tell the
        # probe's runs from the notebook's by it.
        result = sandbox.run([sys.executable, str(harness)], scratch=scratch, cpu_limit=cpu_limit, env=GRADING_ENV,
                             timeout=cpu_limit * backstop_factor, idle_limit=idle_limit, read_only=True,
                             stdin=harness_request(module_source, cases, case_timeout, sandbox.own_pid_namespace,
                                                   driver_source, backstop_factor, idle_timeout),
                             output_bytes=MAX_PROBE_OUTPUT_BYTES, share=share)
        notes.extend(reason for reason in result.stopped if reason not in notes)
        answer = read_answer(result.stdout_bytes, cases)
        ready = None if answer is None or answer.ready is None else seconds(answer.ready - result.started,
                                                                             result.wall_seconds)
        start_seconds += result.wall_seconds if ready is None else ready
        cases_seconds += 0.0 if ready is None else result.wall_seconds - ready
        if answer is None:
            import_status, import_error = "error", _process_death("importing your code", result)
            break
        for name, cost in answer.costs.items():
            costs[name] = costs.get(name, CaseCost()) + cost
        if sandbox.sandboxed and not answer.syscall_filter and FILTER_NOTE not in notes:
            notes.append(FILTER_NOTE)
        import_status, import_error = answer.import_status, answer.import_error
        if import_status != "ok":
            break
        outputs.update(answer.outputs)
        remaining = [n for n in remaining if n not in answer.outputs]
        if not remaining or result.hung:
            break
        # The supervisor died during a case (the one it said it was running, else the first
        # not ended): record that, skip that group after repeated deaths, and go on with the rest.
        dying = answer.running if answer.running in remaining else remaining[0]
        dead = by_name[dying].family
        deaths[dead] = deaths.get(dead, 0) + 1
        outputs[dying] = CaseOutput("error", _process_death(f"probe case {dying}", result))
        if deaths[dead] >= GIVE_UP_AFTER:
            for name in remaining:
                if by_name[name].family == dead and name != dying:
                    outputs[name] = CaseOutput("error", f"not run: {GIVE_UP_AFTER} earlier {dead} cases "
                                                        "crashed the probe")
        remaining = [n for n in remaining if n not in outputs]
        if not remaining:
            break
    stopped = next((reason for reason in result.stopped if reason.startswith(IDLE)), None) if result.hung else None
    for name in remaining:
        outputs.setdefault(name, CaseOutput("not_run", f"not run: the probe was {stopped}" if stopped
                                            else "the probe stopped before this case"))
    return ProbeResult(import_status, import_error, outputs, notes, start_seconds, cases_seconds, costs)


def harness_request(module_source: str, cases: list[ProbeCase], case_timeout: float, own_pid_namespace: bool,
                    driver_source: str | None = None,
                    backstop_factor: float = Limits.wall_backstop_factor,
                    idle_timeout: float = Limits.idle_timeout_s) -> bytes:
    """The harness's stdin: the plan, then every array as npy. A segmented case's input is
    sent as one ``name@k`` per segment, and the supervisor gives each worker only its own.
    A worker may use ``case_timeout`` CPU seconds, within ``backstop_factor`` times that wall,
    and make no CPU progress for ``idle_timeout`` seconds."""
    blobs: list[bytes] = []
    planned = []
    for case in cases:
        arrays = dict(case.arrays)
        if case.segments:
            cut = case.segments
            whole = arrays.pop(cut.array)
            arrays.update({f"{cut.array}@{k}": np.take(whole, range(a, b), axis=cut.axis)
                           for k, (a, b) in enumerate(cut.bounds)})
        sizes = []
        for name, value in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(value), allow_pickle=False)
            blobs.append(buffer.getvalue())
            sizes.append([name, len(blobs[-1])])
        planned.append({"name": case.name, "kind": case.kind, "group": case.family, "config": case.config,
                        "segments": [list(b) for b in case.segments.bounds] if case.segments else None,
                        "batch": case.batch, "arrays": sizes})
    # kill_all: the supervisor may kill every process it can signal, which is safe only
    # inside the sandbox's own PID namespace.
    plan = json.dumps({"module_source": module_source, "driver_source": driver_source, "case_timeout": case_timeout,
                       "case_backstop": case_timeout * backstop_factor, "idle_timeout": idle_timeout,
                       "kill_all": own_pid_namespace, "give_up_after": GIVE_UP_AFTER,
                       "cases": planned}).encode()
    return b"".join([struct.pack(">Q", len(plan)), plan, *blobs])


RUNNING = "running"   # a record the supervisor writes before a segment of a batch run in passes


def _frames(stream: bytes) -> dict[str, list[tuple[dict[str, Any], bytes]]]:
    """The supervisor's frames, by case, in order (a frame cut short by its death is dropped),
    and under ``RUNNING`` the record of the segment it began last, when nothing came after it."""
    frames: dict[str, list[tuple[dict[str, Any], bytes]]] = {}
    at = 0
    while at + 8 <= len(stream):
        size = struct.unpack(">Q", stream[at: at + 8])[0]
        record = json_object(stream[at + 8: at + 8 + size])
        at += 8 + size
        if at + 8 > len(stream):
            break
        size = struct.unpack(">Q", stream[at: at + 8])[0]
        message = stream[at + 8: at + 8 + size]
        at += 8 + size
        if record is None or at > len(stream):
            break
        frames.pop(RUNNING, None)
        key = RUNNING if record.get("status") == RUNNING else str(record.get("case"))
        frames.setdefault(key, []).append((record, message))
    return frames


@dataclass
class HarnessAnswer:
    """What one run of the harness said: whether the module imported, and the output of
    every case it finished, in plan order (a case its supervisor died in, or never reached,
    has none)."""

    import_status: str                  # ok | error
    import_error: str | None
    outputs: dict[str, CaseOutput]
    syscall_filter: bool
    ready: float | None = None          # when the supervisor was ready (its monotonic clock), a timing
    costs: dict[str, CaseCost] = field(default_factory=dict)   # per case and import, a timing
    running: str | None = None          # the case whose segment began last and never ended (it died there)


def read_answer(stream: bytes, cases: list[ProbeCase]) -> HarnessAnswer | None:
    """The harness's stdout read back (None: it died before reporting the import)."""
    frames = _frames(stream)
    running = next((str(record.get("case")) for record, _ in frames.pop(RUNNING, [])), None)
    costs = {name: sum((_cost(record) for record, _ in found), CaseCost()) for name, found in frames.items()}
    import_frames = frames.pop("import", [])
    if not import_frames:
        return None
    record, data = import_frames[0]
    message = parse_message(data) if record.get("status") == "ok" else None
    syscall_filter = bool(record.get("syscall_filter"))
    ready = seconds(record.get("ready"), float("inf"))
    if message is None or not message.ok:
        error = message.error if message else str(record.get("error") or "the import failed")
        return HarnessAnswer("error", error, {}, syscall_filter, ready, costs)
    outputs: dict[str, CaseOutput] = {}
    for case in cases:
        output = _case_output(case, frames.get(case.name, []))
        if output is not None:   # None: not ended (the supervisor died during it, or before it)
            outputs[case.name] = output
    return HarnessAnswer("ok", None, outputs, syscall_filter, ready, costs, running)


def _cost(record: dict[str, Any]) -> CaseCost:
    """A frame's timing as the supervisor recorded it (zero where it recorded none)."""
    forks = record.get("forks")
    return CaseCost(seconds(record.get("seconds"), 86_400.0) or 0.0,
                    forks if type(forks) is int and 0 <= forks <= MAX_FORKS_PER_FRAME else 0)


@dataclass
class WorkerMessage:
    """What one worker sent: its status, float arrays by name, and its details (JSON)."""

    ok: bool
    arrays: dict[str, np.ndarray]
    details: dict[str, Any]

    @property
    def error(self) -> str:
        return str(self.details.get("error") or "no error message")[:2000]

    def state(self) -> list[np.ndarray] | None:
        """The ``state.0``, ``state.1``... arrays (what the supervisor relays), if complete."""
        found = [self.arrays.get(f"state.{i}") for i in range(MAX_STATE_ARRAYS)]
        count = next((i for i, value in enumerate(found) if value is None), MAX_STATE_ARRAYS)
        extra = any(f"state.{i}" in self.arrays for i in range(count, MAX_STATE_ARRAYS))
        return found[:count] if count and not extra else None


def parse_message(data: bytes) -> WorkerMessage | None:
    """A worker's message (see ``send`` in the harness), or None when malformed. Only float
    arrays are kept; npy is read with pickle disabled."""
    try:
        view = memoryview(data)
        count, at, arrays = struct.unpack(">I", view[1:5])[0], 5, {}
        if count > MAX_ARRAYS:
            return None
        for _ in range(count):
            length = struct.unpack(">H", view[at: at + 2])[0]
            name = bytes(view[at + 2: at + 2 + length]).decode("ascii")
            at += 2 + length
            length = struct.unpack(">Q", view[at: at + 8])[0]
            value = float_array(bytes(view[at + 8: at + 8 + length]))
            if value is not None:
                arrays[name] = value
            at += 8 + length
        length = struct.unpack(">Q", view[at: at + 8])[0]
        details = json_object(bytes(view[at + 8: at + 8 + length]))
        if details is None or at + 8 + length != len(view):
            return None
        return WorkerMessage(view[0] == 0, arrays, details)
    except (struct.error, UnicodeDecodeError, IndexError):
        return None


def _process_death(what: str, result: Any) -> str:
    if result.timed_out:
        return f"the probe was stopped at its time limit while {what} ({'; '.join(result.stopped)})"
    stopped = f" ({'; '.join(result.stopped)})" if result.stopped else ""
    tail = result.stderr.strip().splitlines()[-3:]
    detail = f": {' | '.join(tail)}" if tail else ""
    return f"the probe's supervisor exited (status {result.returncode}) while {what}{stopped}{detail}"


def _case_output(case: ProbeCase, frames: list[tuple[dict[str, Any], bytes]]) -> CaseOutput | None:
    """A case's output from its frames, or None when the supervisor died before it ended.
    Only the arrays the case keeps are read; a segmented case's outputs are joined, and the
    states handed between its segments are measured here. A segmented case that fails part
    way keeps the outputs and states of the segments before the failure."""
    cut = case.segments
    messages: list[WorkerMessage] = []
    failure: tuple[str, str] | None = None
    for index, (record, data) in enumerate(frames):
        where = f" ({cut.unit} {cut.bounds[index][0]} to {cut.bounds[index][1] - 1})" if cut and len(cut.bounds) > 1 else ""
        message = parse_message(data) if record.get("status") == "ok" else None
        if record.get("status") != "ok":
            status = {"timeout": "timeout", "skipped": "not_run"}.get(str(record.get("status")), "error")
            failure = status, f"{record.get('error') or 'the case failed'}{where}"
        elif message is None:
            failure = "error", f"the probe could not read this case's outputs{where}"
        elif not message.ok:
            failure = "error", message.error + where
        elif cut and index + 1 < len(cut.bounds) and message.state() is None:
            messages.append(message)
            failure = "error", f"the state could not be handed to the next segment: it must be {cut.state}{where}"
        if failure:
            break
        messages.append(message)
    if failure is None and len(messages) < (len(cut.bounds) if cut else 1):
        return None
    if cut is None or not messages:
        if failure:
            return CaseOutput(*failure)
        last = messages[-1]
        return CaseOutput("ok", None, _info(last), {name: last.arrays[name] for name in case.keep if name in last.arrays})
    joined = _joined_segments(messages, case)
    if failure:
        return CaseOutput(*failure, joined.info, joined.arrays, joined.states)
    return joined


def _info(message: WorkerMessage) -> dict[str, Any]:
    info = message.details.get("info")
    return info if isinstance(info, dict) else {}


def _joined_segments(messages: list[WorkerMessage], case: ProbeCase) -> CaseOutput:
    """The segments of a run as one output: each kept array joined along the cut axis, and
    the state relayed after each segment."""
    axis = case.segments.axis if case.segments else 0
    states = [m.state() or [] for m in messages]
    info = {**_info(messages[-1]), "states": [[list(a.shape) for a in state] for state in states]}
    arrays = {}
    for name in case.keep:
        pieces = [m.arrays.get(name) for m in messages]
        if any(p is None or p.ndim <= axis for p in pieces) or len({p.shape[:axis] + p.shape[axis + 1:] for p in pieces}) > 1:
            return CaseOutput("error", f"the outputs {name} of the segments could not be joined along axis {axis}: "
                                       f"their shapes are {[None if p is None else list(p.shape) for p in pieces]}",
                              info, {}, states)
        arrays[name] = np.concatenate(pieces, axis=axis)
    return CaseOutput("ok", None, info, arrays, states)
