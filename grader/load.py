"""Stage 1, load: read a submitted notebook and find what the grader needs in it.

Nothing here executes student code. Every problem becomes a readable reason on the
``Submission`` (``fatal`` when nothing can be graded, ``notes`` otherwise) instead of an
exception, so one broken notebook never stops a batch.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader import cells

@dataclass
class Submission:
    """A submission as loaded: the notebook (when readable) and what was found in it."""

    submission_id: str
    path: Path
    sha256: str
    notebook: nbformat.NotebookNode | None = None
    fatal: str | None = None              # why nothing in this notebook can be graded
    notes: list[str] = field(default_factory=list)
    scaffold_sources: dict[str, str] = field(default_factory=dict)   # scaffold cell id -> the student's cell
    scaffold_problem: str | None = None   # why the scaffold cannot be graded
    answers: dict[str, cells.WrittenAnswer] = field(default_factory=dict)
    unchanged: set[str] = field(default_factory=set)   # answers still as the template has them


def load_submission(path: Path, submission_id: str, template: nbformat.NotebookNode,
                    max_bytes: int) -> Submission:
    """Read ``path``; ``template`` is the student notebook: its scaffold cells declare what to
    look for, its questions match the written answers."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    sub = Submission(submission_id, path, hashlib.sha256(data).hexdigest())
    if size > max_bytes:
        sub.sha256 = sha256_file(path)
        sub.fatal = (f"the notebook is {size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB "
                     "limit; clear large outputs (Kernel > Restart & Clear Output) and resubmit")
        return sub
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        sub.fatal = f"the file is not UTF-8 text (byte {exc.start}); is it really a .ipynb notebook?"
        return sub
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        sub.fatal = f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        return sub
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        sub.fatal = "the JSON is not a Jupyter notebook (no list of cells)"
        return sub
    if raw.get("nbformat") != 4:
        sub.fatal = (f"unsupported notebook format {raw.get('nbformat')!r}; "
                     "save the notebook with Jupyter (nbformat 4)")
        return sub
    sub.notebook = _to_notebook(raw, sub.notes)
    if sub.notebook is None:
        sub.fatal = sub.notes.pop()
        return sub
    _find_scaffolds(sub, template)
    _find_answers(sub, template)
    return sub


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    try:
        module = ast.parse(code)
    except SyntaxError:
        return None
    return [node.name for node in module.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]


def _find_scaffolds(sub: Submission, template: nbformat.NotebookNode) -> None:
    """For each scaffold cell the template declares, the submission's cell defining its
    symbols' owners (classes or functions); the last one wins, as in Python. Found by what the
    code defines, never by cell id or metadata, which editors strip."""
    for scaffold in cells.scaffolds(template):
        source, problem = _find_scaffold(sub, scaffold)
        if problem:
            sub.scaffold_problem = sub.scaffold_problem or problem
        else:
            sub.scaffold_sources[scaffold.cell_id] = source


def _find_scaffold(sub: Submission, scaffold: cells.Scaffold) -> tuple[str, str | None]:
    owner = scaffold.owners[0]
    candidates: list[tuple[int, str]] = []
    broken: list[int] = []
    for index, cell in enumerate(sub.notebook.cells):
        if cell.cell_type != "code":
            continue
        code = cells.source(cell)
        names = defined_names(code)
        if names is None:
            if any(scaffold.definition(o) in code for o in scaffold.owners):
                broken.append(index)
        elif set(scaffold.owners) & set(names):
            candidates.append((index, code))
    if not candidates:
        if broken:
            return "", f"the cell defining {owner} (cell {broken[-1]}) is not valid Python"
        return "", (f"no cell defines `{scaffold.definition(owner)}`; restore the scaffold "
                    "cell from the assignment notebook and keep the name")
    if len(candidates) > 1:
        sub.notes.append(f"{owner} is defined in {len(candidates)} cells "
                         f"({', '.join(str(i) for i, _ in candidates)}); the last one is graded")
    return candidates[-1][1], None


def _find_answers(sub: Submission, template: nbformat.NotebookNode) -> None:
    """Written answers by question id (cell metadata), falling back to the question text."""
    by_text, template_answers = {}, {}
    for cell in template.cells:
        qid = cells.question_id(cell)
        parsed = cells.parse_written_answer(cell)
        if qid and parsed:
            by_text[parsed.question] = qid
            template_answers[qid] = parsed.answer.strip()
    for cell in sub.notebook.cells:
        parsed = cells.parse_written_answer(cell)
        if parsed is None:
            continue
        qid = cells.question_id(cell) or by_text.get(parsed.question)
        if qid is not None:
            sub.answers[qid] = parsed  # a later copy of the same question wins
    sub.unchanged = {qid for qid, parsed in sub.answers.items()
                     if not parsed.is_blank and parsed.answer.strip() == template_answers.get(qid)}
