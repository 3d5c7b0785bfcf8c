"""Shared fixtures: the assignment, a real bubblewrap sandbox, and notebook builders."""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest

from grader import cells
from grader.assignment import Assignment
from grader.cli import make_sandbox
from grader.pipeline import SubmissionGrader
from grader.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
SCAFFOLDS = Path(__file__).parent / "scaffolds"


@pytest.fixture(scope="session")
def assignment() -> Assignment:
    return Assignment("linear_attention")


@pytest.fixture(scope="session")
def sandbox(assignment: Assignment) -> Sandbox:
    """The real sandbox; fails (never skips) when bubblewrap is unusable."""
    return make_sandbox(assignment.rubric.limits, allow_unsandboxed=False)


@pytest.fixture(scope="session")
def submission_grader(assignment: Assignment, sandbox: Sandbox) -> SubmissionGrader:
    return SubmissionGrader(assignment, sandbox)


def notebook_with_scaffold(master: nbformat.NotebookNode, scaffold_source: str) -> nbformat.NotebookNode:
    """The master notebook with its scaffold cell's source replaced."""
    notebook = copy.deepcopy(master)
    for cell in notebook.cells:
        if cells.SCAFFOLD in cells.tags(cell):
            cell.source = scaffold_source
    return notebook


def write_notebook(notebook: nbformat.NotebookNode, path: Path) -> Path:
    nbformat.write(notebook, str(path))
    return path
