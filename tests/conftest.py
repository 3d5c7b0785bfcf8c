"""Shared fixtures: the assignment, a real bubblewrap sandbox, and notebook builders."""
from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import jsonschema

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


def scaffold_cell(master: nbformat.NotebookNode, written: str) -> str:
    """A whole scaffold cell from a file of tests/scaffolds/: the master's class with the
    methods the file writes in place of the master's (a mutant writes only its buggy one),
    after the file's own imports and helpers."""
    reference = next(cells.source(c) for c in master.cells if cells.SCAFFOLD in cells.tags(c))
    tree = ast.parse(reference)
    master_class = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    student = ast.parse(written)
    student_class = next(n for n in student.body if isinstance(n, ast.ClassDef))
    own = {n.name: n for n in student_class.body if isinstance(n, ast.FunctionDef)}
    master_class.body = [own.pop(n.name) if isinstance(n, ast.FunctionDef) and n.name in own else n
                         for n in master_class.body] + list(own.values())
    helpers = [n for n in student.body if n is not student_class]
    return ast.unparse(ast.Module(body=helpers + tree.body, type_ignores=[]))


GRADESCOPE_SCHEMA = json.loads((Path(__file__).parent / "gradescope_results.schema.json").read_text())


def gradescope_valid(folder: Path, ids: set[str] | None = None) -> int:
    """Validate each DIR/<id>/results.json under ``folder`` (of ``ids`` only, if given)
    against Gradescope's schema; returns how many there were."""
    paths = sorted(p for p in folder.glob("*/results.json") if ids is None or p.parent.name in ids)
    for path in paths:
        jsonschema.validate(json.loads(path.read_text()), GRADESCOPE_SCHEMA)
    return len(paths)


def items_by_id(results_json: dict) -> dict[str, dict]:
    """A results.json's tests by stable item id, with the grader's own state as ``status``."""
    return {t["extra_data"]["id"]: {**t, "status": t["extra_data"]["state"]} for t in results_json["tests"]}
