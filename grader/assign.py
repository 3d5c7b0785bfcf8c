"""``grader assign``: turn a master notebook into the student notebook and its ``check.py``.

The student version keeps every cell of the master except ``instructor`` ones and test cells
that are not ``visible``, in order and with the same cell ids (the grader matches cells by id), replaces solution blocks by a
``NotImplementedError`` TODO, blanks written answers and clears all outputs.

``check.py``, the pre-submission check students run beside the notebook, is
``check_template.py`` with its ``SPEC`` filled in from the student notebook, the rubric and the
public tests: the scaffold symbols, the provided cells' source, fingerprints of the questions,
the size and time limits, grading's environment and the modules each part needs; and with the
grader's own terminal sanitizer (``grader.report.terminal.plain``, copied as it is). It is
generated output, never edited by hand, so it follows the notebooks whenever they change.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import pprint
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nbformat

from grader import cells
from grader.assignment import Assignment
from grader.checks.inline import doctest_examples
from grader.execute import GRADING_ENV
from grader.report import terminal

TODO_DEFAULT = "your code here"
CHECK_SCRIPT = "check.py"
CHECK_TEMPLATE = Path(__file__).with_name("check_template.py")
SPEC_LINE = "SPEC: Dict[str, Any] = {}  # the assignment's data: `grader assign` writes it here\n"
PLAIN_LINE = "# `grader assign` writes grader/report/terminal.py's `plain` here\n"
PLAIN_BLOCK = ("# BEGIN plain", "# END plain\n")   # the first and last line of that block in terminal.py
PUBLIC_TESTS = "tests"          # the public tests' folder beside the student notebook, when there are any
NOTEBOOK_ENV = "NOTEBOOK_ENV"   # the conftest constant naming the variable that selects the notebook
RUN_MODULES = ("nbformat", "nbclient", "ipykernel")   # what check.py --run needs to run a notebook


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
    hidden = {t.cell_id for t in cells.test_cells(master) if t.visibility != "visible"}
    for cell in master.cells:
        if cells.INSTRUCTOR in cells.tags(cell) or cell.id in hidden:
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


def _fingerprint(text: str) -> str:
    """What check.py's ``fingerprint`` computes (the first 16 hex digits of the sha256)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _third_party_imports(sources: Iterable[str], local: set[str]) -> list[str]:
    """The top-level modules that ``sources`` import, anywhere in the code, that are neither in
    the standard library nor in ``local``: what a student's Python must have installed."""
    found: set[str] = set()
    for source in sources:
        code = "\n".join("" if line.lstrip()[:1] in ("%", "!") else line for line in source.split("\n"))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return sorted(found - set(sys.stdlib_module_names) - local - {"__future__"})


def _public_tests(tests: Path, student: nbformat.NotebookNode) -> dict[str, Any] | None:
    """How check.py runs the public tests in ``tests`` (None when the assignment has none): the
    variable that points them at a notebook (the conftest's ``NOTEBOOK_ENV``) and the modules
    they and the notebook code they load need."""
    files = sorted(tests.glob("*.py")) if tests.is_dir() else []
    if not files:
        return None
    conftest = tests / "conftest.py"
    tree = ast.parse(conftest.read_text(encoding="utf-8")) if conftest.is_file() else ast.Module(body=[])
    env = next((node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == [NOTEBOOK_ENV]
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)), None)
    if env is None:
        raise ValueError(f"{conftest}: the public tests need a `{NOTEBOOK_ENV} = \"...\"` constant naming the "
                         "environment variable that selects the notebook they test")
    loaded = [cells.source(c) for c in student.cells if c.cell_type == "code"
              and {cells.PROVIDED, cells.SCAFFOLD} & set(cells.tags(c))]
    sources = [path.read_text(encoding="utf-8") for path in files] + loaded
    needs = _third_party_imports(sources, {path.stem for path in files})
    return {"folder": tests.name, "env": env, "needs": sorted({"pytest", *needs})}


def check_spec(assignment: Assignment, student: nbformat.NotebookNode) -> dict[str, Any]:
    """The data check.py carries: everything it must know about the assignment, from the student
    notebook ``student`` (as ``student_notebook`` makes it), the rubric and the public tests.

    Raises ValueError when a provided cell differs between master and student notebook (it
    holds a solution block): check.py runs the provided cells, so it would ship the solution."""
    master_provided = {c.id: cells.source(c) for c in assignment.master.cells if cells.PROVIDED in cells.tags(c)}
    provided = [{"id": c.id, "source": cells.source(c)} for c in student.cells if cells.PROVIDED in cells.tags(c)]
    for cell in provided:
        if master_provided[cell["id"]] != cell["source"]:
            raise ValueError(f"provided cell {cell['id']!r} holds a solution block; the grader runs the master's "
                             "copy, which check.py cannot ship")
    questions = []
    for cell in student.cells:
        parsed = cells.parse_written_answer(cell) if cells.QUESTION in cells.tags(cell) else None
        if parsed is not None and cells.question_id(cell):
            questions.append({"id": cells.question_id(cell), "question": _fingerprint(parsed.question),
                              "template_answer": parsed.answer.strip()})
    limits = assignment.rubric.limits
    code = [cells.source(c) for c in student.cells if c.cell_type == "code"]
    return {
        "assignment": assignment.name,
        "notebook": assignment.template_path.name,
        "max_bytes": int(limits.notebook_max_mib * 2**20),
        "scaffolds": [{"cell_id": s.cell_id, "symbols": list(s.symbols)} for s in cells.scaffolds(student)],
        "provided": provided,
        "cell_order": [c.id for c in student.cells],
        # the visible test cells: grading's run leaves them out (the probe decides each as an item),
        # so does --run, which then runs them, as shipped, against the notebook's code
        "test_cells": [{"id": t.cell_id, "name": t.name, "source": t.source, "doctest": doctest_examples(t.source)}
                       for t in cells.test_cells(student)],
        "questions": questions,
        "public_tests": _public_tests(assignment.template_path.parent / PUBLIC_TESTS, student),
        "run": {"cell_timeout_s": limits.cell_timeout_s, "notebook_timeout_s": limits.notebook_timeout_s,
                "env": dict(GRADING_ENV), "needs": sorted({*RUN_MODULES, *_third_party_imports(code, set())})},
    }


def plain_source() -> str:
    """The source of the grader's terminal sanitizer, ``terminal.plain`` and its patterns, from
    the ``PLAIN_BLOCK`` lines of terminal.py (included): what check.py carries."""
    text = Path(terminal.__file__).read_text(encoding="utf-8")
    begin, end = PLAIN_BLOCK
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{terminal.__file__} must hold the lines {begin!r} and {end!r} exactly once")
    return text[text.index(begin):text.index(end) + len(end)]


def check_script(spec: dict[str, Any]) -> str:
    """check.py's source: the template with ``spec`` in place of its empty ``SPEC`` and the
    terminal sanitizer in place of its ``PLAIN_LINE``."""
    template = CHECK_TEMPLATE.read_text(encoding="utf-8")
    for line in (SPEC_LINE, PLAIN_LINE):
        if template.count(line) != 1:
            raise ValueError(f"{CHECK_TEMPLATE} must hold the line {line!r} exactly once")
    data = pprint.pformat(spec, width=110, sort_dicts=False)
    return (template.replace(PLAIN_LINE, plain_source())
            .replace(SPEC_LINE, f"SPEC: Dict[str, Any] = {data}  # written by `grader assign`\n"))


def write_student_files(master_path: Path, target: Path) -> list[Path]:
    """Write the student notebook of ``master_path`` to ``target`` and its check.py beside it.

    The rubric and the public tests are the project's, found from the master's place in it
    (``solutions/<name>/<name>.ipynb``), wherever ``target`` is."""
    master_path = master_path.resolve()
    assignment = Assignment(master_path.stem, master_path.parents[2])
    if assignment.master_path != master_path or not assignment.rubric_path.is_file():
        raise ValueError(f"{master_path}: check.py needs the rubric, {assignment.rubric_path}, beside a master "
                         "notebook at solutions/<name>/<name>.ipynb")
    student = student_notebook(assignment.master)
    script = check_script(check_spec(assignment, student))
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(student, str(target))
    check = target.parent / CHECK_SCRIPT
    check.write_text(script, encoding="utf-8")
    return [target, check]


# ----------------------------------------------------------------------------- a new assignment

NEW_SCAFFOLD = '''\
def mean_square(x):
    """The mean of the squares of the entries of the array ``x``, as a float."""
    ### BEGIN SOLUTION
    return float(np.mean(np.square(x)))
    ### END SOLUTION
'''
NEW_TESTS = (
    ("mean_square_small", 1, "visible", '''\
assert mean_square(np.array([3.0, 4.0])) == 12.5
assert np.isclose(mean_square(np.arange(4.0)), 3.5)
'''),
    ("mean_square_random", 2, "hidden", '''\
rng = np.random.default_rng(0)
for size in (1, 10, 100):
    x = rng.standard_normal(size)
    np.testing.assert_allclose(mean_square(x), np.mean(x ** 2), rtol=1e-12)
'''),
)
NEW_RUBRIC = '''\
# The rubric of {name}: every key it may hold is in the rubric reference (grader.rubric.RUBRIC_SCHEMA).
# The test cells of the master notebook are items of their own, declared in their metadata.
assignment: {name}
tags:
  execution: "the notebook runs headless"
  values: "the functions' values"
items:
  - {{name: notebook_runs, points: 1, tags: [execution], title: "the notebook runs headless without an error", baseline: true}}
written:
  questions:
    - id: q1
      points: 1
      criteria:
        - {{id: nonnegative, points: 1, earns: "says that each square is at least zero, so their mean is too",
           misses: "restates the definition without saying why it is never negative"}}
'''


def new_master(name: str) -> nbformat.NotebookNode:
    """The master notebook ``grader new`` lays out: a scaffold cell, a written question and
    two test cells (one the student sees, one hidden)."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [
        nbformat.v4.new_markdown_cell(
            f"# {name}\n\nWrite `mean_square` below, then answer the question. Before you submit, run "
            "`python check.py` beside this notebook (it needs `pip install numpy nbformat`).", id="intro"),
        nbformat.v4.new_code_cell("import numpy as np\n", id="imports", metadata={"tags": [cells.PROVIDED]}),
        nbformat.v4.new_code_cell(NEW_SCAFFOLD, id="mean-square",
                                  metadata={"tags": [cells.SCAFFOLD], "g2c": {"symbols": ["mean_square"]}}),
        nbformat.v4.new_code_cell('"""Question: Why is the mean of squares never negative?"""\n'
                                  '"""Answer: Each square is at least zero, so their mean is at least zero too."""\n',
                                  id="q1", metadata={"tags": [cells.QUESTION], "g2c": {"question": "q1"}}),
    ]
    for test, points, visibility, source in NEW_TESTS:
        notebook.cells.append(nbformat.v4.new_code_cell(source, id=test.replace("_", "-"), metadata={
            "tags": [cells.TEST], "g2c": {"test": {"name": test, "points": points, "visibility": visibility,
                                                  "tags": ["values"]}}}))
    return notebook


def new_assignment(name: str, root: Path) -> list[Path]:
    """Lay out the assignment ``name`` under ``root`` (its master notebook and rubric), then
    its student notebook and check.py. Refuses to write over an assignment of that name."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r}: an assignment's name is letters, digits and _ (it names folders and a module)")
    master = root / "solutions" / name / f"{name}.ipynb"
    rubric = root / "rubrics" / f"{name}.yaml"
    existing = [str(p) for p in (master, rubric) if p.exists()]
    if existing:
        raise ValueError(f"{', '.join(existing)} already exist: choose another name or --out")
    master.parent.mkdir(parents=True)
    nbformat.write(new_master(name), str(master))
    rubric.parent.mkdir(parents=True, exist_ok=True)
    rubric.write_text(NEW_RUBRIC.format(name=name), encoding="utf-8")
    return [master, rubric, *write_student_files(master, student_path(master, root))]
