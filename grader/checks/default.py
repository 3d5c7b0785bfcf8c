"""The checks module of an assignment whose rubric names none (``rubric.DEFAULT_CHECKS``).

Such an assignment is graded by its master notebook's test cells (``grader.checks.inline``,
which the pipeline runs for every assignment) and, when the rubric lists it, the item
``notebook_runs``: the notebook runs headless without an error.
"""
from __future__ import annotations

from pathlib import Path

from grader.checks import CheckContext, Verdict, execution_verdict
from grader.probe import ProbeCase
from grader.rubric import Rubric

PROBE_DRIVER: Path | None = None
NOTEBOOK_RUNS = "notebook_runs"


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    """None: the test cells bring their own."""
    return []


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    """``notebook_runs``, when the rubric lists it."""
    names = {item.name for item in context.rubric.items}
    return {NOTEBOOK_RUNS: execution_verdict(context)} if NOTEBOOK_RUNS in names else {}
