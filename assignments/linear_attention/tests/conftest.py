"""Load your code from the assignment notebook so the public tests can call it.

The tests see the code cells of the notebook tagged ``provided`` or ``scaffold`` (the model
code: ``feature_map``, ``LinearAttention``, ``HybridBlock``, ``HybridTransformerLM``, ...),
run in notebook order inside a fresh module. Exercise cells (training runs, benchmarks,
written answers) are not run, nor are provided cells tagged ``demo`` (those run an exercise,
such as Exercise 1's sweep), so the tests stay fast.

Which notebook:
    by default ``../linear_attention.ipynb`` (the notebook next to this ``tests`` folder);
    set the environment variable ``LA_NOTEBOOK`` to test another one, for example
    ``LA_NOTEBOOK=~/copy.ipynb pytest tests/``.

Only the standard library's ``json`` reads the notebook; nbformat is not needed. Save the
notebook (Ctrl-S) before running the tests: they read the file, not your live kernel.
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import traceback
import types
from pathlib import Path
from typing import NamedTuple

import pytest

NOTEBOOK_ENV = "LA_NOTEBOOK"
DEFAULT_NOTEBOOK = Path(__file__).resolve().parent.parent / "linear_attention.ipynb"
LOADED_TAGS = ("provided", "scaffold")
SKIPPED_TAGS = ("demo",)   # provided cells that run an exercise rather than define code
DEFAULT_MODULE_NAME = "la_notebook"


class NotebookLoadError(Exception):
    """The notebook could not be read, or its provided/scaffold cells could not be run."""


class CodeCell(NamedTuple):
    """One loaded code cell: its position in the notebook and where it sits in the module."""

    index: int          # position among all cells of the notebook (0-based)
    cell_id: str        # the cell's nbformat id ("" for old notebooks without ids)
    tags: tuple         # the cell's tags
    source: str
    first_line: int     # line of the module source where this cell's code starts (1-based)

    def describe(self) -> str:
        label = "/".join(t for t in self.tags if t in LOADED_TAGS)
        ident = f", id {self.cell_id}" if self.cell_id else ""
        return f"cell {self.index} ({label}{ident})"


def notebook_path() -> Path:
    """The notebook under test: ``$LA_NOTEBOOK`` if set, else the assignment notebook."""
    env = os.environ.get(NOTEBOOK_ENV, "").strip()
    return Path(env).expanduser().resolve() if env else DEFAULT_NOTEBOOK


def _tags(cell: dict) -> tuple:
    found = cell.get("metadata", {}).get("tags", []) if isinstance(cell.get("metadata"), dict) else []
    return tuple(t for t in found if isinstance(t, str)) if isinstance(found, list) else ()


def _text(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else str(text)


def _without_magics(code: str) -> str:
    """Comment out top-level IPython magics and shell escapes (``%...``, ``!...``)."""
    lines = code.split("\n")
    return "\n".join("# (skipped outside Jupyter) " + line if line[:1] in ("%", "!") else line
                     for line in lines)


def read_notebook(path: Path) -> dict:
    """The notebook as a dict, or a NotebookLoadError saying what is wrong with the file."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotebookLoadError(
            f"notebook not found: {path}\n(by default the tests read linear_attention.ipynb next "
            f"to the tests folder; set {NOTEBOOK_ENV} to test another notebook)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NotebookLoadError(f"cannot read the notebook {path}: {exc}") from None
    try:
        notebook = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NotebookLoadError(
            f"{path} is not valid notebook JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            f"was it saved completely?") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise NotebookLoadError(f"{path} is not a version-4 Jupyter notebook: it has no list of cells")
    return notebook


def _header(index: int, tags: tuple) -> str:
    return f"# ---- notebook cell {index} ({'/'.join(tags)}) ----\n"


def code_cells(notebook: dict) -> list[CodeCell]:
    """The notebook's provided/scaffold code cells, in order, with their module line offsets."""
    found: list[CodeCell] = []
    line = 1
    for index, cell in enumerate(notebook["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        tags = _tags(cell)
        if not any(tag in LOADED_TAGS for tag in tags) or any(tag in SKIPPED_TAGS for tag in tags):
            continue
        source = _without_magics(_text(cell))
        if not source.endswith("\n"):
            source += "\n"
        line += _header(index, tags).count("\n")
        found.append(CodeCell(index, str(cell.get("id", "")), tags, source, line))
        line += source.count("\n") + 1  # the cell, then a blank separator line
    return found


def module_source(cells: list[CodeCell]) -> str:
    """The loaded cells concatenated in order, each after a header comment naming it."""
    return "".join(_header(cell.index, cell.tags) + cell.source + "\n" for cell in cells)


def _cell_at(cells: list[CodeCell], lineno: int | None) -> str:
    """'cell 6 (scaffold), line 12' for a line number of the module source."""
    if lineno is None:
        return "an unknown line"
    for cell in reversed(cells):
        if lineno >= cell.first_line:
            return f"{cell.describe()}, line {lineno - cell.first_line + 1} of that cell"
    return f"line {lineno}"


def load_notebook(path: Path | str | None = None, module_name: str = DEFAULT_MODULE_NAME) -> types.ModuleType:
    """Run the notebook's provided and scaffold code cells in a fresh module and return it.

    The concatenated source is registered with ``linecache`` under a descriptive file name, so
    a traceback through your code shows the offending line. Raises NotebookLoadError with a
    readable message when the notebook cannot be read or its cells fail to run.
    """
    path = Path(path) if path is not None else notebook_path()
    cells = code_cells(read_notebook(path))
    if not cells:
        raise NotebookLoadError(
            f"{path} has no code cell tagged 'provided' or 'scaffold'; is it the assignment "
            f"notebook? (cell tags are in each cell's metadata)")
    source = module_source(cells)
    filename = f"{path.name} [provided+scaffold cells]"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)

    module = types.ModuleType(module_name, f"Code cells of {path}")
    module.__file__ = filename
    module.__notebook__ = str(path)
    module.__source__ = source
    sys.modules[module_name] = module  # classes defined below get a resolvable __module__
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise NotebookLoadError(
            f"syntax error in {path.name}, {_cell_at(cells, exc.lineno)}: {exc.msg}\n"
            f"    {(exc.text or '').rstrip()}") from None
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        where = _cell_at(cells, frames[-1].lineno) if frames else "an unknown cell"
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        raise NotebookLoadError(
            f"running the provided/scaffold cells of {path.name} failed in {where}:\n{detail}") from None

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the provided/scaffold cells of {path.name} define no {name!r}; did a cell lose its "
            f"tag, or was the name changed?")

    module.__dict__.setdefault("__getattr__", missing)
    return module


@pytest.fixture(scope="session")
def la() -> types.ModuleType:
    """The notebook's code as a module: ``la.LinearAttention``, ``la.feature_map``, ``la.EPS``, ..."""
    try:
        return load_notebook(notebook_path())
    except NotebookLoadError as exc:
        problem = str(exc)
    pytest.fail(f"could not load the notebook's code:\n{problem}", pytrace=False)
