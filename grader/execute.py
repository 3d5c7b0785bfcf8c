"""Stage 2, execute: run the submitted notebook headless inside the sandbox.

Before running, every ``provided`` cell is replaced by the grader's copy from the master
notebook (matched by cell id; a deleted provided cell is put back), and all stored outputs
are dropped. The driver (``harness/run_notebook.py``) runs nbclient and the kernel together
in the sandbox and reports per cell; nothing it reports is a verdict. Its report and the
executed notebook are read only if the driver vouched for them by digest on its stdout,
which the kernel cannot reach (see ``harness/run_notebook.py``).
"""
from __future__ import annotations

import copy
import functools
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from grader import cells
from grader.harness import HARNESS_DIR
from grader.harness.cpu_time import BACKSTOP
from grader.rubric import Limits
from grader.sandbox import ONE_THREAD_ENV, MemoryShare, Sandbox
from grader.untrusted import read_bytes, read_json, seconds, vouched_files

MAX_ANSWERS_BYTES = 4 * 2**20
# Heavy exercise cells read G2C_GRADING and run on a small budget. The sandbox gives every run
# one compute thread; said here too for runs outside it (the bench's floor, `grader assign`).
GRADING_ENV = {"G2C_GRADING": "1", **ONE_THREAD_ENV, "MPLBACKEND": "Agg", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
MAX_EXECUTED_NOTEBOOK_BYTES = 64 * 2**20
DRIVER_DONE_LINE = "G2C-DONE"   # the driver's last line on its stdout (see harness/run_notebook.py)
# The driver, the kernel it starts and what they import.
HARNESS_SCRIPTS = ("run_notebook.py", "cpu_time.py", "kernel_launcher.py", "syscall_filter.py")
# Cells stopped as hung (idle for the idle limit) before the driver runs no more: each costs
# that limit of a worker's time, and one limit more if it ignores its interrupt (the grace before
# its kernel is killed). Idle time adds up across cells (an interrupt and a short cell between
# them use next to no CPU), so the sandbox, which stops the whole run as hung, waits for all of
# it, one limit more, and the driver's own latencies (its readings, nbclient noticing a killed
# kernel within a second, recording the cell): its watch is for a driver that can no longer act.
IDLE_CELLS_GIVE_UP = 2
RUN_IDLE_LIMITS = 2 * IDLE_CELLS_GIVE_UP + 1
RUN_IDLE_SLACK_S = 5.0


def run_idle_limit(limits: Limits) -> float:
    """Seconds without CPU progress after which the sandbox stops a whole notebook run as hung."""
    return limits.idle_timeout_s * RUN_IDLE_LIMITS + RUN_IDLE_SLACK_S


@dataclass(frozen=True)
class CellRun:
    index: int
    cell_id: str | None
    status: str                 # ok | error | timeout | not_run
    error: str | None = None
    seconds: float | None = None   # how long it ran, as the driver measured it (a timing only)


@dataclass
class ExecutionResult:
    cells: list[CellRun]
    kernel: str                                  # ok | died | hung | ...
    timed_out: bool                              # the whole-notebook limit (CPU or its backstop) was hit
    answers: dict[str, Any]
    stopped: list[str] = field(default_factory=list)   # what the sandbox stopped
    notes: list[str] = field(default_factory=list)
    executed_notebook: bytes | None = None           # the run's notebook with outputs, for TAs
    # Timings (decide nothing): launch to the driver's start, and the kernel's start.
    sandbox_start: float | None = None
    kernel_start: float | None = None

    def problems(self) -> list[str]:
        """Readable reasons why the run was not clean (empty when every cell ran)."""
        found = [f"{self.cell_label(c)}: {c.error or c.status}" for c in self.cells if c.status in ("error", "timeout")]
        not_run = [c for c in self.cells if c.status == "not_run"]
        if not_run:
            found.append(f"{len(not_run)} cells did not run (kernel {self.kernel})")
        if self.timed_out:
            found.append("the notebook was stopped at its overall time limit")
        return found

    def backstop(self) -> str | None:
        """What a wall-clock backstop stopped (a cell, or the whole run), or None. Only the
        driver sets a cell's timeout, and only the sandbox its reasons: student code cannot."""
        for run in self.cells:
            if run.status == "timeout" and BACKSTOP in (run.error or ""):
                return f"{self.cell_label(run)}: {run.error}"
        return next((reason for reason in self.stopped if reason.startswith(BACKSTOP)), None)


    def stages(self) -> list[tuple[str, float]]:
        """Where the run's time went, in order: the sandbox's and the kernel's start, then each
        cell that ran, named as the student counts code cells (``code cell 3 (In[3])``)."""
        found = [(name, value) for name, value in (("sandbox_start", self.sandbox_start),
                                                   ("kernel_start", self.kernel_start)) if value is not None]
        numbers = {index: n for n, index in enumerate(sorted(c.index for c in self.cells), start=1)}
        return found + [(cells.code_cell_label(numbers[run.index], self._code_cells.get(run.index, ("", None))[1]),
                         run.seconds) for run in self.cells if run.seconds is not None]

    def cell_label(self, run: CellRun) -> str:
        """How the student finds ``run``'s cell (``cells.code_cell_label``): which cell comes from
        the driver's record, its source and ``In[n]`` from the executed notebook it vouched for."""
        number = sorted(c.index for c in self.cells).index(run.index) + 1
        source, count = self._code_cells.get(run.index, ("", None))
        return cells.code_cell_label(number, count, cells.first_line(source))

    def cell_source(self, run: CellRun) -> str:
        """The code the cell ran, as the executed notebook records it ("" when it is not kept)."""
        return self._code_cells.get(run.index, ("", None))[0]

    @functools.cached_property
    def _code_cells(self) -> dict[int, tuple[str, int | None]]:
        """Notebook position -> (source, execution count) of the executed notebook's code cells."""
        return {cell.index: (cell.source, cell.execution_count)
                for cell in cells.executed_code_cells(self.executed_notebook)}


def execution_record(result: ExecutionResult) -> dict[str, Any]:
    """What the checks read of a run, as JSON, for the kept run (``grader.pipeline``); the
    executed notebook is kept as its own file."""
    return {"cells": [[c.index, c.cell_id, c.status, c.error] for c in result.cells], "kernel": result.kernel,
            "timed_out": result.timed_out, "answers": result.answers, "stopped": list(result.stopped),
            "notes": list(result.notes)}


def execution_from_record(record: Any) -> ExecutionResult | None:
    """``execution_record`` read back, or None when it is not one: the values in it are what
    student code produced, so every field is checked for its type."""
    try:
        cells_run = [CellRun(index, cell_id, status, error) for index, cell_id, status, error in record["cells"]
                     if type(index) is int and isinstance(cell_id, (str, type(None))) and isinstance(status, str)
                     and isinstance(error, (str, type(None)))]
        if len(cells_run) != len(record["cells"]) or not isinstance(record["answers"], dict):
            return None
        if not isinstance(record["kernel"], str) or not isinstance(record["timed_out"], bool):
            return None
        stopped, notes = record["stopped"], record["notes"]
        if not all(isinstance(x, str) for x in [*stopped, *notes]):
            return None
        return ExecutionResult(cells_run, record["kernel"], record["timed_out"], record["answers"], list(stopped),
                               list(notes))
    except (KeyError, TypeError, ValueError):
        return None


def prepare_notebook(submission: nbformat.NotebookNode, master: nbformat.NotebookNode,
                     notes: list[str]) -> nbformat.NotebookNode:
    """The notebook to execute: the submission with the grader's provided cells, no outputs,
    and without the master's test cells (the probe decides them, outside the notebook run)."""
    prepared = copy.deepcopy(submission)
    tests = {c.get("id") for c in master.cells if cells.TEST in cells.tags(c)}
    prepared.cells = [c for c in prepared.cells if c.get("id") not in tests]
    present = {c.get("id"): i for i, c in enumerate(prepared.cells)}
    master_cells = list(master.cells)
    for position, cell in enumerate(master_cells):
        if cells.PROVIDED not in cells.tags(cell):
            continue
        if cell.id in present:
            target = prepared.cells[present[cell.id]]
            if cells.source(target) != cells.source(cell):
                notes.append(f"provided cell {cell.id!r} was edited; the grader ran its own copy")
            target.source = cells.source(cell)
            target.cell_type = "code"
            continue
        notes.append(f"provided cell {cell.id!r} was missing; the grader put its copy back")
        after = [c.id for c in master_cells[position + 1:] if c.id in present]
        insert_at = present[after[0]] if after else len(prepared.cells)
        prepared.cells.insert(insert_at, nbformat.v4.new_code_cell(cells.source(cell), id=cell.id))
        present = {c.get("id"): i for i, c in enumerate(prepared.cells)}
    for cell in prepared.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return prepared


def execute_notebook(notebook: nbformat.NotebookNode, sandbox: Sandbox, scratch: Path,
                     limits: Limits, answer_variables: tuple[str, ...],
                     share: MemoryShare | None = None) -> ExecutionResult:
    """Run ``notebook`` in the sandbox (its memory counted in ``share``, with the submission's
    other runs); never raises for anything the notebook does."""
    work = scratch / "execute"
    work.mkdir(parents=True, exist_ok=True)
    plan = {
        "notebook": str(work / "submission.ipynb"),
        "executed": str(work / "executed.ipynb"),
        "results": str(work / "results.json"),
        "answers": str(work / "answers.json"),
        "answer_variables": list(answer_variables),
        "cell_timeout": limits.cell_timeout_s,             # CPU seconds
        "cell_backstop": limits.backstop(limits.cell_timeout_s),   # wall-clock seconds
        "idle_timeout": limits.idle_timeout_s,             # wall-clock seconds without CPU progress
        "idle_cells_give_up": IDLE_CELLS_GIVE_UP,
        "output_limit": limits.cell_output_kib * 1024,
        "workdir": str(work),
    }
    nbformat.write(notebook, plan["notebook"])
    for script in HARNESS_SCRIPTS:
        shutil.copy(HARNESS_DIR / script, work / script)
    (work / "plan.json").write_text(json.dumps(plan))
    result = sandbox.run([sys.executable, str(work / "run_notebook.py"), str(work / "plan.json")],
                         scratch=scratch, cpu_limit=limits.notebook_timeout_s,
                         timeout=limits.backstop(limits.notebook_timeout_s),
                         idle_limit=run_idle_limit(limits),
                         env={**GRADING_ENV, "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
                              "IPYTHONDIR": str(work / "ipython")}, share=share)
    vouched = vouched_files(result.stdout)
    finished = DRIVER_DONE_LINE in result.stdout.splitlines()
    notes: list[str] = []
    report = read_json(Path(plan["results"]), scratch, MAX_ANSWERS_BYTES, vouched.get("results.json", ""))
    discarded = report is None and "results.json" in vouched
    if discarded:
        notes.append("the driver's report was changed after the driver wrote it (by the notebook's code?); "
                     "it was discarded")
    report = report or {}
    runs = [CellRun(int(r.get("index", -1)), r.get("id") if isinstance(r.get("id"), str) else None,
                    str(r.get("status", "error")),
                    f"{r['ename']}: {r.get('evalue', '')}" if r.get("ename") else None,
                    seconds(r.get("seconds"), result.wall_seconds))
            for r in report.get("cells", []) if isinstance(r, dict)]
    timings = report.get("timings") if isinstance(report.get("timings"), dict) else {}
    driver_started = seconds(timings.get("started"), float("inf"))
    ran = {r.index for r in runs}
    runs += [CellRun(i, c.get("id"), "not_run") for i, c in enumerate(notebook.cells)
             if c.cell_type == "code" and i not in ran]
    runs.sort(key=lambda r: r.index)
    stopped_on_time = result.timed_out or result.hung
    kernel = str(report.get("kernel", "unknown" if discarded else "hung" if stopped_on_time else "died"))
    if result.hung and kernel == "ok":
        kernel = "hung"
    elif report and not finished and not stopped_on_time and kernel == "ok":
        kernel = "stopped"
        notes.append("the notebook driver was killed before it finished (by a sandbox limit, or by the "
                     "notebook's own code)")
    if report.get("truncated_cells"):
        notes.append(f"output of cells {report['truncated_cells']} was truncated at "
                     f"{limits.cell_output_kib} KiB per cell")
    if result.returncode not in (0, None) and not report:
        notes.append(_tail("the notebook driver failed", result.stderr))
    executed = read_bytes(Path(plan["executed"]), scratch, MAX_EXECUTED_NOTEBOOK_BYTES,
                          vouched.get("executed.ipynb", ""))
    if executed is None and "executed.ipynb" in vouched:
        notes.append("the executed notebook is not kept: it was changed after the run, or is over "
                     f"{MAX_EXECUTED_NOTEBOOK_BYTES // 2**20} MiB")
    answers = read_json(Path(plan["answers"]), scratch, MAX_ANSWERS_BYTES) or {}
    return ExecutionResult(
        cells=runs, kernel=kernel, timed_out=result.timed_out,
        answers={k: v for k, v in answers.items() if k in answer_variables},
        stopped=list(result.stopped), notes=notes,
        executed_notebook=executed,
        sandbox_start=None if driver_started is None else seconds(driver_started - result.started,
                                                                  result.wall_seconds),
        kernel_start=seconds(timings.get("kernel_start"), result.wall_seconds))


def _tail(what: str, stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
    return f"{what}: {' | '.join(lines)}" if lines else what
