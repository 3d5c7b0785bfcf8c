"""Time limits on student code are CPU seconds of its own processes, with a wall-clock backstop.

Each limit is small here, and its backstop far longer, so that code that burns CPU is stopped
by the CPU limit however busy the machine is; only code that sleeps reaches a backstop.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from grader.execute import ExecutionResult, execute_notebook, run_idle_limit
from grader.harness.cpu_time import AFTER_HUNG_S, IdleWatch, read_process
from grader.pipeline import SubmissionGrader
from grader.probe import ProbeCase, run_probe
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
        import os
        while True:
            child = os.fork()
            if child == 0:
                try:
                    exec({spin!r})
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
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
    # 3 CPU seconds for each cell (the provided cell that imports torch needs up to about 2 on a
    # busy machine), and a backstop as long.
    rubric = assignment.rubric.with_limits(cell_timeout_s=3, wall_backstop_factor=1)
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
    # The sleeper's own line (a provided cell that imports torch may pass 3 CPU seconds on a
    # busy machine and be listed after it: that is the CPU limit at work, not this test's concern).
    sleeper = next(line for line in runs["output"].split("; ") if line.startswith("code cell 1 "))
    assert "wall-clock backstop after 3 s" in sleeper and "CPU seconds" not in sleeper, runs["output"]


@pytest.mark.parametrize("limit", ["wall_backstop_factor", "idle_timeout_s"])
@pytest.mark.parametrize("value", [0.5, "five", True])
def test_the_backstop_factor_and_the_idle_limit_are_validated(tmp_path: Path, limit: str, value) -> None:
    """In the rubric, and as given on the command line (``with_limits``)."""
    raw = yaml.safe_load((ROOT / "rubrics" / "linear_attention.yaml").read_text())
    raw["limits"][limit] = value
    (tmp_path / "rubric.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(RubricError, match=f"rubric.yaml: limits: {limit} must be a number of at least 1"):
        load_rubric(tmp_path / "rubric.yaml")
    with pytest.raises(RubricError, match=f"the limits given: {limit} must be a number of at least 1"):
        load_rubric(ROOT / "rubrics" / "linear_attention.yaml").with_limits(**{limit: value})


# ----------------------------------------------------------------------------- idle code

IDLE = Limits(cell_timeout_s=30, notebook_timeout_s=300, idle_timeout_s=2)
QUICK_IDLE = Limits(cell_timeout_s=30, notebook_timeout_s=300, idle_timeout_s=1)   # where only the sandbox acts
HUNG = "stopped as hung: it made no CPU progress for 2 s while it could have run (sleeping or waiting?)"


def _recorded(cpu_per_reading: float, runnable_tenths: int, gap_every: int = 0, readings: int = 60) -> bool:
    """Feed ``IdleWatch(5 s)`` a recorded pattern of readings 0.25 s apart, a thread runnable in
    ``runnable_tenths`` of every ten (with a 2 s gap, a watcher that waited for a core, every
    ``gap_every``): whether it ever says hung."""
    watch, now, cpu = IdleWatch(5, 0.25), 0.0, 0.0
    for n in range(readings):
        now += 2.0 if gap_every and n % gap_every == gap_every - 1 else 0.25
        cpu += cpu_per_reading
        if watch.judge(now, cpu, lambda: n % 10 < runnable_tenths):
            return True
    return False


# name -> (CPU seconds per 0.25 s reading, readings in ten with a runnable thread, gap every)
MUST_CATCH = {"asleep": (0.0, 0, 0), "sleeps between short bursts": (0.005, 1, 0),
              "blocked, woken now and then": (0.0, 3, 0)}
MUST_LEAVE = {"busy": (0.25, 0, 0), "starved: runnable, hardly any CPU": (0.001, 10, 0),
              "starved most of the time": (0.01, 7, 0), "busy a third of the time": (0.03, 0, 0),
              "asleep, its watcher starved": (0.0, 0, 3)}


def test_idle_is_told_from_starved_and_from_busy_on_recorded_readings() -> None:
    caught = {name: _recorded(*pattern) for name, pattern in MUST_CATCH.items()}
    left = {name: not _recorded(*pattern) for name, pattern in MUST_LEAVE.items()}
    print(f"\nidle caught {sum(caught.values())}/{len(caught)}, honest left alone {sum(left.values())}/{len(left)}")
    assert all(caught.values()) and all(left.values()), (caught, left)
    # Not before the window is full: 5 s of readings 0.25 s apart is the 21st.
    watch = IdleWatch(5, 0.25)
    verdicts = [watch.judge(0.25 * n, 0.0, lambda: False) for n in range(22)]
    assert verdicts.index(True) == 20, verdicts


IDLE_PROGRAMS = {
    "time.sleep": "import time; time.sleep(60)",
    "a pipe nobody writes": "import os; r, w = os.pipe(); os.read(r, 1)",
    "a lock nobody releases": "import threading; lock = threading.Lock(); lock.acquire(); lock.acquire()",
    "stopped (SIGSTOP)": "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)",
    "a loop of short sleeps": "import time\nwhile True:\n    time.sleep(0.01)",
    "a thread asleep, main joined": "import threading, time; t = threading.Thread(target=time.sleep, args=(60,)); "
                                    "t.start(); t.join()",
}
SPIN_FOREVER = "while True:\n    pass"
HONEST_PROGRAMS = {
    "busy": SPIN_FOREVER,
    "starved: nice 19 among spinners on every core": f"import os; os.nice(19)\n{SPIN_FOREVER}",
    "a thread busy, main joined": "import threading\ndef spin():\n    while True:\n        pass\n"
                                  "t = threading.Thread(target=spin); t.start(); t.join()",
}


def test_idle_processes_are_caught_and_busy_or_starved_ones_left_alone() -> None:
    """Real processes watched side by side for twice the idle limit, while spinners keep every
    core busy (so the nice-19 one is starved: runnable, hardly ever running)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN_FOREVER]) for _ in range(os.cpu_count() or 1)]
    watched = {name: subprocess.Popen([sys.executable, "-c", code])
               for name, code in {**IDLE_PROGRAMS, **HONEST_PROGRAMS}.items()}
    try:
        time.sleep(0.5)   # started: the interpreter's own start is CPU
        watches = {name: IdleWatch(1.5, 0.25) for name in watched}
        hung_at: dict[str, float] = {}
        started = time.monotonic()
        while time.monotonic() - started < 3:
            for name, process in watched.items():
                found = read_process(process.pid)
                cpu = found.cpu + found.reaped if found else 0.0
                if name not in hung_at and watches[name].hung(cpu, [process.pid]):
                    hung_at[name] = round(time.monotonic() - started, 2)
            time.sleep(0.25)
        shares = {name: round(read_process(p.pid).cpu / (time.monotonic() - started), 3)
                  for name, p in watched.items()}
    finally:
        for process in [*spinners, *watched.values()]:
            process.kill()
            process.wait()
    caught = {name: hung_at.get(name) for name in IDLE_PROGRAMS}
    wrongly = {name: hung_at[name] for name in HONEST_PROGRAMS if name in hung_at}
    print(f"\nidle caught {sum(v is not None for v in caught.values())}/{len(caught)} (seconds: {caught}); "
          f"honest stopped {len(wrongly)}/{len(HONEST_PROGRAMS)}; CPU share of one core: {shares}")
    assert None not in caught.values(), (caught, shares)
    assert not wrongly, (wrongly, shares)


def test_idle_cells_are_interrupted_as_hung_and_the_second_ends_the_run(sandbox: Sandbox, tmp_path: Path) -> None:
    """A sleeping cell is interrupted after the idle limit (no backstop, nothing to retry) and
    the next cell runs; a cell that ignores the interrupt and waits on a lock nobody releases is
    killed, and as the second idle cell it ends the run."""
    result = run_cells(sandbox, tmp_path, IDLE, "import time\ntime.sleep(600)", "a = 1",
                       "import signal, threading\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                       "lock = threading.Lock()\nlock.acquire()\nlock.acquire()", "b = 2")
    assert [run.status for run in result.cells] == ["timeout", "ok", "timeout", "not_run"], \
        (result.cells, result.kernel, result.stopped, result.notes)
    for run in (result.cells[0], result.cells[2]):
        assert run.error == f"CellTimeoutError: the cell was {HUNG}; it was interrupted", run.error
    assert result.kernel == "hung" and not result.timed_out and result.backstop() is None


SLOWER_IDLE = Limits(cell_timeout_s=30, notebook_timeout_s=300, idle_timeout_s=4)
AFTER_HUNG = (f"stopped as hung: it made no CPU progress for {AFTER_HUNG_S:g} s while it could have run (sleeping or "
              "waiting?), as an earlier call was stopped after 4 s")


def test_after_one_cell_stopped_as_hung_the_next_waits_the_short_limit(sandbox: Sandbox, tmp_path: Path) -> None:
    """A sleeping function costs one idle limit, not one per cell that calls it: the first call
    waits out the rubric's limit, a later one cpu_time.AFTER_HUNG_S, each saying which; a cell
    that works between them is untouched."""
    result = run_cells(sandbox, tmp_path, SLOWER_IDLE, "import time\ndef asleep():\n    time.sleep(600)\nasleep()",
                       "a = sum(range(10**6))", "asleep()")
    assert [run.status for run in result.cells] == ["timeout", "ok", "timeout"], (result.cells, result.stopped)
    assert result.cells[0].error == ("CellTimeoutError: the cell was stopped as hung: it made no CPU progress for "
                                     "4 s while it could have run (sleeping or waiting?); it was interrupted")
    assert result.cells[2].error == f"CellTimeoutError: the cell was {AFTER_HUNG}; it was interrupted"


def test_after_one_probe_case_stopped_as_hung_the_next_waits_the_short_limit(sandbox: Sandbox, tmp_path: Path) -> None:
    """The same in the probe: cases of other groups that call the sleeping function wait the
    short limit; a case that does not call it is untouched."""
    source = "import time\n\ndef asleep():\n    time.sleep(600)\n\ndef works():\n    return 1.0\n"
    calls = {"asleep": {"calls": [{"symbol": "asleep", "output": "out"}]},
             "works": {"calls": [{"symbol": "works", "output": "out"}]}}
    cases = [ProbeCase(f"{symbol}_{n}", "call", calls[symbol], {}, group=f"group_{n}")
             for n, symbol in enumerate(("asleep", "works", "asleep", "asleep"))]
    probe = run_probe(source, cases, sandbox, tmp_path, 30, idle_timeout=4)
    said = {name: (out.status, out.error) for name, out in probe.cases.items()}
    assert said["asleep_0"][1].startswith("stopped as hung: it made no CPU progress for 4 s"), said
    assert said["works_1"] == ("ok", None), said
    assert said["asleep_2"][1] == said["asleep_3"][1] == AFTER_HUNG, said


def test_a_run_that_stops_its_own_driver_is_killed_as_hung(sandbox: Sandbox, tmp_path: Path) -> None:
    """The cell stops the driver watching it (SIGSTOP), then sleeps: nothing inside the sandbox
    can act, and the sandbox kills the whole run once idle for ``run_idle_limit``."""
    result = run_cells(sandbox, tmp_path, QUICK_IDLE, "import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\n"
                       "time.sleep(600)")
    assert result.stopped == [f"stopped as hung: it made no CPU progress for {run_idle_limit(QUICK_IDLE):g} s "
                              "while it could have run (sleeping or waiting?); killed"], result.stopped
    assert result.kernel == "hung" and not result.timed_out and result.backstop() is None
