"""The master's test cells read: each parsed (doctest cells too), its taint followed, its check
sites rewritten into the master's program and the sandbox's sliced one (:func:`inline_tests`),
and one probe case per test (:func:`probe_cases`)."""
from __future__ import annotations

import ast
import copy

import nbformat
import numpy as np

from grader import cells
from grader.graft import provided_definitions, provided_imports
from grader.probe import ProbeCase
from grader.checks.inline.rewrite import _Rewriter
from grader.checks.inline.sites import (KEPT_ARRAYS, PROGRAM, InlineError, InlineTest, _doctest_module,
                                       doctest_examples)
from grader.checks.inline.slicing import _sliced, _without_pytest
from grader.checks.inline.taint import _Taint, _binds, _functions_handed_over, _scope_nodes


def inline_tests(master: nbformat.NotebookNode) -> list[InlineTest]:
    """Every ``test`` cell of ``master``, parsed and rewritten. Raises InlineError naming the
    cell when one cannot be used."""
    known = set(provided_imports([cells.source(c) for c in master.cells if c.cell_type == "code"
                                   and cells.PROVIDED in cells.tags(c)]))
    try:
        found = cells.test_cells(master)
    except ValueError as exc:
        raise InlineError(str(exc)) from None
    provided = provided_definitions(master) if found else ""
    return [_read_test(cell, known, provided) for cell in found]


def _read_test(cell: cells.TestCell, imported: set[str], provided: str) -> InlineTest:
    """One test cell, parsed and rewritten; ``provided``: the provided definitions the test's
    process runs as its own copy."""
    where = f"test cell {cell.cell_id!r} ({cell.name})"
    text = cell.source
    examples = doctest_examples(text)
    try:
        tree = _doctest_module(examples) if examples else ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        raise InlineError(f"{where}: {exc}") from None
    master_tree, sandbox_tree = copy.deepcopy(tree), copy.deepcopy(tree)
    sandbox_taint = _Taint(sandbox_tree, imported)
    own = {name for node in ast.parse(provided).body for part in _scope_nodes(node) for name in _binds(part)}
    crossing = _functions_handed_over(sandbox_tree, sandbox_taint, own)
    if crossing:
        raise InlineError(f"{where}: {crossing}")
    rewriter = _Rewriter(_Taint(master_tree, imported), text)
    try:
        master_tree = rewriter.rewrite(master_tree, sandbox=False)
        sandbox_tree = _Rewriter(sandbox_taint, text).rewrite(sandbox_tree, sandbox=True)
    except InlineError as exc:
        raise InlineError(f"{where}: {exc}") from None
    return InlineTest(cell, tuple(rewriter.sites), ast.unparse(_without_pytest(master_tree)),
                      ast.unparse(_without_pytest(_sliced(sandbox_tree, sandbox_taint))), provided)


def probe_cases(tests: list[InlineTest]) -> list[ProbeCase]:
    """One case per test, each in a worker of its own (a fresh import of the student's module):
    nothing one test's run does reaches another's. The program is a sealed input, never part of
    the plan every worker inherits: only the test's own process reads it, after the student's
    process is forked (``probe_harness.case_inline``)."""
    return [ProbeCase(test.case_name, "inline", {"provided": test.provided},
                      {PROGRAM: np.frombuffer(test.sandbox_program.encode(), dtype=np.uint8)}, KEPT_ARRAYS,
                      group=test.case_name) for test in tests]
