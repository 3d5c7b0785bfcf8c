"""``grader assign``: turn a master notebook into the student notebook.

The student version keeps every cell of the master except ``instructor`` ones, in order and
with the same cell ids (the grader matches cells by id), replaces solution blocks by a
``NotImplementedError`` TODO, blanks written answers and clears all outputs.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat

from grader import cells

TODO_DEFAULT = "your code here"


def strip_solutions(code: str) -> str:
    """Replace each BEGIN/END SOLUTION block by a ``raise NotImplementedError`` TODO."""
    out: list[str] = []
    inside = False
    for line in code.splitlines():
        begin = cells.BEGIN_SOLUTION.match(line)
        if begin and not inside:
            inside = True
            todo = begin.group("todo").strip() or TODO_DEFAULT
            out.append(f'{begin.group("indent")}raise NotImplementedError({json.dumps("TODO: " + todo)})')
        elif cells.END_SOLUTION.match(line) and inside:
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("a '### BEGIN SOLUTION' block has no matching '### END SOLUTION'")
    return "\n".join(out) + ("\n" if code.endswith("\n") else "")


def blank_answer(code: str) -> str:
    """Keep the question literal of a Question/Answer code cell; empty the answer literal."""
    answer_at = code.find('"""Answer:')
    if answer_at < 0:
        answer_at = code.find('"Answer:')
    if answer_at < 0:
        raise ValueError("question cell has no Answer literal")
    return code[:answer_at] + '"""Answer: """\n'


def student_notebook(master: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version of ``master`` (a new notebook; ``master`` is not modified)."""
    student = copy.deepcopy(master)
    student.cells = []
    for cell in master.cells:
        if cells.INSTRUCTOR in cells.tags(cell):
            continue
        cell = copy.deepcopy(cell)
        if cell.cell_type == "code":
            text = cells.source(cell)
            if cells.QUESTION in cells.tags(cell):
                text = blank_answer(text)
            cell.source = strip_solutions(text)
            cell.outputs = []
            cell.execution_count = None
        student.cells.append(cell)
    return student


def student_path(master_path: Path, root: Path) -> Path:
    """solutions/<name>/<name>.ipynb -> assignments/<name>/<name>.ipynb under ``root``."""
    name = master_path.stem
    return root / "assignments" / name / f"{name}.ipynb"


def write_student_notebook(master_path: Path, target: Path) -> Path:
    master = nbformat.read(str(master_path), as_version=4)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(student_notebook(master), str(target))
    return target
