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
``instructor``  present in the master only; ``grader assign`` removes it.

Inside code cells, lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` are the
reference answer; ``grader assign`` replaces them by a ``NotImplementedError`` TODO.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

PROVIDED = "provided"
SCAFFOLD = "scaffold"
DEMO = "demo"
QUESTION = "question"
INSTRUCTOR = "instructor"

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


def _inside_folder(path: object) -> bool:
    """A relative posix path naming a file inside the folder it is read from: no leading '/',
    no '..', '.' or empty parts, no backslashes."""
    return isinstance(path, str) and "\\" not in path and all(p not in ("", ".", "..") for p in path.split("/"))


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


def parse_written_answer(cell: Any) -> WrittenAnswer | None:
    """Read a Question/Answer cell: a code cell of two string literals, or a markdown cell.

    Returns None when the cell does not follow either convention.
    """
    text = source(cell)
    if cell.get("cell_type") == "markdown":
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
