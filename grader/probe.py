"""Stage 3, probe: run the student's scaffold on grader-chosen inputs, inside the sandbox.

The module the harness imports is built here from the grader's own copy of the provided
code (the master notebook's ``provided`` cells) and only the student-written parts of each
scaffold cell: the symbols its metadata declares (functions, or methods of a class whose
other members stay the grader's), plus their own helper imports and functions.
Redefinitions of provided names are dropped.
Outputs come back through the harness's supervisor (which never runs student code) as npy /
JSON, and are read here with pickle disabled and size limits.
"""
from __future__ import annotations

import ast
import copy
import io
import json
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import numpy as np

from grader import cells
from grader.harness import HARNESS_DIR
from grader.sandbox import Sandbox
from grader.untrusted import float_array, json_object

MAX_PROBE_OUTPUT_BYTES = 256 * 2**20   # everything the supervisor relays in one run
MAX_ARRAYS = 400                       # in one worker's message
MAX_STATE_ARRAYS = 8                   # a state is relayed as at most this many arrays
MAX_RESTARTS = 12
GIVE_UP_AFTER = 2   # hung or crashed cases of one kind before the rest of that kind is skipped
# The arrays kept per kind of case (the grader reads nothing else); a ``steps`` case also
# keeps the state relayed after each of its segments (``CaseOutput.states``).
OUTPUT_ARRAYS = {"forward": ("y", "decay"), "steps": ("y",), "state_growth": (), "hybrid": ("logits",)}
FILTER_NOTE = ("the probe ran without its seccomp filter (not x86_64, or refused): its workers could "
               "exec programs and use System V IPC")


class GraftError(ValueError):
    """The student's scaffold cell cannot be combined with the provided code."""


@dataclass(frozen=True)
class ProbeCase:
    name: str
    kind: str                      # a handler in harness/probe_harness.py
    config: dict[str, Any]
    arrays: dict[str, np.ndarray]


@dataclass
class CaseOutput:
    status: str                    # ok | error | timeout | not_run
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # ``steps`` cases: the state step returned at the end of each segment, as the supervisor
    # relayed it (measured here, never reported by the student's process)
    states: list[list[np.ndarray]] = field(default_factory=list)


@dataclass
class ProbeResult:
    import_status: str             # ok | error | not_run
    import_error: str | None
    cases: dict[str, CaseOutput]
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- graft

def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _import_targets(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    """Name bound -> what it is bound to ("module" or "module:attribute"), for one import."""
    targets = {}
    for alias in node.names:
        if isinstance(node, ast.Import):
            module = alias.name if alias.asname else alias.name.split(".")[0]
            targets[alias.asname or alias.name.split(".")[0]] = module
        else:
            targets[alias.asname or alias.name] = f"{'.' * node.level}{node.module or ''}:{alias.name}"
    return targets


def _provided_imports(sources: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_import_targets(node))
    return found


def _strip_provided_imports(node: ast.Import | ast.ImportFrom, provided_names: set[str],
                            provided_imports: dict[str, str]) -> tuple[ast.stmt | None, list[str]]:
    """The import without the names it would rebind from the provided code (None if nothing is
    left), and the rebound names that differ from the provided binding (for a note).

    ``import torch`` next to the provided ``import torch`` changes nothing and goes silently;
    ``from math import pi as EPS`` would change the provided EPS and is dropped with a note, as
    is a star import (it could rebind anything).
    """
    targets = _import_targets(node)
    if "*" in targets:
        return None, ["*"]
    kept = [alias for alias in node.names if (alias.asname or alias.name.split(".")[0]) not in provided_names]
    rebound = sorted(name for name, target in targets.items()
                     if name in provided_names and provided_imports.get(name) != target)
    if not kept:
        return None, rebound
    stripped = copy.copy(node)
    stripped.names = kept
    return stripped, rebound


def _member_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found[-1] if found else None


def graft_scaffold(master_scaffold: str, student_scaffold: str, provided_names: set[str],
                   scaffold: cells.Scaffold, provided_imports: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """One scaffold cell as the probe runs it: the student's declared symbols, inside the
    grader's copy of each scaffold class (its other members), with the student's own helpers.

    Returns (source, notes). Student members named like a provided member are ignored, as
    are top-level statements that are not imports or definitions, and definitions or
    imports that would rebind a provided name (``provided_imports``: what the provided code's
    own imports bind, see ``_strip_provided_imports``).
    """
    master_tree = ast.parse(master_scaffold)
    try:
        student_tree = ast.parse(student_scaffold)
    except SyntaxError as exc:
        raise GraftError(f"the scaffold cell is not valid Python: line {exc.lineno}: {exc.msg}") from exc
    notes: list[str] = []
    classes = [owner for owner in scaffold.owners if scaffold.methods(owner)]
    grafted = [_graft_class(_find_class(master_tree, name), _find_class(student_tree, name),
                            scaffold.methods(name), notes) for name in classes]
    defined = {n.name for n in student_tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [owner for owner in scaffold.owners if owner not in classes and owner not in defined]
    if missing:
        notes.append(f"the scaffold cell defines no {', '.join(missing)}")
    extras = []
    for node in student_tree.body:
        if isinstance(node, ast.Expr) or (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        names = _top_level_names(ast.Module(body=[node], type_ignores=[]))
        if not names or not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                              ast.ClassDef, ast.Assign, ast.AnnAssign)):
            notes.append(f"scaffold cell line {node.lineno}: statement ignored by the grader")
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            line = node.lineno
            node, rebound = _strip_provided_imports(node, provided_names, provided_imports or {})
            if rebound == ["*"]:
                notes.append(f"scaffold cell line {line}: a star import is ignored by the grader; "
                             "import the names you use")
            elif rebound:
                notes.append(f"redefinition of provided {', '.join(rebound)} ignored; "
                             "the grader uses its own copy")
            if node is not None:
                extras.append(node)
            continue
        clash = names & provided_names
        if clash:
            notes.append(f"redefinition of provided {', '.join(sorted(clash))} ignored; "
                         "the grader uses its own copy")
            continue
        extras.append(node)
    module = ast.Module(body=extras + grafted, type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module)), notes


def _graft_class(master_class: ast.ClassDef | None, student_class: ast.ClassDef | None,
                 student_methods: frozenset[str], notes: list[str]) -> ast.ClassDef:
    """The master's class with the student's methods (and own members) in place of its own."""
    if master_class is None:
        raise GraftError("the master notebook's scaffold cell lacks a class it declares")
    if student_class is None:
        raise GraftError(f"the scaffold cell does not define class {master_class.name}")
    provided_members = {_member_name(n) for n in master_class.body} - {None} - student_methods
    body = [n for n in master_class.body if _member_name(n) not in student_methods]
    for node in student_class.body:
        name = _member_name(node)
        if name is None and isinstance(node, ast.Assign):   # ``_keys, _values = [], []``
            bound = _top_level_names(ast.Module(body=[node], type_ignores=[]))
            bound |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if bound and not bound & provided_members:
                body.append(node)
            continue
        if name is None:
            continue  # docstrings and stray expressions
        if name in provided_members:
            continue  # the grader's copy of provided members is authoritative
        body.append(node)
    missing = student_methods - {_member_name(n) for n in student_class.body}
    if missing:
        notes.append(f"{master_class.name} defines no {', '.join(sorted(missing))}")
    return ast.ClassDef(name=master_class.name, bases=master_class.bases, keywords=master_class.keywords,
                        body=body, decorator_list=[], type_params=[])


def submission_module_source(master: nbformat.NotebookNode,
                             student_scaffolds: dict[str, str]) -> tuple[str, list[str]]:
    """Provided cells of the master (in order) with each grafted scaffold cell in its place;
    ``student_scaffolds`` maps each scaffold cell id to the student's cell."""
    declared = {s.cell_id: s for s in cells.scaffolds(master)}
    if not declared:
        raise GraftError("the master notebook has no scaffold cell")
    parts: list[str | cells.Scaffold] = []
    provided: list[str] = []
    masters: dict[str, str] = {}
    for cell in master.cells:
        if cell.cell_type != "code":
            continue
        if cells.SCAFFOLD in cells.tags(cell):
            scaffold = declared[str(cell.get("id"))]
            masters[scaffold.cell_id] = cells.source(cell)
            parts.append(scaffold)  # filled once every provided name is known
        elif cells.PROVIDED in cells.tags(cell):
            provided.append(cells.source(cell))
            parts.append(cells.source(cell))
    provided_names = set().union(*(_top_level_names(ast.parse(p)) for p in provided))
    imports = _provided_imports(provided)
    notes: list[str] = []
    sources = []
    for part in parts:
        if isinstance(part, cells.Scaffold):
            if part.cell_id not in student_scaffolds:   # load said why; the other cells are graded
                notes.append(f"{', '.join(part.symbols)}: not found in the notebook, not graded")
                sources.append("")
                continue
            part, graft_notes = graft_scaffold(masters[part.cell_id], student_scaffolds[part.cell_id],
                                               provided_names, part, imports)
            notes.extend(graft_notes)
        sources.append(part)
    return "\n\n\n".join(sources) + "\n", notes


# ----------------------------------------------------------------------------- run

def run_probe(module_source: str, probe_cases: list[ProbeCase], sandbox: Sandbox, scratch: Path,
              case_timeout: float) -> ProbeResult:
    """Run every case, restarting the harness after its supervisor dies (killed by student
    code, or by a sandbox limit).

    The harness runs read-only: it gets its request on stdin and answers on stdout (see
    harness/probe_harness.py), so nothing a worker writes can reach the grader or another
    worker. Each worker's message is parsed here, with pickle disabled and size limits.
    """
    by_name = {c.name: c for c in probe_cases}
    outputs: dict[str, CaseOutput] = {}
    notes: list[str] = []
    remaining = [c.name for c in probe_cases]
    import_status, import_error = "not_run", None
    deaths: dict[str, int] = {}
    harness = scratch / "probe_harness.py"
    shutil.copy(HARNESS_DIR / "probe_harness.py", harness)
    for _ in range(MAX_RESTARTS + 1):
        cases = [by_name[n] for n in remaining]
        workers = sum(len(c.config.get("segments") or [None]) for c in cases)
        result = sandbox.run([sys.executable, str(harness)], scratch=scratch,
                             timeout=case_timeout * (workers + 1) + 30, read_only=True,
                             stdin=harness_request(module_source, cases, case_timeout, sandbox.own_pid_namespace),
                             output_bytes=MAX_PROBE_OUTPUT_BYTES)
        notes.extend(reason for reason in result.stopped if reason not in notes)
        answer = read_answer(result.stdout_bytes, cases)
        if answer is None:
            import_status, import_error = "error", _process_death("importing your code", result)
            break
        if sandbox.sandboxed and not answer.syscall_filter and FILTER_NOTE not in notes:
            notes.append(FILTER_NOTE)
        import_status, import_error = answer.import_status, answer.import_error
        if import_status != "ok":
            break
        outputs.update(answer.outputs)
        finished = len(answer.outputs)
        remaining = remaining[finished:]
        if not remaining:
            break
        # The supervisor died during remaining[0]: record that, skip that kind after repeated
        # deaths, and go on with the rest.
        dead = by_name[remaining[0]].kind
        deaths[dead] = deaths.get(dead, 0) + 1
        outputs[remaining[0]] = CaseOutput("error", _process_death(f"probe case {remaining[0]}", result))
        if deaths[dead] >= GIVE_UP_AFTER:
            for name in remaining[1:]:
                if by_name[name].kind == dead:
                    outputs[name] = CaseOutput("error", f"not run: {GIVE_UP_AFTER} earlier {dead} cases "
                                                        "crashed the probe")
        remaining = [n for n in remaining[1:] if n not in outputs]
        if not remaining:
            break
    for name in remaining:
        outputs.setdefault(name, CaseOutput("not_run", "the probe stopped before this case"))
    return ProbeResult(import_status, import_error, outputs, notes)


def segments_of(case: ProbeCase) -> list[tuple[int, int]] | None:
    """The token ranges a segmented ``steps`` case runs in separate workers (None: one worker)."""
    segments = case.config.get("segments")
    return [(int(a), int(b)) for a, b in segments] if segments else None


def harness_request(module_source: str, cases: list[ProbeCase], case_timeout: float, own_pid_namespace: bool) -> bytes:
    """The harness's stdin: the plan, then every array as npy. A segmented case's ``x`` is
    sent as one ``x@k`` per segment, and the supervisor gives each worker only its own."""
    blobs: list[bytes] = []
    planned = []
    for case in cases:
        arrays = dict(case.arrays)
        segments = segments_of(case)
        if segments:
            x = arrays.pop("x")
            arrays.update({f"x@{k}": x[:, a:b] for k, (a, b) in enumerate(segments)})
        sizes = []
        for name, value in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(value), allow_pickle=False)
            blobs.append(buffer.getvalue())
            sizes.append([name, len(blobs[-1])])
        planned.append({"name": case.name, "kind": case.kind, "config": case.config, "arrays": sizes})
    # kill_all: the supervisor may kill every process it can signal, which is safe only
    # inside the sandbox's own PID namespace.
    plan = json.dumps({"module_source": module_source, "case_timeout": case_timeout,
                       "kill_all": own_pid_namespace, "give_up_after": GIVE_UP_AFTER,
                       "cases": planned}).encode()
    return b"".join([struct.pack(">Q", len(plan)), plan, *blobs])


def _frames(stream: bytes) -> dict[str, list[tuple[dict[str, Any], bytes]]]:
    """The supervisor's frames, by case, in order (a frame cut short by its death is dropped)."""
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
        frames.setdefault(str(record.get("case")), []).append((record, message))
    return frames


@dataclass
class HarnessAnswer:
    """What one run of the harness said: whether the module imported, and the output of
    every case it finished, in plan order (it stops at the case its supervisor died in)."""

    import_status: str                  # ok | error
    import_error: str | None
    outputs: dict[str, CaseOutput]
    syscall_filter: bool


def read_answer(stream: bytes, cases: list[ProbeCase]) -> HarnessAnswer | None:
    """The harness's stdout read back (None: it died before reporting the import)."""
    frames = _frames(stream)
    import_frames = frames.pop("import", [])
    if not import_frames:
        return None
    record, data = import_frames[0]
    message = parse_message(data) if record.get("status") == "ok" else None
    syscall_filter = bool(record.get("syscall_filter"))
    if message is None or not message.ok:
        error = message.error if message else str(record.get("error") or "the import failed")
        return HarnessAnswer("error", error, {}, syscall_filter)
    outputs: dict[str, CaseOutput] = {}
    for case in cases:
        output = _case_output(case, frames.get(case.name, []))
        if output is None:
            break  # the supervisor died during this case
        outputs[case.name] = output
    return HarnessAnswer("ok", None, outputs, syscall_filter)


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
        return f"the probe was stopped by its time limit while {what}"
    stopped = f" ({'; '.join(result.stopped)})" if result.stopped else ""
    tail = result.stderr.strip().splitlines()[-3:]
    detail = f": {' | '.join(tail)}" if tail else ""
    return f"the probe's supervisor exited (status {result.returncode}) while {what}{stopped}{detail}"


def _case_output(case: ProbeCase, frames: list[tuple[dict[str, Any], bytes]]) -> CaseOutput | None:
    """A case's output from its frames, or None when the supervisor died before it ended.
    Only the arrays this kind of case produces are kept; a segmented case's outputs are
    joined, and the states handed between its segments are measured here. A segmented case
    that fails part way keeps the outputs and states of the segments before the failure."""
    segments = segments_of(case)
    messages: list[WorkerMessage] = []
    failure: tuple[str, str] | None = None
    for index, (record, data) in enumerate(frames):
        where = f" (tokens {segments[index][0]} to {segments[index][1] - 1})" if segments else ""
        message = parse_message(data) if record.get("status") == "ok" else None
        if record.get("status") != "ok":
            status = {"timeout": "timeout", "skipped": "not_run"}.get(str(record.get("status")), "error")
            failure = status, f"{record.get('error') or 'the case failed'}{where}"
        elif message is None:
            failure = "error", f"the probe could not read this case's outputs{where}"
        elif not message.ok:
            failure = "error", message.error + where
        elif segments and index + 1 < len(segments) and message.state() is None:
            messages.append(message)
            failure = "error", f"step's state could not be handed to the next call: it must be a tuple of tensors (S, z){where}"
        if failure:
            break
        messages.append(message)
    if failure is None and len(messages) < len(segments or [None]):
        return None
    if case.kind != "steps" or not messages:
        if failure:
            return CaseOutput(*failure)
        last = messages[-1]
        arrays = {name: last.arrays[name] for name in OUTPUT_ARRAYS.get(case.kind, ()) if name in last.arrays}
        return CaseOutput("ok", None, _info(last), arrays)
    joined = _joined_steps(messages)
    if failure:
        return CaseOutput(*failure, joined.info, joined.arrays, joined.states)
    return joined


def _info(message: WorkerMessage) -> dict[str, Any]:
    info = message.details.get("info")
    return info if isinstance(info, dict) else {}


def _joined_steps(messages: list[WorkerMessage]) -> CaseOutput:
    """The segments of a ``steps`` run as one output: y joined, and each relayed state."""
    states = [m.state() or [] for m in messages]
    info = {**_info(messages[-1]), "states": [[list(a.shape) for a in state] for state in states]}
    pieces = [m.arrays.get("y") for m in messages]
    if any(p is None or p.ndim < 2 for p in pieces) or len({p.shape[:1] + p.shape[2:] for p in pieces}) > 1:
        return CaseOutput("error", "step's outputs could not be joined: each must be shaped (batch, embedding_dim)",
                          info, {}, states)
    return CaseOutput("ok", None, info, {"y": np.concatenate(pieces, axis=1)}, states)
