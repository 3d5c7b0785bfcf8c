"""Stage 1, load: read a submission, its notebook and/or the package files its scaffold cells
declare (``metadata.g2c.package_file``), and find what the grader needs in them.

Nothing here executes student code. Every problem becomes a readable reason on the
``Submission`` (``fatal`` when the notebook cannot be graded, ``scaffold_problem`` when a
scaffold cannot, ``notes`` otherwise) instead of an exception, so one broken submission never
stops a batch.
"""
from __future__ import annotations

import ast
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from grader import cells
from grader.graft import provided_names
from grader.intake import Refused, read_file, relative_name, submission_files, submission_sha256

@dataclass
class Submission:
    """A submission as loaded: the notebook (when readable) and what was found in it and in the
    package files."""

    submission_id: str
    path: Path | None                     # the notebook; None when the submission holds only package files
    sha256: str                           # of every file graded, see ``submission_sha256``
    notebook: nbformat.NotebookNode | None = None
    fatal: str | None = None              # why the notebook cannot be graded (a package file still is)
    notes: list[str] = field(default_factory=list)
    scaffold_sources: dict[str, str] = field(default_factory=dict)   # scaffold cell id -> the student's code
    scaffold_problem: str | None = None   # why a scaffold cannot be graded (the first one found)
    ungraded: dict[str, str] = field(default_factory=dict)   # each owner of a scaffold not graded -> why
    package_scaffolds: dict[str, str] = field(default_factory=dict)  # scaffold cell id -> its package file
    replaced_cells: dict[str, int] = field(default_factory=dict)     # scaffold cell id -> notebook cell it replaces
    sources: dict[str, Any] = field(default_factory=dict)   # which file each part came from (package-style only)
    answers: dict[str, cells.WrittenAnswer] = field(default_factory=dict)
    unchanged: set[str] = field(default_factory=set)   # answers still as the template has them
    duplicate_answers: dict[str, list[int]] = field(default_factory=dict)   # question id -> later cells claiming it
    # The run the written answers discuss, from the report cell's stored output (see
    # ``cells.read_report``): None with ``report_missing`` saying why when it cannot be read, and
    # None with no reason when the assignment has no report cell.
    report: cells.Report | None = None
    report_missing: str = ""


def load_submission(path: Path | None, submission_id: str, template: nbformat.NotebookNode,
                    max_bytes: int, folder: Path | None = None) -> Submission:
    """Read the notebook ``path`` (None when there is none) and, from ``folder`` (the submission's
    folder; None for a lone notebook), the package files of ``template``'s scaffold cells.
    ``template`` is the student notebook: its scaffold cells declare what to look for, its
    questions match the written answers. A package file holds its scaffold instead of the
    notebook, so a submission graded from it needs no readable notebook for that part."""
    files = submission_files(path, folder, package_files(template))
    sub = Submission(submission_id, path, submission_sha256(files, folder, max_bytes))
    if path is None:
        sub.fatal = (f"the submission has no notebook (.ipynb), only {', '.join(sorted(files))}; "
                     "the exercises and the written answers are graded from the notebook")
    else:
        _read_notebook(sub, path, folder or path.parent, max_bytes)
    _find_scaffolds(sub, template, files, folder, max_bytes)
    if sub.notebook is not None:
        _find_answers(sub, template)
        _find_report(sub, template)
    if sub.package_scaffolds:
        _record_sources(sub, template, None if path is None else relative_name(path, folder))
    return sub


def package_files(template: nbformat.NotebookNode) -> list[str]:
    """The package files the assignment's scaffold cells declare (relative to a submission folder)."""
    return [s.package_file for s in cells.scaffolds(template) if s.package_file]


def _read_notebook(sub: Submission, path: Path, root: Path, max_bytes: int) -> None:
    """``sub.notebook``, or ``sub.fatal`` saying why the file is not a notebook the grader can read."""
    try:
        data = read_file(path, root, max_bytes, "the notebook")
    except Refused as exc:
        sub.fatal = str(exc) + ("; clear large outputs (Kernel > Restart & Clear Output) and resubmit"
                                if exc.too_large else "")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        sub.fatal = f"the file is not UTF-8 text (byte {exc.start}); is it really a .ipynb notebook?"
        return
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        sub.fatal = f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        return
    except (RecursionError, MemoryError, ValueError) as exc:   # nesting or numbers past the parser's limits
        sub.fatal = f"the file's JSON cannot be read: {cells.parse_failure(exc)}"
        return
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        sub.fatal = "the JSON is not a Jupyter notebook (no list of cells)"
        return
    if raw.get("nbformat") != 4:
        sub.fatal = (f"unsupported notebook format {raw.get('nbformat')!r}; "
                     "save the notebook with Jupyter (nbformat 4)")
        return
    try:
        sub.notebook = _to_notebook(raw, sub.notes)
    except (RecursionError, MemoryError) as exc:
        sub.notes.append(f"the notebook cannot be read: {cells.parse_failure(exc)}")
        sub.notebook = None
    if sub.notebook is None:
        sub.fatal = sub.notes.pop()


def _to_notebook(raw: dict, notes: list[str]) -> nbformat.NotebookNode | None:
    """A valid NotebookNode, repairing what can be repaired (and saying so in notes)."""
    raw = copy.deepcopy(raw)
    seen: set[str] = set()
    for index, cell in enumerate(raw["cells"]):
        if not isinstance(cell, dict):
            notes.append(f"cell {index} is not a JSON object")
            return None
        cell_id = cell.get("id")
        if isinstance(cell_id, str) and cell_id in seen:
            notes.append(f"duplicate cell id {cell_id!r} (cell {index}); it was renamed for grading")
            cell["id"] = f"{cell_id}-dup{index}"
        if isinstance(cell.get("id"), str):
            seen.add(cell["id"])
    try:
        notebook = nbformat.from_dict(raw)
        nbformat.validate(notebook)
    except Exception as exc:  # nbformat raises several types; all mean "not a valid notebook"
        notes.append(f"the notebook does not follow the nbformat 4 schema: {str(exc).splitlines()[0]}")
        return None
    return notebook


def defined_names(code: str) -> list[str] | None:
    """Top-level class and function names a cell defines, or None when it is not valid Python."""
    names = _defined_names(code)
    return None if names is None else list(names)


@cells.memoized
def _defined_names(code: str) -> tuple[str, ...] | None:
    try:
        module = cells.parse_python(code)
    except SyntaxError:
        return None
    return tuple(node.name for node in module.body
                 if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))


def _find_scaffolds(sub: Submission, template: nbformat.NotebookNode, files: dict[str, Path],
                    folder: Path | None, max_bytes: int) -> None:
    """For each scaffold cell the template declares, the student's code for it: its package file
    when the submission holds one (it wins over the notebook, with a note), else the notebook's
    cell defining its symbols' owners (classes or functions); the last one wins, as in Python.
    Found by what the code defines, never by cell id or metadata, which editors strip."""
    for scaffold in cells.scaffolds(template):
        if scaffold.package_file in files:
            sub.package_scaffolds[scaffold.cell_id] = scaffold.package_file
            source, problem = _package_scaffold(folder, scaffold, provided_names(template), max_bytes)
            defining = [] if sub.notebook is None else _defining_cells(sub.notebook, scaffold)[0]
            if defining:
                sub.replaced_cells[scaffold.cell_id] = defining[-1]
                sub.notes.append(f"{', '.join(scaffold.owners)} is in {scaffold.package_file} and in the notebook "
                                 f"(cell {defining[-1]}): the package file wins, the notebook's cell is not graded")
        elif sub.notebook is not None:
            source, problem = _find_scaffold(sub, scaffold)
        else:
            continue   # no notebook: ``fatal`` says so
        if problem:
            sub.scaffold_problem = sub.scaffold_problem or problem
            sub.ungraded.update(dict.fromkeys(scaffold.owners, problem))
        else:
            sub.scaffold_sources[scaffold.cell_id] = source


def _defining_cells(notebook: nbformat.NotebookNode, scaffold: cells.Scaffold) -> tuple[list[int], list[int]]:
    """The code cells that define one of the scaffold's owners, and those that mention one's
    definition but are not valid Python."""
    defining: list[int] = []
    broken: list[int] = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        code = cells.source(cell)
        names = defined_names(code)
        if names is None:
            if any(scaffold.definition(o) in code for o in scaffold.owners):
                broken.append(index)
        elif set(scaffold.owners) & set(names):
            defining.append(index)
    return defining, broken


def _find_scaffold(sub: Submission, scaffold: cells.Scaffold) -> tuple[str, str | None]:
    owner = scaffold.owners[0]
    defining, broken = _defining_cells(sub.notebook, scaffold)
    if not defining:
        if broken:
            return "", f"the cell defining {owner} (cell {broken[-1]}) is not valid Python"
        return "", (f"no cell defines `{scaffold.definition(owner)}`; restore the scaffold "
                    "cell from the assignment notebook and keep the name")
    if len(defining) > 1:
        sub.notes.append(f"{owner} is defined in {len(defining)} cells "
                         f"({', '.join(map(str, defining))}); the last one is graded")
    return cells.source(sub.notebook.cells[defining[-1]]), None


def _package_scaffold(folder: Path, scaffold: cells.Scaffold, provided: set[str],
                      max_bytes: int) -> tuple[str, str | None]:
    """The package file's code as its notebook cell's (see ``_as_cell``), or why it cannot be
    graded. It is parsed here, never run: the probe and the notebook run it in the sandbox."""
    name, owner = scaffold.package_file, scaffold.owners[0]
    try:
        data = read_file(folder / name, folder, max_bytes, name)
    except Refused as exc:
        return "", f"{exc}; submit the file itself"
    try:
        code = data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        return "", f"{name} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
    try:
        tree = cells.parse_python(code)
    except SyntaxError as exc:
        return "", f"{name} is not valid Python: {cells.syntax_problem(exc)}"
    if not set(scaffold.owners) & set(defined_names(code)):
        return "", f"{name} defines no `{scaffold.definition(owner)}`; keep the name the assignment gives"
    return _as_cell(code, tree, name.split("/")[0], provided), None


def _as_cell(code: str, tree: ast.Module, package: str, provided: set[str]) -> str:
    """A package file's code as the scaffold cell of a notebook. Its imports of provided names
    from the course package (``from g2c.nn import Module``, or relative ones) become comments:
    the grader's provided code defines those names, under the master notebook's names.
    Everything else stays as written, at its line number, so the graft and
    the notebook run treat the file as a notebook cell; an import of anything else from the
    course package fails there as it would in a cell. Only imports alone on their lines are
    rewritten."""
    lines = code.split("\n")
    for node, following in zip(tree.body, [*tree.body[1:], None]):
        if (not isinstance(node, ast.ImportFrom) or node.col_offset
                or (following is not None and following.lineno <= node.end_lineno)):
            continue
        if node.level or (node.module or "").split(".")[0] == package:
            kept = [a for a in node.names if (a.asname or a.name) not in provided]
            why = "the grader's provided code defines " + ", ".join(
                a.asname or a.name for a in node.names if a not in kept)
        else:
            continue
        if len(kept) == len(node.names):
            continue
        first = (f"{ast.unparse(ast.ImportFrom(node.module, kept, node.level))}  # {why}" if kept
                 else f"# {ast.unparse(node)}  ({why})")
        lines[node.lineno - 1: node.end_lineno] = [first] + [""] * (node.end_lineno - node.lineno)
    return "\n".join(lines)


def _record_sources(sub: Submission, template: nbformat.NotebookNode, notebook: str | None) -> None:
    """Which file each part was graded from: a line of the notes and ``sub.sources``."""
    scaffolds = {s.cell_id: s for s in cells.scaffolds(template)}
    origin = {cell_id: sub.package_scaffolds.get(cell_id, notebook) for cell_id in scaffolds
              if cell_id in sub.package_scaffolds or cell_id in sub.scaffold_sources}
    sub.sources = {"scaffolds": origin, "notebook": notebook}
    parts = [f"scaffold {', '.join(scaffolds[cell_id].owners)}: from {name}" for cell_id, name in origin.items()]
    parts.append(f"exercises and answers: from {notebook}" if notebook else "exercises and answers: no notebook")
    sub.notes.append("; ".join(parts))


def _find_answers(sub: Submission, template: nbformat.NotebookNode) -> None:
    """Written answers by question id (cell metadata), falling back to the question text. The
    first cell claiming a question is its answer: a later one (an extra cell carrying a copied
    id, say) is not graded, is named in the notes and in ``duplicate_answers``, and flags the
    question for review, so that no cell can replace the answer a TA reads first."""
    by_text, template_answers = {}, {}
    for cell in template.cells:
        qid = cells.question_id(cell)
        parsed = cells.parse_written_answer(cell)
        if qid and parsed:
            by_text[parsed.question] = qid
            template_answers[qid] = parsed.answer.strip()
    first: dict[str, int] = {}
    for index, cell in enumerate(sub.notebook.cells):
        parsed = cells.parse_written_answer(cell)
        if parsed is None:
            continue
        qid = cells.question_id(cell) or by_text.get(parsed.question)
        if qid is None:
            continue
        if qid in sub.answers:
            sub.duplicate_answers.setdefault(qid, []).append(index)
        else:
            sub.answers[qid], first[qid] = parsed, index
    for qid, later in sub.duplicate_answers.items():
        sub.notes.append(f"{qid} is answered in {len(later) + 1} cells ({', '.join(map(str, [first[qid], *later]))}): "
                         "the first is graded, the others are not, and the answer is flagged for review")
    sub.unchanged = {qid for qid, parsed in sub.answers.items()
                     if not parsed.is_blank and parsed.answer.strip() == template_answers.get(qid)}


def _find_report(sub: Submission, template: nbformat.NotebookNode) -> None:
    """The stored output of the notebook's own copy of the template's report cell (by cell id, as
    provided cells are matched): what the student's run produced, before the grader runs anything."""
    cell_id = next((c.get("id") for c in template.cells if cells.REPORT in cells.tags(c)), None)
    if cell_id is None:
        return
    cell = next((c for c in sub.notebook.cells if c.get("id") == cell_id), None)
    found = (cells.read_report(cell) if cell is not None
             else f"the notebook has no report cell (id {cell_id!r}): it was deleted, or its id was lost")
    if isinstance(found, str):
        sub.report_missing = found
    else:
        sub.report = found
