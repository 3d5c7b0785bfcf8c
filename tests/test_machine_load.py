"""Verdicts do not depend on how busy the machine is.

The corpus's correct implementation written with explicit Python loops (tests/scaffolds/
correct_explicit_loops.py, the slowest correct one) is graded by ``grader grade`` twice: as
the machine is, and while two busy processes per core run at nice 10, the priority student
code runs at. The cell limit is about twice the CPU its slowest cell (Exercise 2's training)
needs, so on a busy machine that cell's wall time passes the limit while its CPU does not: a
wall-clock limit stops it there, a CPU limit lets it finish, with the wall-clock backstop
(five times the limit) far beyond. Both gradings must give every item the same score, state
and output, and earn every autograded point, as the corpus says a correct implementation does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SCAFFOLDS, items_by_id, notebook_with_scaffold, scaffold_cell, write_notebook

CELL_CPU_LIMIT = "15"   # seconds; Exercise 2's training cell needs about 7 s of CPU here
BUSY_PER_CORE = 2


def grade(submissions: Path, out: Path) -> dict[str, dict]:
    """``grader grade`` on ``submissions`` (one notebook): its items by id."""
    command = [sys.executable, "-c", "import sys; from grader.cli import main; sys.exit(main())", "grade",
               str(submissions), "--assignment", "linear_attention", "--out", str(out), "--workers", "1",
               "--cell-timeout", CELL_CPU_LIMIT]
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    (results,) = out.glob("*/results.json")
    return items_by_id(json.loads(results.read_text()))


def verdicts(items: dict[str, dict]) -> dict[str, tuple]:
    return {name: (item["score"], item["status"], item["output"]) for name, item in items.items()}


def test_a_slow_correct_implementation_earns_the_same_items_on_a_busy_machine(assignment, tmp_path: Path) -> None:
    written = (SCAFFOLDS / "correct_explicit_loops.py").read_text()
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    write_notebook(notebook_with_scaffold(assignment.master, scaffold_cell(assignment.master, written)),
                   submissions / "explicit_loops.ipynb")
    as_it_is = grade(submissions, tmp_path / "out-as-it-is")

    busy = []
    try:
        for _ in range(BUSY_PER_CORE * (os.cpu_count() or 1)):
            busy.append(subprocess.Popen([sys.executable, "-c", "while True:\n    pass"], preexec_fn=lambda: os.nice(10),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        loaded = grade(submissions, tmp_path / "out-loaded")
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()

    assert verdicts(loaded) == verdicts(as_it_is)
    autograded = {item.name: item.points for item in assignment.rubric.items}
    assert {name: loaded[name]["score"] for name in autograded} == autograded, \
        {name: loaded[name]["output"] for name in autograded if loaded[name]["score"] != autograded[name]}
