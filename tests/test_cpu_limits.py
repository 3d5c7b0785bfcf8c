"""Time limits on student code are CPU seconds of its own processes, with a wall-clock backstop.

Each limit is small here, and its backstop far longer, so that code that burns CPU is stopped
by the CPU limit however busy the machine is; only code that sleeps reaches a backstop.
"""
from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from grader.execute import ExecutionResult, execute_notebook
from grader.pipeline import SubmissionGrader
from grader.rubric import Limits, RubricError, load_rubric
from grader.sandbox import Sandbox

from conftest import ROOT, items_by_id, write_notebook

BUSY = Limits(cell_timeout_s=2, notebook_timeout_s=300, wall_backstop_factor=30)
SPIN = "import time\nstarted = time.process_time()\nwhile time.process_time() - started < {seconds}:\n    pass\n"


def run_cells(sandbox: Sandbox, scratch: Path, limits: Limits, *sources: str) -> ExecutionResult:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(source)) for source in sources]
    return execute_notebook(notebook, sandbox, scratch, limits, ())


def test_a_cell_is_stopped_by_the_cpu_its_processes_use(sandbox: Sandbox, tmp_path: Path) -> None:
    """The kernel's own loop, children it starts and reaps one after another (each short, so
    that only what its reaped children used shows it), and a grandchild orphaned while the
    cell sleeps (counted through the driver, its subreaper): each is stopped by the CPU limit,
    not by the backstop, and the kernel goes on with the next cell."""
    children = """
        import subprocess, sys
        while True:
            subprocess.run([sys.executable, "-c", {spin!r}])
    """.format(spin=SPIN.format(seconds=0.3))
    orphan = """
        import os, time
        if os.fork() == 0:
            if os.fork() == 0:
                try:
                    while True:
                        pass
                finally:
                    os._exit(0)
            os._exit(0)
        os.wait()
        time.sleep(600)
    """
    result = run_cells(sandbox, tmp_path, BUSY, "while True:\n    pass", "a = 1", children, "b = 2", orphan, "c = 3")
    statuses = [run.status for run in result.cells]
    assert statuses == ["timeout", "ok", "timeout", "ok", "timeout", "ok"], result.cells
    for run in result.cells[::2]:
        assert run.error == "CellTimeoutError: the cell used more than 2 CPU seconds and was interrupted"
    assert result.kernel == "ok" and not result.timed_out and result.backstop() is None


def test_the_whole_notebook_is_stopped_by_the_cpu_of_all_its_processes(sandbox: Sandbox, tmp_path: Path) -> None:
    """Cells each under their own limit, together past the notebook's (the kernel's start and
    the driver count too): the sandbox kills the run, saying which limit it was."""
    limits = Limits(cell_timeout_s=3, notebook_timeout_s=8, wall_backstop_factor=30)
    result = run_cells(sandbox, tmp_path, limits, *[SPIN.format(seconds=1.5)] * 8)
    assert result.timed_out
    assert "used more than 8 CPU seconds (all its processes together); killed" in result.stopped
    assert result.backstop() is None


def test_the_sandbox_tells_its_cpu_limit_from_its_backstop(sandbox: Sandbox, tmp_path: Path) -> None:
    """A command's short-lived children count once reaped; a sleeping command uses no CPU and
    is stopped by the wall-clock timeout, worded as the backstop it is."""
    script = tmp_path / "spawn.py"
    script.write_text("import subprocess, sys\nwhile True:\n"
                      f"    subprocess.run([sys.executable, '-c', {SPIN.format(seconds=0.2)!r}])\n")
    busy = sandbox.run(["python", str(script)], scratch=tmp_path, cpu_limit=2, timeout=120)
    assert busy.timed_out and busy.returncode is None
    assert busy.stopped == ["used more than 2 CPU seconds (all its processes together); killed"]
    asleep = sandbox.run(["python", "-c", "import time; time.sleep(600)"], scratch=tmp_path, cpu_limit=2, timeout=3)
    assert asleep.timed_out and asleep.wall_seconds >= 3
    assert asleep.stopped == ["stopped by the wall-clock backstop after 3 s (sleeping or waiting?); killed"]


def test_a_sleeping_cell_reaches_the_backstop_and_is_graded_again_once(assignment, sandbox, tmp_path) -> None:
    """A cell that sleeps past its CPU limit uses no CPU: the backstop stops it, the notebook
    run is retried once, and the result says so. The grading takes both runs' backstops."""
    rubric = assignment.rubric.with_limits(cell_timeout_s=2, wall_backstop_factor=1.5)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    path = write_notebook(notebook, tmp_path / "sleeper.ipynb")
    started = time.monotonic()
    result = SubmissionGrader(assignment, sandbox, rubric).grade(path, "sleeper")
    assert time.monotonic() - started >= 2 * 3
    retried = [note for note in result.notes if "graded again once" in note]
    assert len(retried) == 1, result.notes
    assert re.fullmatch(r"the notebook run was stopped by a wall-clock backstop \(code cell \d+ .*: CellTimeoutError: "
                        r"the cell was stopped by the wall-clock backstop after 3 s \(sleeping or waiting\?\)\); "
                        r"graded again once: stopped again \(.*\)", retried[0]), retried[0]
    runs = items_by_id(result.to_json())["notebook_runs"]
    assert "wall-clock backstop after 3 s" in runs["output"] and "CPU seconds" not in runs["output"]


@pytest.mark.parametrize("factor", [0.5, "five", True])
def test_the_backstop_factor_is_validated(tmp_path: Path, factor) -> None:
    raw = yaml.safe_load((ROOT / "rubrics" / "linear_attention.yaml").read_text())
    raw["limits"]["wall_backstop_factor"] = factor
    (tmp_path / "rubric.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(RubricError, match="wall_backstop_factor must be a number of at least 1"):
        load_rubric(tmp_path / "rubric.yaml")
