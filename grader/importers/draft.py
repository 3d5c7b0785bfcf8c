"""What every importer produces, and how it becomes an assignment under a root.

A ``Draft`` is a peer's assignment read into this project's terms: the master notebook (cells
tagged ``provided``, ``scaffold``, ``question`` and ``test``, as docs/authoring.md describes),
the written questions' rubric entries, one tag per peer question (so that results group each
question's items), the requirements, and ``notes``: every part of the peer's notebook that was
not carried over, with its cell and why. Nothing is dropped without a note.

``write_assignment`` tags ``demo`` the provided cells that call the students' functions, refuses
with a note (rather than the whole import) each test cell that uses a name no imported cell
defines or that the inline checks cannot use (``InlineError``), installs the requirements
(``grader.requirements``: once per content, into ``ROOT/envs/<digest>/``; a package that cannot
be installed stops the import), then writes the master, the rubric and, through ``grader assign``'s own function, the
student notebook and its check.py.
"""
from __future__ import annotations

import ast
import builtins
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import yaml

from grader import assign, cells, requirements
from grader.checks import inline

EXECUTION_TAG = "execution"
REQUIREMENTS = "requirements"    # ROOT/requirements/<name>.txt: what the assignment needs
REQUIREMENTS_FILE = "requirements.txt"   # beside a peer's notebook: its requirements


class ImportRefused(ValueError):
    """The peer's notebook cannot become an assignment at all (the reason says why)."""


@dataclass(frozen=True)
class WrittenQuestion:
    """A manually graded question of the peer's: its id, points, the prompt and the reference answer."""

    id: str
    points: float
    prompt: str
    answer: str


@dataclass
class Draft:
    """A peer's assignment in this project's terms (see the module's docstring)."""

    name: str
    source: str                     # the peer, as results name it: "otter-grader" or "nbgrader"
    notebook: nbformat.NotebookNode
    questions: list[WrittenQuestion] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- cells

def new_master() -> nbformat.NotebookNode:
    """An empty master notebook with a Python kernel."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def cell_id(text: str) -> str:
    """A cell id from a peer's name (nbformat allows letters, digits, - and _)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)[:64] or "cell"


def markdown_cell(text: str, cell_ref: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text, id=cell_id(cell_ref))


def provided_cell(source: str, cell_ref: str, notes: list[str]) -> nbformat.NotebookNode:
    """A provided cell of ``source`` without its IPython magics and shell lines (``%``, ``!``),
    each named in ``notes``: the grader runs the provided code as plain Python."""
    kept = []
    for number, line in enumerate(source.split("\n"), start=1):
        if line.lstrip()[:1] in ("%", "!"):
            notes.append(f"{cell_ref}, line {number}: `{line.strip()}` is IPython, not Python; not imported")
        else:
            kept.append(line)
    return nbformat.v4.new_code_cell("\n".join(kept), id=cell_id(cell_ref), metadata={"tags": [cells.PROVIDED]})


def defined_functions(source: str) -> list[str]:
    """The functions ``source`` defines at its top level, in order (what a scaffold declares)."""
    return [node.name for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def scaffold_cell(source: str, symbols: list[str], cell_ref: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, id=cell_id(cell_ref),
                                     metadata={"tags": [cells.SCAFFOLD], "g2c": {"symbols": symbols}})


def question_cell(question: WrittenQuestion) -> nbformat.NotebookNode:
    """A Question/Answer cell of two string literals (``grader assign`` blanks the answer)."""
    def literal(text: str) -> str:
        return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'
    source = f"{literal('Question: ' + question.prompt)}\n{literal('Answer: ' + question.answer)}\n"
    return nbformat.v4.new_code_cell(source, id=cell_id(f"question-{question.id}"),
                                     metadata={"tags": [cells.QUESTION], "g2c": {"question": question.id}})


def test_cell(name: str, points: float, hidden: bool, source: str, tag: str, title: str,
              message: str = "") -> nbformat.NotebookNode:
    """A test cell: one item named ``name`` (the peer's identity), tagged with its question."""
    declared: dict[str, Any] = {"name": name, "points": points, "visibility": "hidden" if hidden else "visible",
                                "title": title, "tags": [tag]}
    if message:
        declared["message"] = message
    return nbformat.v4.new_code_cell(source, id=cell_id(f"test-{name}"),
                                     metadata={"tags": [cells.TEST], "g2c": {"test": declared}})


def tag_name(text: str) -> str:
    """A rubric tag for a peer's question name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "question"


# ----------------------------------------------------------------------------- requirements

def requirement_lines(lines: list[str]) -> list[str]:
    """The requirements of a requirements file's lines: comments and blank lines left out."""
    found = [line.split("#", 1)[0].strip() for line in lines]
    return [line for line in found if line]


def read_requirements(path: Path) -> list[str]:
    """The requirements in the file at ``path`` (none when there is no such file)."""
    return requirement_lines(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else []


# ----------------------------------------------------------------------------- writing

def mark_demos(notebook: nbformat.NotebookNode) -> None:
    """Tag ``demo`` each provided cell that uses a function students write: it runs their code in
    the notebook run, and is no part of the module the probe imports."""
    written = {symbol for scaffold in cells.scaffolds(notebook) for symbol in scaffold.owners}
    for cell in notebook.cells:
        if cells.PROVIDED in cells.tags(cell) and written & {
                node.id for node in ast.walk(ast.parse(cells.source(cell))) if isinstance(node, ast.Name)}:
            cell.metadata["tags"] = [*cells.tags(cell), cells.DEMO]


def _bound(source: str) -> set[str]:
    """Every name ``source`` binds anywhere (assignments, definitions, imports, loop variables)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
    return found


def usable_tests(draft: Draft) -> None:
    """Drop, with a note, each test cell that uses a name no imported cell defines (its answer
    was not imported) or that the inline checks refuse (alone with the provided and scaffold
    cells, so that one bad cell costs its own item only)."""
    context = [c for c in draft.notebook.cells if {cells.PROVIDED, cells.SCAFFOLD} & set(cells.tags(c))]
    known = set(dir(builtins)).union(*(_bound(cells.source(c)) for c in context))
    kept = []
    for cell in draft.notebook.cells:
        if cells.TEST in cells.tags(cell):
            alone = copy.deepcopy(draft.notebook)
            alone.cells = [*context, cell]
            try:
                (test,) = inline.inline_tests(alone)
            except inline.InlineError as exc:
                draft.notes.append(f"{exc}: not imported")
                continue
            program = test.master_program   # doctest examples as Python, with the grader's own recording calls
            loads = {n.id for n in ast.walk(ast.parse(program)) if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Load) and not n.id.startswith("__g2c")}
            unknown = sorted(loads - known - _bound(program))
            if unknown:
                draft.notes.append(f"test cell {test.name}: uses {', '.join(unknown)}, which no imported cell "
                                   "defines (its answer was not imported): not imported")
                continue
        kept.append(cell)
    draft.notebook.cells = kept


def rubric_text(draft: Draft) -> str:
    """The imported assignment's rubric: its tags (one per peer question), a zero-point
    ``notebook_runs`` (so totals are the peer's; the untouched student notebook earns it unless
    a demo cell calls the code students write), the requirements and the written questions."""
    demos = any(cells.DEMO in cells.tags(cell) for cell in draft.notebook.cells)
    rubric: dict[str, Any] = {
        "assignment": draft.name,
        "tags": {EXECUTION_TAG: "the notebook runs headless", **draft.tags},
        "items": [{"name": "notebook_runs", "points": 0, "tags": [EXECUTION_TAG],
                   "title": "the notebook runs headless without an error", "baseline": not demos}],
        "settings": {"imported_from": draft.source, "requirements": list(draft.requirements)},
    }
    if draft.questions:
        rubric["written"] = {"questions": [{
            "id": q.id, "points": q.points,
            "criteria": [{"id": "answers_the_prompt", "points": q.points,
                          "earns": f"answers what the question asks, as the reference answer does: {q.prompt}",
                          "misses": "leaves the question unanswered, or answers another question"}]}
            for q in draft.questions]}
    header = f"# Imported from {draft.source} by `grader import`; edit it as any rubric (grader.rubric.RUBRIC_SCHEMA).\n"
    return header + yaml.safe_dump(rubric, sort_keys=False, allow_unicode=True, width=110)


def write_assignment(draft: Draft, root: Path) -> list[Path]:
    """Lay ``draft`` out under ``root``: requirements (installed first: a failure stops here),
    master notebook, rubric, then the student notebook and check.py. Refuses to write over an
    assignment of that name, or an assignment with nothing to grade."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", draft.name):
        raise ImportRefused(f"{draft.name!r}: an assignment's name is letters, digits and _ (pass --name)")
    master = root / "solutions" / draft.name / f"{draft.name}.ipynb"
    rubric = root / "rubrics" / f"{draft.name}.yaml"
    existing = [str(p) for p in (master, rubric) if p.exists()]
    if existing:
        raise ImportRefused(f"{', '.join(existing)} already exist: choose another --name or --out")
    mark_demos(draft.notebook)
    usable_tests(draft)
    if not cells.scaffolds(draft.notebook):
        raise ImportRefused("no question could be imported as code students write (see the notes above)")
    written = []
    if draft.requirements:
        listing = root / REQUIREMENTS / f"{draft.name}.txt"
        try:
            requirements.install(draft.requirements, root / requirements.ENVS)
        except requirements.RequirementsError as exc:
            raise ImportRefused(str(exc)) from None
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text("\n".join(draft.requirements) + "\n", encoding="utf-8")
        written.append(listing)
    master.parent.mkdir(parents=True)
    nbformat.write(draft.notebook, str(master))
    rubric.parent.mkdir(parents=True, exist_ok=True)
    rubric.write_text(rubric_text(draft), encoding="utf-8")
    return [*written, master, rubric, *assign.write_student_files(master, assign.student_path(master, root))]
