"""What a test cell becomes: its check sites (:class:`Site`), the test ready to run
(:class:`InlineTest`), the names the rewritten programs share with the harness, and a doctest
cell read as Python (its examples' expected output kept on their nodes for the rewriter)."""
from __future__ import annotations

import ast
import doctest
from dataclasses import dataclass

from grader import cells


CHECK, RAISED = "__g2c_check__", "__g2c_raised__"   # what the rewritten programs call (as the harness names them)
PROGRAM = "sealed.program"                          # the program's input name (the harness's INLINE_PROGRAM)
VALUES = "__g2c_values__"                           # the operands' values, in a skeleton
MAX_ARRAYS = 64                                     # the arrays one test may send back (the harness's limit)
KEPT_ARRAYS = tuple(f"a{i}" for i in range(MAX_ARRAYS))
RAISES = "raises"          # ``pytest.raises`` or a ``raises`` imported from it


@dataclass(frozen=True)
class Site:
    """One check of a test cell. ``kind``: ``assert`` (an assert statement's test), ``call``
    (an ``assert_*`` call statement), ``raises`` (a ``pytest.raises`` block), ``doctest`` (an
    example's value against its expected output), ``print`` (a ``print`` example's text) or
    ``doctest_raises`` (an example's expected exception)."""

    index: int
    line: int                       # in the test cell, from 1
    text: str                       # the check as written, for messages
    kind: str
    skeleton: str                   # an expression over VALUES[i] (assert and call kinds)
    operands: tuple[str, ...]       # each operand's source
    tainted: tuple[bool, ...]       # which operands come from the student's run
    message: str = ""               # an assert's own constant message
    want: str = ""                  # doctest: the expected output
    flags: int = 0                  # doctest: its option flags

    @property
    def in_sandbox(self) -> bool:
        """Decided by a truth value the student's process computed: the skeleton compares nothing."""
        if self.kind not in ("assert", "call"):
            return False
        body = ast.parse(self.skeleton, mode="eval").body
        while isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Not):
            body = body.operand
        return isinstance(body, ast.Subscript) and self.tainted[_operand_index(body)]


def _operand_index(node: ast.Subscript) -> int:
    return int(node.slice.value)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class InlineTest:
    """A test cell, ready to run: its item, its check sites and its two programs."""

    cell: cells.TestCell
    sites: tuple[Site, ...]
    master_program: str        # every operand evaluated and recorded
    sandbox_program: str       # tainted operands only; expected values removed
    provided: str              # the grader's copy of the provided definitions, which the test's process runs

    @property
    def name(self) -> str:
        return self.cell.name

    @property
    def case_name(self) -> str:
        return f"inline/{self.name}"

    @property
    def in_sandbox(self) -> bool:
        """Decided in the sandbox: a site is, or there is no site (it passes by not raising)."""
        return not self.sites or any(site.in_sandbox for site in self.sites)

    @property
    def sandbox_reasons(self) -> list[str]:
        """Why the test is decided in the sandbox, and how its author can write it instead."""
        if not self.sites:
            return ["the cell holds no check (an assert, an assert_* call, a pytest.raises block or a doctest "
                    "example), so it passes whenever it runs: assert something about a result"]
        return [f"line {site.line}, `{site.text}`: its truth is computed by the student's code (a bare call, `not` "
                "of one, or an `or`); compare the student's result with a value the test computes instead, "
                "e.g. `assert f(x) == expected`, or split an `or` into the cases it allows"
                for site in self.sites if site.in_sandbox]


class InlineError(ValueError):
    """A test cell the grader cannot use (the assignment is wrong, not a submission)."""


def doctest_examples(text: str) -> str | None:
    """A doctest cell's examples: the cell itself when it starts with ``>>>``, or the one string
    literal it holds (a notebook runs that cell without error)."""
    if text.lstrip().startswith(">>>"):
        return text
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) and ">>>" in body[0].value.value:
        return body[0].value.value
    return None


def _doctest_module(text: str) -> ast.Module:
    """A doctest cell as Python: each example's source, its expected output kept on the node
    (``g2c_want``, ``g2c_exc``, ``g2c_flags``) for the rewriter, its lines counted in the cell."""
    body: list[ast.stmt] = []
    for example in doctest.DocTestParser().get_examples(text):
        tree = ast.parse(example.source)
        flags = 0
        for flag, on in example.options.items():
            flags = flags | flag if on else flags & ~flag
        for statement in tree.body:
            ast.increment_lineno(statement, example.lineno)
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            last.g2c_want, last.g2c_exc, last.g2c_flags = example.want, example.exc_msg, flags  # type: ignore[attr-defined]
        elif example.want or example.exc_msg:
            raise ValueError(f"line {example.lineno + 1}: an example that is a statement expects output; "
                             "only an expression's value (or a print call's text) is compared")
        body.extend(tree.body)
    if not body:
        raise ValueError("a cell that starts with >>> holds no example")
    return ast.Module(body=body, type_ignores=[])
