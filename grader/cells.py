"""How an assignment notebook marks its cells, shared by ``assign``, ``load`` and the tests.

A master notebook labels each code cell with ``metadata.tags``:

``provided``    code the assignment owns; students do not edit it and the grader always
                runs its own copy.
``scaffold``    a cell of code students write; ``metadata.g2c.symbols`` declares what they
                own there: plain functions (``name``) or methods (``Class.method``). An
                assignment has one or more. Everything else in a scaffold cell is the
                grader's (a scaffold class's other members, for instance).
                ``metadata.g2c.package_file`` optionally names the file of the course's
                package that holds the same code (``g2c/<module>/<file>.py``, say),
                which a submission folder may hold instead of, or beside, the notebook cell.
``demo``        with ``provided``: code that runs an experiment on the student's functions
                (its results feed the answer variables). The notebook run executes the
                grader's copy; the module the probe imports leaves it out.
``question``    a written Question/Answer cell; ``metadata.g2c.question`` is its rubric id.
``report``      with ``provided`` and ``demo``: displays the answer variables as JSON
                (``application/json``: ``{"grading_mode": bool, "variables": {name: value}}``).
                The output stored in a submitted notebook is the student's report of the run
                their written answers discuss (see ``read_report``); the grader's own run of
                the cell is not.
``instructor``  present in the master only; ``grader assign`` removes it.
``test``        an inline check: plain Python (asserts, ``np.testing``, ``pytest.raises``, or
                doctest examples) whose outcome is one autograded item, declared by
                ``metadata.g2c.test``: ``name`` and ``points`` (required), ``visibility``
                (default ``visible``: the student notebook keeps the cell; any other value
                removes it), ``title``, ``tags`` and ``message`` (said when it fails). The
                notebook run never executes it; ``grader.checks.inline`` decides it.

Inside code cells, lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` are the
reference answer; ``grader assign`` replaces them by a ``NotImplementedError`` TODO.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache, wraps
from collections.abc import Iterable
from typing import Any, Callable

PROVIDED = "provided"
SCAFFOLD = "scaffold"
DEMO = "demo"
QUESTION = "question"
INSTRUCTOR = "instructor"
REPORT = "report"
TEST = "test"
REPORT_MIME = "application/json"

BEGIN_SOLUTION = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION\b\s*(?P<todo>.*)$")
END_SOLUTION = re.compile(r"^\s*### END SOLUTION\b")


def tags(cell: Any) -> list[str]:
    """The cell's tags (an empty list when the metadata holds none or junk)."""
    found = cell.get("metadata", {}).get("tags", [])
    return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []


@dataclass(frozen=True)
class Scaffold:
    """One scaffold cell of an assignment: its id, the symbols students write in it and the
    package file that may hold them instead (a relative posix path, None when there is none)."""

    cell_id: str
    symbols: tuple[str, ...]
    package_file: str | None = None

    @property
    def owners(self) -> tuple[str, ...]:
        """The top-level names the cell defines: classes of ``Class.method`` symbols, functions."""
        return tuple(dict.fromkeys(symbol.split(".")[0] for symbol in self.symbols))

    def methods(self, owner: str) -> frozenset[str]:
        """The methods of class ``owner`` that students write (empty for a function)."""
        return frozenset(s.split(".", 1)[1] for s in self.symbols if s.startswith(f"{owner}."))

    def definition(self, owner: str) -> str:
        """How the owner is defined in code, for messages: ``class X`` or ``def f``."""
        return f"{'class' if self.methods(owner) else 'def'} {owner}"


def scaffolds(notebook: Any) -> list[Scaffold]:
    """The notebook's scaffold cells with their declared symbols, in order.

    Raises ValueError when a scaffold cell declares none, a symbol is neither ``name`` nor
    ``Class.method``, or its package file is not a relative path inside the submission folder:
    the assignment itself is wrong, not a submission."""
    found = []
    for cell in notebook.get("cells", []):
        if SCAFFOLD not in tags(cell):
            continue
        g2c = cell.get("metadata", {}).get("g2c", {})
        symbols = g2c.get("symbols") if isinstance(g2c, dict) else None
        if (not isinstance(symbols, list) or not symbols
                or not all(isinstance(s, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)?", s) for s in symbols)):
            raise ValueError(f"scaffold cell {cell.get('id')!r} declares no valid metadata.g2c.symbols "
                             "(a list of 'function' or 'Class.method' names)")
        package_file = g2c.get("package_file")
        if package_file is not None and not _inside_folder(package_file):
            raise ValueError(f"scaffold cell {cell.get('id')!r}: metadata.g2c.package_file {package_file!r} is not "
                             "a relative posix path without '..' (like 'g2c/module/file.py')")
        found.append(Scaffold(str(cell.get("id")), tuple(symbols), package_file))
    return found


@dataclass(frozen=True)
class TestCell:
    """An inline check of the master notebook: the item its metadata declares, and its code."""

    cell_id: str
    name: str
    points: float
    visibility: str
    title: str
    tags: tuple[str, ...]
    message: str
    source: str


TEST_KEYS = {"name", "points", "visibility", "title", "tags", "message"}


def test_cells(notebook: Any) -> list[TestCell]:
    """The notebook's ``test`` cells, in order. Raises ValueError naming the cell when its
    metadata is not a valid declaration (the assignment is wrong, not a submission)."""
    found = []
    for cell in notebook.get("cells", []):
        if TEST not in tags(cell):
            continue
        where = f"test cell {cell.get('id')!r}"
        g2c = cell.get("metadata", {}).get("g2c", {})
        declared = g2c.get("test") if isinstance(g2c, dict) else None
        if cell.get("cell_type") != "code" or not isinstance(declared, dict):
            raise ValueError(f"{where}: a test cell is a code cell with metadata.g2c.test "
                             "({name, points, visibility, title, tags, message})")
        unknown = sorted(set(declared) - TEST_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} in metadata.g2c.test; it takes {sorted(TEST_KEYS)}")
        name, points = declared.get("name"), declared.get("points")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w-]{0,79}", name):
            raise ValueError(f"{where}: metadata.g2c.test.name must be an item name (letters, digits, _ and -)")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or not points > 0:
            raise ValueError(f"{where}: metadata.g2c.test.points must be a positive number")
        item_tags = declared.get("tags", [])
        if not isinstance(item_tags, list) or not all(isinstance(t, str) for t in item_tags):
            raise ValueError(f"{where}: metadata.g2c.test.tags must be a list of the rubric's tags")
        text = {key: declared.get(key, default) for key, default in
                (("visibility", "visible"), ("title", name), ("message", ""))}
        if not all(isinstance(value, str) for value in text.values()):
            raise ValueError(f"{where}: metadata.g2c.test's visibility, title and message must be strings")
        found.append(TestCell(str(cell.get("id")), name, float(points), text["visibility"], text["title"],
                              tuple(item_tags), text["message"], source(cell)))
    return found


def _inside_folder(path: object) -> bool:
    """A relative posix path naming a file inside the folder it is read from: no leading '/',
    no '..', '.' or empty parts, no backslashes."""
    return isinstance(path, str) and "\\" not in path and all(p not in ("", ".", "..") for p in path.split("/"))


FIRST_LINE_CHARS = 80


def first_line(code: str) -> str:
    """A cell's first non-blank line, shortened: with its number, how a student finds it."""
    line = next((line.strip() for line in code.splitlines() if line.strip()), "")
    return line if len(line) <= FIRST_LINE_CHARS else line[: FIRST_LINE_CHARS - 3] + "..."


def code_cell_label(number: int, execution_count: int | None = None, first: str = "") -> str:
    """A cell as the student finds it: ``code cell 7 (In[7], `x = f(1)`)``, numbered from 1 among
    the notebook's code cells (markdown cells are not counted), with the traceback's ``In[n]``."""
    details = [f"In[{execution_count}]"] if execution_count is not None else []
    details += [f"`{first}`"] if first else []
    return f"code cell {number}" + (f" ({', '.join(details)})" if details else "")


@dataclass(frozen=True)
class ExecutedCell:
    """A code cell of an executed notebook, as written inside the sandbox: read as data."""

    index: int                      # its position among all the notebook's cells
    number: int                     # its place among the code cells, from 1, as the student counts them
    source: str
    execution_count: int | None     # the traceback's In[n]
    outputs: tuple[dict, ...]       # its outputs that are objects
    cell_id: str


def executed_code_cells(data: bytes | str | None) -> list[ExecutedCell]:
    """The code cells of an executed notebook's JSON text, in order; none when it is not a
    notebook. Every field is checked for its type: the notebook was written by student code."""
    try:
        notebook = json.loads(data or b"{}")
    except (ValueError, RecursionError):
        return []
    listed = notebook.get("cells", []) if isinstance(notebook, dict) else []
    found: list[ExecutedCell] = []
    for index, cell in enumerate(listed if isinstance(listed, list) else []):
        if not (isinstance(cell, dict) and cell.get("cell_type") == "code"):
            continue
        count, outputs = cell.get("execution_count"), cell.get("outputs")
        found.append(ExecutedCell(index, len(found) + 1,
                                  source(cell) if isinstance(cell.get("source", ""), (str, list)) else "",
                                  count if isinstance(count, int) and not isinstance(count, bool) else None,
                                  tuple(o for o in outputs if isinstance(o, dict)) if isinstance(outputs, list) else (),
                                  str(cell.get("id", ""))))
    return found


def assigned_names(code: str, names: Iterable[str]) -> frozenset[str]:
    """Which of ``names`` a code cell assigns (a name bound anywhere in it: ``NAME = ...``, a
    ``for`` target, an import...), read from its syntax tree; none when it does not parse."""
    try:
        tree = parse_python(code)
    except SyntaxError:
        return frozenset()
    return frozenset({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
                      and isinstance(node.ctx, ast.Store)} & set(names))


def question_id(cell: Any) -> str | None:
    g2c = cell.get("metadata", {}).get("g2c", {})
    qid = g2c.get("question") if isinstance(g2c, dict) else None
    return qid if isinstance(qid, str) else None


def source(cell: Any) -> str:
    """A cell's source as one string (nbformat allows a list of lines on disk)."""
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else str(text)


@dataclass(frozen=True)
class WrittenAnswer:
    """One Question/Answer pair read from a notebook."""

    question: str
    answer: str

    @property
    def is_blank(self) -> bool:
        return not self.answer.strip()


_PREFIX_Q = "Question:"
_PREFIX_A = "Answer:"


def parse_python(code: str) -> ast.Module:
    """``ast.parse`` for code a student wrote: whatever the parser raises is a SyntaxError. A
    deeply nested expression makes it raise RecursionError or MemoryError, a null byte
    ValueError; each is that submission's problem, never the grader's."""
    try:
        return ast.parse(code)
    except SyntaxError:
        raise
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SyntaxError(parse_failure(exc)) from None


def parse_failure(exc: BaseException) -> str:
    """A parser's failure on student input that is not a syntax error, in a student's words."""
    if isinstance(exc, (RecursionError, MemoryError)):
        return "it is nested too deeply for the grader to read (simplify the deepest expression)"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def syntax_problem(exc: SyntaxError) -> str:
    """``line N: message`` for a SyntaxError from ``parse_python`` (no line when it has none)."""
    return f"line {exc.lineno}: {exc.msg}" if exc.lineno else str(exc.msg)


# Cells up to this size are parsed once per process: the template's cells and the provided
# ones are the same in every submission of a class (a regrade's load is mostly their parsing).
MEMO_MAX_CHARS = 64 * 1024


def memoized(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` of strings, cached when every string is short (its result must be immutable)."""
    cached = lru_cache(maxsize=2048)(function)

    @wraps(function)
    def call(*texts: str) -> Any:
        return cached(*texts) if all(len(t) <= MEMO_MAX_CHARS for t in texts) else function(*texts)
    return call


def parse_written_answer(cell: Any) -> WrittenAnswer | None:
    """Read a Question/Answer cell: a code cell of two string literals, or a markdown cell.

    Returns None when the cell does not follow either convention.
    """
    return _written_answer(str(cell.get("cell_type")), source(cell))


@memoized
def _written_answer(cell_type: str, text: str) -> WrittenAnswer | None:
    if cell_type == "markdown":
        head, sep, tail = text.partition(_PREFIX_A)
        if not sep or not head.lstrip().startswith(_PREFIX_Q):
            return None
        return WrittenAnswer(head.strip()[len(_PREFIX_Q):].strip(), tail.strip())
    try:
        module = parse_python(text)
    except SyntaxError:
        return None
    literals = [node.value.value for node in module.body
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)]
    question = next((s for s in literals if s.lstrip().startswith(_PREFIX_Q)), None)
    answer = next((s for s in literals if s.lstrip().startswith(_PREFIX_A)), None)
    if question is None or answer is None:
        return None
    return WrittenAnswer(question.strip()[len(_PREFIX_Q):].strip(),
                         answer.strip()[len(_PREFIX_A):].strip())


# A report is student data: only bounded plain JSON is kept (see ``read_report``).
REPORT_MAX_CHARS = 2**20          # a report stored as JSON text
REPORT_MAX_VARIABLES = 64
REPORT_MAX_DEPTH = 8              # levels below each variable
REPORT_MAX_NODES = 50_000         # values in the whole report
REPORT_MAX_STRING = 4000          # characters of one string (a generated sample is about 300)
REPORT_MAX_INT = 2**63


@dataclass(frozen=True)
class Report:
    """The run a student's written answers discuss, as their notebook's report cell stored it."""

    variables: dict[str, Any]       # answer variable -> its value in that run (plain JSON)
    grading_mode: bool | None       # whether that run had G2C_GRADING=1 (None: the report does not say)


def read_report(cell: Any) -> Report | str:
    """The report in a report cell's stored outputs, or why there is none. The outputs are the
    student's to write: the first ``application/json`` output is read (as stored, or as JSON
    text), and it must be ``{"variables": {name: value}}`` whose values are numbers, strings,
    booleans, nulls, lists and objects, within the REPORT_MAX_* bounds."""
    outputs = cell.get("outputs") if isinstance(cell, dict) else None
    found = next((o["data"][REPORT_MIME] for o in outputs or () if isinstance(o, dict)
                  and isinstance(o.get("data"), dict) and REPORT_MIME in o["data"]), None)
    if found is None:
        return ("the report cell has no stored output (the notebook was saved without running it, "
                "or with outputs cleared)")
    if isinstance(found, str):
        if len(found) > REPORT_MAX_CHARS:
            return f"the report cell's output is over {REPORT_MAX_CHARS // 1024} KiB"
        try:
            found = json.loads(found)
        except (ValueError, RecursionError, MemoryError) as exc:
            return f"the report cell's output is not JSON: {parse_failure(exc)}"
    variables = found.get("variables") if isinstance(found, dict) else None
    if not isinstance(variables, dict) or len(variables) > REPORT_MAX_VARIABLES:
        return (f"the report cell's output is not {{\"variables\": {{name: value}}}} with at most "
                f"{REPORT_MAX_VARIABLES} names")
    budget = [REPORT_MAX_NODES]
    for name, value in variables.items():
        # The reasons never quote the student's names: they reach the grader's own words in a request.
        problem = None if re.fullmatch(r"[A-Za-z_]\w{0,99}", str(name)) else "is not a variable name"
        problem = problem or _plain_json(value, REPORT_MAX_DEPTH, budget)
        if problem:
            return f"the report cell's output is refused: one of its variables {problem}"
    mode = found.get("grading_mode")
    return Report(dict(variables), mode if isinstance(mode, bool) else None)


def _plain_json(value: Any, depth: int, budget: list[int]) -> str | None:
    """Why ``value`` is not bounded plain JSON (None when it is); ``budget`` counts values left.
    Iterative, so no nesting reaches Python's recursion limit."""
    stack = [(value, depth)]
    while stack:
        value, depth = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            return f"makes the report larger than {REPORT_MAX_NODES} values"
        if depth < 0:
            return f"is nested deeper than {REPORT_MAX_DEPTH} levels"
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int):
            if abs(value) > REPORT_MAX_INT:
                return "holds an integer out of range"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return "holds a number that is not finite"
        elif isinstance(value, str):
            if len(value) > REPORT_MAX_STRING:
                return f"holds a string over {REPORT_MAX_STRING} characters"
        elif isinstance(value, (list, dict)):
            if len(value) > budget[0]:
                return f"makes the report larger than {REPORT_MAX_NODES} values"
            if isinstance(value, dict) and any(not isinstance(key, str) or len(key) > 200 for key in value):
                return "holds a key that is not a short string"
            stack.extend((item, depth - 1) for item in (value.values() if isinstance(value, dict) else value))
        else:
            return f"holds a {type(value).__name__}, which is not JSON"
    return None
