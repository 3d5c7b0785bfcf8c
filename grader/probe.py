"""Stage 3, probe: run the student's scaffold on grader-chosen inputs, inside the sandbox.

The module the harness imports is built here from the grader's own copy of the provided
code (the master notebook's ``provided`` cells) and only the student-written parts of the
scaffold cell: the methods of their ``LinearAttention`` that the assignment leaves to them,
plus their own helper imports and functions. Redefinitions of provided names are dropped.
Outputs come back as npy / JSON and are read with pickle disabled and size limits, and only
when the harness's supervisor (which never runs student code) vouched for them by digest.
"""
from __future__ import annotations

import ast
import copy
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import numpy as np

from grader import cells
from grader.harness import HARNESS_DIR
from grader.sandbox import Sandbox
from grader.untrusted import read_float_array, read_json, vouched_files

MODULE_FILE = "submission_code.py"
MAX_OUTPUT_FILE_BYTES = 64 * 2**20
MAX_RESTARTS = 12
GIVE_UP_AFTER = 2   # hung or crashed cases of one kind before the rest of that kind is skipped
# The arrays the harness writes per kind of case (the grader reads nothing else).
OUTPUT_ARRAYS = {"forward": ("y", "decay"), "steps": ("y", "S", "z"), "state_growth": (),
                 "resume": ("y_resumed", "y_whole"), "hybrid": ("logits",)}


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
                   class_name: str, student_methods: frozenset[str],
                   provided_imports: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The scaffold class with the grader's provided members and the student's own ones.

    Returns (source, notes). Student members named like a provided member are ignored, as
    are top-level statements that are not imports or definitions, and definitions or
    imports that would rebind a provided name (``provided_imports``: what the provided code's
    own imports bind, see ``_strip_provided_imports``).
    """
    master_tree = ast.parse(master_scaffold)
    master_class = _find_class(master_tree, class_name)
    try:
        student_tree = ast.parse(student_scaffold)
    except SyntaxError as exc:
        raise GraftError(f"the scaffold cell is not valid Python: line {exc.lineno}: {exc.msg}") from exc
    student_class = _find_class(student_tree, class_name)
    if student_class is None:
        raise GraftError(f"the scaffold cell does not define class {class_name}")
    notes: list[str] = []
    provided_members = {_member_name(n) for n in master_class.body} - {None} - student_methods
    body = [n for n in master_class.body if _member_name(n) not in student_methods]
    for node in student_class.body:
        name = _member_name(node)
        if name is None:
            continue  # docstrings and stray expressions
        if name in provided_members:
            continue  # the grader's copy of provided members is authoritative
        body.append(node)
    missing = student_methods - {_member_name(n) for n in student_class.body}
    if missing:
        notes.append(f"{class_name} defines no {', '.join(sorted(missing))}")
    extras = []
    for node in student_tree.body:
        if node is student_class or isinstance(node, ast.Expr):
            continue
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            continue
        defined = _top_level_names(ast.Module(body=[node], type_ignores=[]))
        if not defined or not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
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
        clash = defined & provided_names
        if clash:
            notes.append(f"redefinition of provided {', '.join(sorted(clash))} ignored; "
                         "the grader uses its own copy")
            continue
        extras.append(node)
    grafted = ast.ClassDef(name=class_name, bases=master_class.bases, keywords=master_class.keywords,
                           body=body, decorator_list=[], type_params=[])
    module = ast.Module(body=extras + [grafted], type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module)), notes


def submission_module_source(master: nbformat.NotebookNode, student_scaffold: str,
                             class_name: str, student_methods: frozenset[str]) -> tuple[str, list[str]]:
    """Provided cells of the master (in order) with the grafted scaffold in its place."""
    parts: list[str] = []
    provided: list[str] = []
    master_scaffold = None
    for cell in master.cells:
        if cell.cell_type != "code":
            continue
        if cells.SCAFFOLD in cells.tags(cell):
            master_scaffold = cells.source(cell)
            parts.append("")  # placeholder, filled once provided names are known
        elif cells.PROVIDED in cells.tags(cell):
            provided.append(cells.source(cell))
            parts.append(cells.source(cell))
    if master_scaffold is None:
        raise GraftError("the master notebook has no scaffold cell")
    provided_names = set().union(*(_top_level_names(ast.parse(p)) for p in provided))
    grafted, notes = graft_scaffold(master_scaffold, student_scaffold, provided_names,
                                    class_name, student_methods, _provided_imports(provided))
    parts[parts.index("")] = grafted
    return "\n\n\n".join(parts) + "\n", notes


# ----------------------------------------------------------------------------- run

def run_probe(module_source: str, probe_cases: list[ProbeCase], sandbox: Sandbox, scratch: Path,
              case_timeout: float) -> ProbeResult:
    """Run every case, restarting the harness after its supervisor dies (killed by student
    code, or by a sandbox limit).

    Each attempt gets a fresh directory made by the grader: after a run, everything the
    sandbox could touch is the submission's, so nothing old is written to again. A file is
    read only when the supervisor printed its digest (see harness/probe_harness.py).
    """
    by_name = {c.name: c for c in probe_cases}
    outputs: dict[str, CaseOutput] = {}
    notes: list[str] = []
    remaining = [c.name for c in probe_cases]
    import_status, import_error = "not_run", None
    deaths: dict[str, int] = {}
    for _ in range(MAX_RESTARTS + 1):
        plan_dir = _prepare_attempt(scratch, module_source, [by_name[n] for n in remaining], case_timeout,
                                    sandbox.sandboxed)
        budget = case_timeout * (len(remaining) + 1) + 30
        result = sandbox.run([sys.executable, str(plan_dir / "probe_harness.py"), str(plan_dir)],
                             scratch=scratch, timeout=budget)
        notes.extend(reason for reason in result.stopped if reason not in notes)
        vouched = vouched_files(result.stdout)
        out = plan_dir / "out"
        status = read_json(out / "import.json", scratch, MAX_OUTPUT_FILE_BYTES, vouched.get("import.json", ""))
        if status is None:
            import_status, import_error = "error", _process_death("importing your code", result)
            break
        import_status, import_error = str(status.get("status", "error")), status.get("error")
        if import_status != "ok":
            break
        finished = 0
        for name in remaining:
            if f"{name}.json" not in vouched:
                break  # the supervisor died before this case
            record = read_json(out / f"{name}.json", scratch, MAX_OUTPUT_FILE_BYTES, vouched[f"{name}.json"])
            if record is None:
                outputs[name] = CaseOutput("error", "the record of this case was changed after the probe wrote "
                                                    "it (by your code?), so it was discarded")
            else:
                outputs[name] = _case_output(out, scratch, name, record, by_name[name], vouched)
            finished += 1
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


def _prepare_attempt(scratch: Path, module_source: str, cases: list[ProbeCase], case_timeout: float,
                     own_pid_namespace: bool) -> Path:
    plan_dir = Path(tempfile.mkdtemp(prefix="probe-", dir=scratch))
    (plan_dir / "in").mkdir()
    (plan_dir / "out").mkdir()
    (plan_dir / MODULE_FILE).write_text(module_source)
    shutil.copy(HARNESS_DIR / "probe_harness.py", plan_dir / "probe_harness.py")
    for case in cases:
        for array_name, value in case.arrays.items():
            np.save(plan_dir / "in" / f"{case.name}__{array_name}.npy", value, allow_pickle=False)
    # kill_all: the supervisor may kill every process it can signal, which is safe only
    # inside the sandbox's own PID namespace.
    plan = {"module": MODULE_FILE, "case_timeout": case_timeout, "kill_all": own_pid_namespace,
            "give_up_after": GIVE_UP_AFTER,
            "cases": [{"name": c.name, "kind": c.kind, "config": c.config} for c in cases]}
    (plan_dir / "plan.json").write_text(json.dumps(plan))
    return plan_dir


def _process_death(what: str, result: Any) -> str:
    if result.timed_out:
        return f"the probe was stopped by its time limit while {what}"
    stopped = f" ({'; '.join(result.stopped)})" if result.stopped else ""
    tail = result.stderr.strip().splitlines()[-3:]
    detail = f": {' | '.join(tail)}" if tail else ""
    return f"the probe's supervisor exited (status {result.returncode}) while {what}{stopped}{detail}"


def _case_output(out_dir: Path, scratch: Path, name: str, record: dict[str, Any], case: ProbeCase,
                 vouched: dict[str, str]) -> CaseOutput:
    """Only the arrays this kind of case produces are read, each through the untrusted reader."""
    status = record.get("status")
    if status not in ("ok", "error", "timeout"):
        status = "error"
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    names = list(OUTPUT_ARRAYS.get(case.kind, ()))
    arrays = {}
    for array in names:
        file_name = f"{name}__{array}.npy"
        value = read_float_array(out_dir / file_name, scratch, MAX_OUTPUT_FILE_BYTES, vouched.get(file_name, ""))
        if value is not None:
            arrays[array] = value
    error = record.get("error")
    return CaseOutput(status, str(error)[:2000] if error else None, info, arrays)
