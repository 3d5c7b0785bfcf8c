"""nbgrader's source notebook format, read into a ``Draft``.

nbgrader marks cells in their metadata (``metadata.nbgrader``: ``solution``, ``grade``,
``locked``, ``task``, ``points``, ``grade_id``). What each kind becomes:

- an autograded answer (code, ``solution``): a ``scaffold`` cell declaring the functions it
  defines; its ``### BEGIN SOLUTION`` / ``### END SOLUTION`` blocks are this project's markup
  already;
- autograder tests (code, ``grade``, not ``solution``): a test cell named by its ``grade_id``,
  with its ``points``, tagged with it; a cell with a ``### BEGIN HIDDEN TESTS`` block is hidden
  whole (an item here is one cell, and nbgrader scores the cell as one);
- a manually graded answer (Markdown, ``solution`` and ``grade``): a written question, its
  prompt the Markdown cell before it, its source the reference answer;
- any other code cell: ``provided``; Markdown: as it is;
- a ``requirements.txt`` beside the notebook: the assignment's requirements.

Refused, each with a note: manually graded code answers and task cells (graded by hand, with no
written-answer form here), solution cells without a solution block or defining no function,
tests whose last statement is an expression (nbgrader reads its value as partial credit, which
a test cell here does not give) and tests worth no points.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import nbformat

from grader import cells
from grader.importers.draft import (REQUIREMENTS_FILE, Draft, ImportRefused, WrittenQuestion, defined_functions,
                                    markdown_cell, new_master, provided_cell, question_cell, read_requirements, scaffold_cell,
                                    tag_name, test_cell)

SOURCE = "nbgrader"
HIDDEN_TESTS = re.compile(r"^\s*### (BEGIN|END) HIDDEN TESTS\s*$")


def read(source_path: Path, name: str | None = None) -> Draft:
    """nbgrader's source notebook at ``source_path`` as a draft (``name``: the assignment's name,
    default the notebook's stem). Raises ImportRefused when no cell carries nbgrader metadata."""
    notebook = nbformat.read(str(source_path), as_version=4)
    if not any(_marks(cell) for cell in notebook.cells):
        raise ImportRefused("not an nbgrader source notebook: no cell has nbgrader metadata")
    draft = Draft(name or source_path.stem, SOURCE, new_master())
    draft.requirements = read_requirements(source_path.parent / REQUIREMENTS_FILE)
    for number, cell in enumerate(notebook.cells, start=1):
        _cell(cell, f"cell {number}", draft)
    return draft


def _marks(cell: Any) -> dict[str, Any]:
    found = cell.get("metadata", {}).get("nbgrader", {})
    return found if isinstance(found, dict) else {}


def _cell(cell: Any, where: str, draft: Draft) -> None:
    marks, text = _marks(cell), cells.source(cell)
    grade_id = str(marks.get("grade_id") or where.replace(" ", "-"))
    where = f"{where} ({grade_id})" if marks else where
    points = float(marks.get("points") or 0)
    if marks.get("task"):
        draft.notes.append(f"{where}: a task cell (graded by hand over the whole notebook) has no item here; "
                           "the cell is kept as text")
        draft.notebook.cells.append(markdown_cell(text, where))
    elif cell.cell_type == "markdown" and marks.get("solution") and marks.get("grade"):
        _written(grade_id, points, text, where, draft)
    elif cell.cell_type == "markdown" or cell.cell_type == "raw":
        if cell.cell_type == "raw":
            draft.notes.append(f"{where}: a raw cell, kept as Markdown")
        draft.notebook.cells.append(markdown_cell(text, where))
    elif marks.get("solution") and marks.get("grade"):
        draft.notes.append(f"{where}: a manually graded code answer has no written-answer form here; grade it by "
                           "hand; not imported")
    elif marks.get("solution"):
        _scaffold(grade_id, text, where, draft)
    elif marks.get("grade"):
        _test(grade_id, points, text, where, draft)
    else:
        draft.notebook.cells.append(provided_cell(text, where, draft.notes))


def _written(grade_id: str, points: float, text: str, where: str, draft: Draft) -> None:
    """A manually graded Markdown answer: the Markdown cell before it is its prompt."""
    previous = draft.notebook.cells[-1] if draft.notebook.cells else None
    if previous is None or previous.cell_type != "markdown":
        draft.notes.append(f"{where}: a written answer with no Markdown prompt before it, not imported")
        return
    if points <= 0:
        draft.notes.append(f"{where}: a written answer worth no points, not imported")
        return
    answer = "\n".join(line for line in text.split("\n")
                       if not (cells.BEGIN_SOLUTION.match(line) or cells.END_SOLUTION.match(line)))
    draft.notebook.cells.pop()   # the question cell carries the prompt
    question = WrittenQuestion(tag_name(grade_id), points, cells.source(previous).strip(), answer.strip())
    draft.questions.append(question)
    draft.notebook.cells.append(question_cell(question))


def _scaffold(grade_id: str, text: str, where: str, draft: Draft) -> None:
    try:
        functions = defined_functions(text)
    except SyntaxError as exc:
        draft.notes.append(f"{where}: not valid Python ({exc.msg}, line {exc.lineno}); not imported")
        return
    if not any(cells.BEGIN_SOLUTION.match(line) for line in text.split("\n")):
        problem = ("it has no ### BEGIN SOLUTION block (nbgrader replaces such a cell whole): mark the solution "
                   "inside its functions")
    elif not functions:
        problem = "its solution is a value, not a function: the grader grades the functions students write"
    else:
        draft.notebook.cells.append(scaffold_cell(text, functions, f"scaffold-{grade_id}"))
        return
    draft.notes.append(f"{where}: {problem}; not imported")


def _test(grade_id: str, points: float, text: str, where: str, draft: Draft) -> None:
    lines = text.split("\n")
    hidden = any(HIDDEN_TESTS.match(line) for line in lines)
    source = "\n".join(line for line in lines if not HIDDEN_TESTS.match(line)).strip("\n") + "\n"
    try:
        body = ast.parse(source).body
    except SyntaxError as exc:
        draft.notes.append(f"{where}: not valid Python ({exc.msg}, line {exc.lineno}); not imported")
        return
    if points <= 0:
        draft.notes.append(f"{where}: a test worth no points, not imported")
    elif body and isinstance(body[-1], ast.Expr) and not _valueless(body[-1].value):
        draft.notes.append(f"{where}: its last statement is an expression, whose value nbgrader reads as partial "
                           "credit; a test here passes or fails whole: not imported (assert on it instead)")
    else:
        tag = tag_name(grade_id)
        name = grade_id if re.fullmatch(r"[A-Za-z_][\w-]{0,79}", grade_id) else f"t_{tag[:78]}"
        if name != grade_id:
            draft.notes.append(f"{where}: grade_id {grade_id!r} is not an item name here; the item is {name!r}")
        draft.tags[tag] = f"nbgrader grade cell {grade_id}"
        draft.notebook.cells.append(test_cell(name, points, hidden, source, tag, grade_id))


def _valueless(expression: ast.expr) -> bool:
    """An expression statement that shows no value: a constant, or a call of an ``assert*``
    function or of ``print`` (which return None)."""
    if isinstance(expression, ast.Constant):
        return True
    if not isinstance(expression, ast.Call):
        return False
    function = expression.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return name.startswith("assert") or name == "print"
