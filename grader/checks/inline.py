"""Inline checks: the master notebook's ``test`` cells, decided outside the student's process.

An instructor writes a test cell as plain Python (``cells.TEST`` says how it is declared), the
way otter-grader's or nbgrader's tests are written: ``assert`` of a comparison or of a call
(``np.isclose``, ``np.allclose``, ``math.isclose``, ``torch.allclose`` ...), ``assert cond,
"message"``, ``np.testing.assert_*`` and ``torch.testing.assert_close`` calls, ``with
pytest.raises(E, match=...)`` blocks, or doctest examples (a cell that starts with ``>>>``, or
holds one string literal of them),
with loops and helper definitions around them. Those tools would run the test in the
student's process, where student code can redefine ``np.isclose``, return an object whose
``__eq__`` is always true or whose ``repr`` prints the expected text, silence the traceback or
raise to skip the rest. Here the cell is split instead:

- **Operands.** Each check site's expression is cut into *operands*: the parts that depend on
  the student's code (a name the notebook defines, other than an import of its provided cells,
  or a name the test binds from one: ``tainted``, ``_Taint``) and the parts that do not (the expected values, the
  comparison functions). The comparison itself (the operators, the call of ``np.allclose``)
  is the *skeleton* that joins them.
- **Two runs.** The probe runs the cell with every check site rewritten to send its tainted
  operands back *as data* (numbers, strings, arrays, tensors, containers of them, by exact
  type, never pickle; ``probe_harness.case_inline``): in a process of the grader's that runs
  no student code, while the student's module lives in a second process that answers the
  test's calls with data or handles, so no value of the test (its tables, a helper's
  parameters, its loop variables, the recording functions) is reachable from student code.
  The statements that compute only expected values are removed from that program as well.
  The grader runs the whole cell, once per process, against the master's own module
  (``master_run``) and keeps every operand's value.
- **Layout.** An array the student's code gives a comparison function (``np.allclose``,
  ``torch.testing.assert_close``...) must have the shape and dtype of the master's array in
  its place: those functions broadcast and cast.
- **Verdict.** For each time a site ran, the skeleton is evaluated here on the student's
  data and the master's expected values. The test passes when the student's run finished,
  every site ran as many times as in the master's run and every evaluation holds.

A site whose comparison is itself student code (``assert is_sorted(out)`` with the student's
``is_sorted``, an ``or``, a cell with no check site at all) is decided from what the student's
process computed: such tests are *in the sandbox*. A failure there fails the test; a pass is an
``error`` item a TA confirms (never points by itself), and ``grader validate`` names each such
cell with the line, why, and the author's fix (``InlineTest.sandbox_reasons``).
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import doctest
import io
import random
import re
import traceback
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Iterator

import nbformat
import numpy as np

from grader import cells
from grader.checks import CheckContext, Verdict, decide
from grader.checks.compare import compare, describe
from grader.graft import provided_definitions, provided_imports, submission_module_source
from grader.probe import ProbeCase

CHECK, RAISED = "__g2c_check__", "__g2c_raised__"   # what the rewritten programs call (as the harness names them)
PROGRAM = "sealed.program"                          # the program's input name (the harness's INLINE_PROGRAM)
VALUES = "__g2c_values__"                           # the operands' values, in a skeleton
MAX_ARRAYS = 64                                     # the arrays one test may send back (the harness's limit)
KEPT_ARRAYS = tuple(f"a{i}" for i in range(MAX_ARRAYS))
SANDBOX_NOTE = ("decided inside your code's process: this test's form cannot be compared outside it, "
                "so its result is what your code's process computed")
SANDBOX_PASS = ("{checks} passed inside your code's process, which cannot decide this test alone (its form "
                "cannot be compared outside it): a TA confirms it before it earns points")
RAISES = "raises"          # ``pytest.raises`` or a ``raises`` imported from it
SEED = 0                   # the global generators' seed before a test runs, in both runs


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


# ----------------------------------------------------------------------------- reading a cell

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


# ----------------------------------------------------------------------------- which names are the student's

def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _scope_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """``root`` and the nodes below it in the same scope: of a nested function or class, its
    defaults, decorators and bases are, its body is not."""
    yield root
    if isinstance(root, FUNCTIONS):
        children = [*root.args.defaults, *[d for d in root.args.kw_defaults if d],
                    *getattr(root, "decorator_list", [])]
    elif isinstance(root, ast.ClassDef):
        children = [*root.bases, *(k.value for k in root.keywords), *root.decorator_list]
    else:
        children = list(ast.iter_child_nodes(root))
    for child in children:
        yield from _scope_nodes(child)


def _body(scope: ast.AST) -> list[ast.AST]:
    """What runs in a scope: the module's or a function's statements, a lambda's expression."""
    body = scope.body  # type: ignore[attr-defined]
    return body if isinstance(body, list) else [body]


def _binds(node: ast.AST) -> set[str]:
    """The names ``node`` itself binds in its scope."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return {node.id}
    if isinstance(node, DEFINITIONS):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.ExceptHandler) and node.name:
        return {node.name}
    return set()


def _parameters(function: ast.AST) -> set[str]:
    arguments = function.args  # type: ignore[attr-defined]
    return {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                            *([arguments.vararg] if arguments.vararg else []),
                            *([arguments.kwarg] if arguments.kwarg else [])]}


class _Taint:
    """Which names of a test cell may hold values from the student's code.

    Tainted at the start: every name the cell loads without binding it, other than the
    provided cells' imports and the builtins (a scaffold's function, a provided helper the
    student's code may have changed), every function's parameters (a helper may be called
    with the student's values) and every caught exception.

    The cell's top level is followed statement by statement (``_flow``): a statement that reads
    a tainted name taints what it binds, the names it passes to the student's code and the
    objects it stores tainted values into (``out = f(x)``, ``found.append(out)``); one that
    reads none rebinds its names untainted (``expected = reference(x)`` stays the grader's,
    even when ``x`` later goes to the student's code). Branches join, loops run to a fixed
    point. Inside a function, a name is tainted wherever any statement taints it (scope by
    scope), and a definition whose body reads a tainted outer name is tainted. Erring towards
    tainted is safe: a tainted expected value is computed beside the student's code, never
    taken from it unchecked."""

    def __init__(self, tree: ast.Module, imported: set[str]):
        self.tree = tree
        self.scope_of: dict[int, ast.AST] = {}       # id(node) -> the scope (a function, or the tree) it is in
        self.parent: dict[int, ast.AST] = {}         # id(function) -> its enclosing scope
        self.locals: dict[int, set[str]] = {}        # id(scope) -> the names bound in it
        self.scopes: list[ast.AST] = []
        self._map(tree, tree.body)
        self.imports = {name for part in _scope_nodes(tree) if isinstance(part, (ast.Import, ast.ImportFrom))
                        for name in _binds(part)}   # never handed to the student's code: modules
        self.tainted: dict[int, set[str]] = {id(scope): set() for scope in self.scopes}
        self.state_at: dict[int, frozenset[str]] = {}   # id(top-level node) -> the tainted names there
        safe = imported | set(dir(builtins))
        for node in ast.walk(tree):
            scope = self.scope_of.get(id(node))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and scope is not None:
                if self._owner(node.id, scope) is tree and node.id not in self.locals[id(tree)] | safe:
                    self.tainted[id(tree)].add(node.id)
            elif isinstance(node, FUNCTIONS):
                self.tainted[id(node)] |= _parameters(node)
            elif isinstance(node, ast.ExceptHandler) and node.name and scope is not None:
                self.tainted[id(scope)].add(node.name)
        self.start = frozenset(self.tainted[id(tree)])
        while True:   # the functions read the top level's names, and the top level calls the functions
            before = {key: set(names) for key, names in self.tainted.items()}
            self._spread()
            self.states: list[frozenset[str]] = []
            self.states.append(self._flow(tree.body, self.start))
            self.tainted[id(tree)] |= set().union(*self.states)
            if before == self.tainted:
                break

    def _map(self, scope: ast.AST, roots: list[ast.AST]) -> None:
        """Record the scope of every node of ``roots`` (in ``scope``), and the names it binds."""
        if id(scope) not in self.locals:
            self.scopes.append(scope)
        bound = self.locals.setdefault(id(scope), set())
        declared: set[str] = set()
        for node in (n for root in roots for n in _scope_nodes(root)):
            self.scope_of[id(node)] = scope
            bound |= _binds(node)
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                declared.update(node.names)
            if isinstance(node, FUNCTIONS):
                self.parent[id(node)] = scope
                self.locals[id(node)] = _parameters(node)
                self.scopes.append(node)
                self._map(node, _body(node))
            elif isinstance(node, ast.ClassDef):   # a class body's names: read as its scope's (an approximation)
                self._map(scope, node.body)
        bound -= declared

    def _owner(self, name: str, scope: ast.AST) -> ast.AST:
        """The scope a name loaded in ``scope`` resolves to."""
        while scope is not self.tree:
            if name in self.locals[id(scope)]:
                return scope
            scope = self.parent[id(scope)]
        return self.tree

    def _name_tainted(self, node: ast.Name, state: frozenset[str] | None = None) -> bool:
        scope = self.scope_of.get(id(node))
        if scope is None:   # a name the rewriter made
            return False
        owner = self._owner(node.id, scope)
        if owner is self.tree:
            found = state if state is not None else self.state_at.get(id(node))
            return node.id in (found if found is not None else self.tainted[id(self.tree)])
        return node.id in self.tainted[id(owner)]

    def node(self, node: ast.AST, state: frozenset[str] | None = None) -> bool:
        """Whether ``node`` reads a tainted name (where it is in the cell, or under ``state``)."""
        return any(self._name_tainted(n, state) for n in ast.walk(node)
                   if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))

    def module_names(self) -> set[str]:
        """The names of the top level tainted anywhere in it."""
        return self.tainted[id(self.tree)]

    # -- inside functions: scope by scope

    def _spread(self) -> None:
        changed = True
        while changed:
            changed = False
            for scope in self.scopes[1:]:
                for node in (n for root in _body(scope) for n in ast.walk(root)):
                    if self.scope_of.get(id(node)) is not scope:
                        continue
                    names = self._taints(node, scope)
                    mine = self.tainted[id(scope)]
                    if names and not names <= mine:
                        mine |= names
                        changed = True

    def _taints(self, node: ast.AST, scope: ast.AST) -> set[str]:
        """The names of ``scope`` that ``node`` (a statement or header of it) taints."""
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return self._bound_names(node.target, scope) if self.node(node.iter) else set()
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return set().union(*(self._bound_names(i.optional_vars, scope) for i in node.items
                                 if i.optional_vars is not None and self.node(i.context_expr)))
        if isinstance(node, DEFINITIONS):
            return {node.name} if self._definition_tainted(node) else set()
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.If, ast.While, ast.Try)) and self.node(node):
            return self._bound_names(node, scope) | self._handed(node, scope)
        return set()

    def _definition_tainted(self, definition: ast.AST) -> bool:
        return any(self._name_tainted(n) for n in ast.walk(definition) if isinstance(n, ast.Name)
                   and isinstance(n.ctx, ast.Load) and not self._inside(n, definition))

    def _bound_names(self, node: ast.AST, scope: ast.AST) -> set[str]:
        return {name for n in _scope_nodes(node) for name in _binds(n) if name in self.locals[id(scope)]}

    def _handed(self, node: ast.AST, scope: ast.AST, state: frozenset[str] | None = None) -> set[str]:
        """Names of ``scope`` that ``node`` hands to the student's code or fills with its values:
        the arguments of a tainted call, the object a tainted value is passed to a method of or
        stored into (``found.append(out)``, ``table[k] = out``); never a module."""
        names: set[str] = set()
        for part in _scope_nodes(node):
            if isinstance(part, ast.Call):
                if self.node(part.func, state):
                    names |= _loads(ast.Tuple(elts=[*part.args, *(k.value for k in part.keywords)], ctx=ast.Load()))
                elif isinstance(part.func, ast.Attribute) and \
                        any(self.node(a, state) for a in [*part.args, *(k.value for k in part.keywords)]):
                    names |= _loads(part.func.value)
            elif isinstance(part, (ast.Subscript, ast.Attribute)) and isinstance(part.ctx, ast.Store):
                names |= _loads(part.value)
        return {name for name in names if name in self.locals[id(scope)] - self.imports}

    def _inside(self, name: ast.Name, definition: ast.AST) -> bool:
        """Whether ``name`` resolves to ``definition``'s own scope or one nested in it."""
        scope = self.scope_of.get(id(name))
        if scope is None:
            return False
        owner = self._owner(name.id, scope)
        while owner is not self.tree:
            if owner is definition:
                return True
            owner = self.parent[id(owner)]
        return False

    # -- the top level: statement by statement

    def _mark(self, node: ast.AST, state: frozenset[str]) -> bool:
        """Record ``state`` for ``node``'s parts; whether ``node`` reads a tainted name there."""
        for part in _scope_nodes(node):
            self.state_at[id(part)] = state
        return self.node(node, state)

    def _flow(self, block: list[ast.stmt], state: frozenset[str]) -> frozenset[str]:
        for statement in block:
            state = self._statement(statement, state)
            self.states.append(state)
        return state

    def _assign(self, target: ast.AST, tainted: bool, state: frozenset[str]) -> frozenset[str]:
        names = self._bound_names(target, self.tree)
        self._mark(target, state)
        return state | names if tainted else state - names

    def _loop(self, body: list[ast.stmt], entry: Callable[[frozenset[str]], frozenset[str]],
              state: frozenset[str]) -> frozenset[str]:
        """The state after a loop that may run its body any number of times."""
        seen = state
        for _ in range(20):
            after = self._flow(body, entry(seen))
            if after <= seen:
                break
            seen = seen | after
        return seen

    def _statement(self, node: ast.stmt, state: frozenset[str]) -> frozenset[str]:
        tree = self.tree
        if isinstance(node, (ast.For, ast.AsyncFor)):
            tainted = self._mark(node.iter, state)
            out = self._loop(node.body, lambda s: self._assign(node.target, tainted or self.node(node.iter, s), s),
                             state)
            return self._flow(node.orelse, out) | out
        if isinstance(node, ast.While):
            out = self._loop(node.body, lambda s: s if self._mark(node.test, s) or True else s, state)
            return self._flow(node.orelse, out) | out
        if isinstance(node, ast.If):
            self._mark(node.test, state)
            return self._flow(node.body, state) | self._flow(node.orelse, state)
        if isinstance(node, ast.Try):
            body = self._flow(node.body, state)
            out = body | self._flow(node.orelse, body)
            for handler in node.handlers:
                if handler.type is not None:
                    self._mark(handler.type, state)
                caught = frozenset({handler.name}) if handler.name else frozenset()
                out |= self._flow(handler.body, state | body | caught)
            return self._flow(node.finalbody, out) if node.finalbody else out
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                tainted = self._mark(item.context_expr, state)
                if item.optional_vars is not None:
                    state = self._assign(item.optional_vars, tainted, state)
            return self._flow(node.body, state)
        if isinstance(node, DEFINITIONS):
            self._mark(node, state)
            return state | {node.name} if self._definition_tainted(node) else state - {node.name}
        if self._mark(node, state):
            return state | self._bound_names(node, tree) | self._handed(node, tree, state)
        return state - {name for target in _targets(node) for name in _binds(target)} | self._handed(node, tree, state)


def _functions_handed_over(tree: ast.Module, taint: _Taint, own: set[str]) -> str | None:
    """Why the test cannot run apart from the student's code: it hands the student's code a
    function it defines itself (a lambda, a ``def`` of the cell), which cannot cross to the
    student's process (``probe_harness.case_inline``); None when it hands over none. A call of
    a name in ``own`` (the provided definitions, which the test's process runs) stays there."""
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and taint.node(n.func)
             and not (isinstance(n.func, ast.Name) and n.func.id in own))
    for call in calls:
        for argument in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(argument, ast.Lambda) or (isinstance(argument, ast.Name) and argument.id in defined):
                shown = "a lambda" if isinstance(argument, ast.Lambda) else f"`{argument.id}`"
                return (f"line {call.lineno} passes {shown}, a function the test defines, to the student's code, "
                        "which runs in a process of its own: define that function in a provided cell instead")
    return None


def _targets(node: ast.stmt) -> list[ast.AST]:
    """The plain names a statement rebinds as a whole (``x = ...``, ``import x``), not the
    objects it changes in place."""
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return [node.target]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [node]
    return []


# ----------------------------------------------------------------------------- rewriting the check sites

def _is_raises(item: ast.withitem) -> bool:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == RAISES) or (isinstance(func, ast.Name) and func.id == RAISES)


def _assert_call(node: ast.stmt, taint: _Taint) -> bool:
    """``np.testing.assert_allclose(...)``, ``torch.testing.assert_close(...)``: a statement
    calling an ``assert*`` function that is not the student's."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name.startswith("assert") and not taint.node(func)


class _Rewriter:
    """Rewrites one copy of a test cell's tree: each check site becomes a call of CHECK (or a
    try block calling RAISED) with its operands; ``sandbox`` leaves out the untainted ones."""

    def __init__(self, taint: _Taint, text: str):
        self.taint, self.text = taint, text
        self.sites: list[Site] = []
        self.sandbox = False

    def rewrite(self, tree: ast.Module, sandbox: bool) -> ast.Module:
        self.sandbox, self.sites = sandbox, []
        tree.body = self._block(tree.body)
        return ast.fix_missing_locations(tree)

    def _tainted(self, node: ast.AST) -> bool:
        return self.taint.node(node)

    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            out.extend(self._statement(node))
        return out or [ast.Pass()]

    def _statement(self, node: ast.stmt) -> list[ast.stmt]:
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list) and not isinstance(node, (ast.With, ast.AsyncWith)):
                setattr(node, field, self._block(getattr(node, field)) if getattr(node, field) else [])
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                handler.body = self._block(handler.body)
        if isinstance(node, ast.Assert):
            message = node.msg.value if isinstance(node.msg, ast.Constant) and isinstance(node.msg.value, str) else ""
            return [self._site(node, "assert", node.test, message)]
        if _assert_call(node, self.taint):
            return [self._site(node, "call", node.value, "")]  # type: ignore[attr-defined]
        if isinstance(node, ast.Expr) and hasattr(node, "g2c_want"):
            return [self._example(node)]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self._with(node)
        return [node]

    def _with(self, node: ast.With | ast.AsyncWith) -> list[ast.stmt]:
        node.body = self._block(node.body)
        raises = [item for item in node.items if _is_raises(item)]
        if not raises:
            return [node]
        if len(node.items) != 1 or raises[0].optional_vars is not None:
            raise InlineError(f"line {node.lineno}: a pytest.raises block is supported alone and without `as` "
                              "(check the message with match=)")
        call = raises[0].context_expr
        assert isinstance(call, ast.Call)
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(self._tainted(a) for a in arguments) or any(k.arg not in ("match", None) for k in call.keywords):
            raise InlineError(f"line {node.lineno}: pytest.raises takes the expected exception and match= here, "
                              "neither computed from the student's code")
        expected = call.args[0] if call.args else None
        match = next((k.value for k in call.keywords if k.arg == "match"), ast.Constant(None))
        if expected is None:
            raise InlineError(f"line {node.lineno}: pytest.raises needs the expected exception")
        return [self._raising(node, node.body, [expected, match], "raises", "")]

    def _raising(self, at: ast.AST, body: list[ast.stmt], operands: list[ast.expr], kind: str, want: str,
                 flags: int = 0) -> ast.stmt:
        """``try: body / except BaseException as e: RAISED(k, e, ops) / else: RAISED(k, None, ops)``."""
        index = len(self.sites)
        self.sites.append(Site(index, at.lineno, self._text(at), kind, "", tuple(map(ast.unparse, operands)),
                               (False,) * len(operands), want=want, flags=flags))
        values = [] if self.sandbox else [ast.Tuple(elts=operands, ctx=ast.Load())]
        caught = "__g2c_exception__"

        def record(exception: ast.expr) -> ast.stmt:
            return ast.Expr(ast.Call(ast.Name(RAISED, ast.Load()), [ast.Constant(index), exception, *values], []))
        return ast.Try(body=body, handlers=[ast.ExceptHandler(ast.Name("BaseException", ast.Load()), caught,
                                                              [record(ast.Name(caught, ast.Load()))])],
                       orelse=[record(ast.Constant(None))], finalbody=[])

    def _example(self, node: ast.Expr) -> ast.stmt:
        """A doctest example whose last statement is an expression."""
        want, exc, flags = node.g2c_want, node.g2c_exc, node.g2c_flags  # type: ignore[attr-defined]
        value = node.value
        if exc is not None:
            return self._raising(node, [ast.Expr(value)], [], "doctest_raises", exc, flags)
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print"
                and not self._tainted(value.func)):
            if any(isinstance(a, ast.Starred) for a in value.args) or \
                    any(k.arg not in ("sep", "end") or self._tainted(k.value) for k in value.keywords):
                raise InlineError(f"line {node.lineno}: a print example takes plain arguments and constant sep=/end=")
            operands = [*value.args, *(k.value for k in value.keywords)]
            names = [None] * len(value.args) + [k.arg for k in value.keywords]
            skeleton = repr(names)   # which operand is which: positional (None), sep or end
            return self._record(node, "print", operands, skeleton, "", want, flags)
        return self._record(node, "doctest", [value], "", "", want, flags)

    def _site(self, node: ast.stmt, kind: str, expression: ast.expr, message: str) -> ast.stmt:
        operands: list[ast.expr] = []
        skeleton = self._decompose(expression, operands)
        return self._record(node, kind, operands, ast.unparse(skeleton), message, "", 0)

    def _record(self, node: ast.stmt, kind: str, operands: list[ast.expr], skeleton: str, message: str,
                want: str, flags: int) -> ast.stmt:
        index = len(self.sites)
        tainted = tuple(self._tainted(o) for o in operands)
        self.sites.append(Site(index, node.lineno, self._text(node), kind, skeleton,
                               tuple(ast.unparse(o) for o in operands), tainted, message, want, flags))
        sent = [o for o, t in zip(operands, tainted) if t] if self.sandbox else operands
        call = ast.Call(ast.Name(CHECK, ast.Load()), [ast.Constant(index), ast.Tuple(elts=sent, ctx=ast.Load())], [])
        return ast.copy_location(ast.Expr(call), node)

    def _decompose(self, node: ast.expr, operands: list[ast.expr]) -> ast.expr:
        """The skeleton of ``node``: its comparisons, arithmetic, ``not``, ``and`` and calls of
        functions that are not the student's, over operands; ``operands`` gets each operand."""
        def operand(part: ast.expr) -> ast.expr:
            operands.append(part)
            return ast.Subscript(ast.Name(VALUES, ast.Load()), ast.Constant(len(operands) - 1), ast.Load())
        if not self._tainted(node):
            return operand(node)
        if isinstance(node, ast.Compare):
            return ast.Compare(self._decompose(node.left, operands), node.ops,
                               [self._decompose(c, operands) for c in node.comparators])
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            return ast.BoolOp(node.op, [self._decompose(v, operands) for v in node.values])
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(node.op, self._decompose(node.operand, operands))
        if isinstance(node, ast.BinOp):
            return ast.BinOp(self._decompose(node.left, operands), node.op, self._decompose(node.right, operands))
        if (isinstance(node, ast.Call) and not self._tainted(node.func)
                and not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords)):
            func = operand(node.func)
            return ast.Call(func, [self._decompose(a, operands) for a in node.args],
                            [ast.keyword(k.arg, self._decompose(k.value, operands)) for k in node.keywords])
        return operand(node)

    def _text(self, node: ast.AST) -> str:
        found = ast.get_source_segment(self.text, node) if not hasattr(node, "g2c_want") else None
        return " ".join((found or ast.unparse(node)).split())[:300]


def _sliced(tree: ast.Module, taint: _Taint) -> ast.Module:
    """The sandbox's program: without the top-level statements that compute only what the
    student's code never needs (the expected values, the helpers that compute them), to a
    fixed point of the names the remaining statements load. A definition kept is kept whole."""
    needed: set[str] = set()
    while True:
        kept = _keep(tree, taint, needed)
        grown = needed | set().union(*(_loads(node) for node in kept))
        if grown == needed:
            break
        needed = grown
    return _drop(tree, kept)


def _keep(tree: ast.Module, taint: _Taint, needed: set[str]) -> list[ast.AST]:
    """The top-level statements (and loop, branch and with headers) the sandbox's program keeps."""
    kept: list[ast.AST] = []
    for node in (n for statement in tree.body for n in _scope_nodes(statement)):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            kept.append(ast.Tuple(elts=[node.target, node.iter], ctx=ast.Load()))
        elif isinstance(node, (ast.If, ast.While)):
            kept.append(node.test)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            kept.extend(i.context_expr for i in node.items)
        elif isinstance(node, ast.Try):
            kept.extend(h.type for h in node.handlers if h.type is not None)
        elif isinstance(node, DEFINITIONS):
            if node.name in needed or node.name in taint.module_names():
                kept.append(node)
        elif isinstance(node, ast.stmt) and _statement_kept(node, taint, needed):
            kept.append(node)
    return kept


def _statement_kept(node: ast.stmt, taint: _Taint, needed: set[str]) -> bool:
    """A simple statement stays when it sends operands back, reads the student's values, or
    binds a name a kept statement loads."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
            isinstance(node.value.func, ast.Name) and node.value.func.id in (CHECK, RAISED):
        return True
    if isinstance(node, (ast.Pass, ast.Break, ast.Continue, ast.Global, ast.Nonlocal)):
        return True
    binds = set().union(*(_binds(n) for n in ast.walk(node)))
    return taint.node(node) or bool(binds & needed)


def _drop(tree: ast.Module, kept: list[ast.AST]) -> ast.Module:
    """``tree`` with only the ``kept`` statements of its top level and its compound statements."""
    keep_ids = {id(node) for node in kept}

    def filtered(block: list[ast.stmt], required: bool) -> list[ast.stmt]:
        out = []
        for statement in block:
            if _compound(statement):
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(statement, field, None)
                    if isinstance(inner, list):
                        setattr(statement, field, filtered(inner, field == "body"))
                for handler in getattr(statement, "handlers", []):
                    handler.body = filtered(handler.body, True)
                out.append(statement)
            elif id(statement) in keep_ids:
                out.append(statement)
        return out or ([ast.Pass()] if required else [])
    tree.body = filtered(tree.body, True)
    return ast.fix_missing_locations(tree)


def _without_pytest(tree: ast.Module) -> ast.Module:
    """``tree`` without its imports of pytest when nothing loads pytest any more (its
    ``raises`` blocks are rewritten): grading needs no pytest."""
    if not {"pytest", RAISES} & _loads(tree):
        tree.body = [s for s in tree.body if not (
            isinstance(s, ast.Import) and all(a.name.split(".")[0] == "pytest" for a in s.names)
            or isinstance(s, ast.ImportFrom) and (s.module or "").split(".")[0] == "pytest")] or [ast.Pass()]
    return tree


def _compound(node: ast.stmt) -> bool:
    return isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try))


# ----------------------------------------------------------------------------- probe cases

def probe_cases(tests: list[InlineTest]) -> list[ProbeCase]:
    """One case per test, each in a worker of its own (a fresh import of the student's module):
    nothing one test's run does reaches another's. The program is a sealed input, never part of
    the plan every worker inherits: only the test's own process reads it, after the student's
    process is forked (``probe_harness.case_inline``)."""
    return [ProbeCase(test.case_name, "inline", {"provided": test.provided},
                      {PROGRAM: np.frombuffer(test.sandbox_program.encode(), dtype=np.uint8)}, KEPT_ARRAYS,
                      group=test.case_name) for test in tests]


# ----------------------------------------------------------------------------- the master's run

@dataclass
class MasterRun:
    """What one test recorded against the master's module: per site, each run's operands."""

    records: dict[int, list[tuple[Any, ...]]]
    problem: str | None      # the test failed on the master (the assignment is wrong)


def seed_generators() -> None:
    """The global generators' state before a test runs, the same in both runs: inputs a test
    draws from them are the same for the master and the student (until student code draws)."""
    random.seed(SEED)
    np.random.seed(SEED)
    try:
        import torch
    except ImportError:   # an assignment without torch
        return
    torch.manual_seed(SEED)


@lru_cache(maxsize=8)
def master_runs(master_path: Path, fingerprint: str) -> dict[str, MasterRun]:
    """Each test of the master at ``master_path`` run against the master's own module, in this
    process (the master is trusted), once per process and master version (``fingerprint``)."""
    master = nbformat.read(str(master_path), as_version=4)
    scaffolds = {s.cell_id: next(cells.source(c) for c in master.cells if c.get("id") == s.cell_id)
                 for s in cells.scaffolds(master)}
    module_source, _ = submission_module_source(master, scaffolds)
    module_code = compile(module_source, f"<master {master_path.name}>", "exec")
    return {test.name: _master_run(test, module_code) for test in inline_tests(master)}


def _master_run(test: InlineTest, module_code: Any) -> MasterRun:
    records: dict[int, list[tuple[Any, ...]]] = {}

    def check(site: int, values: tuple[Any, ...]) -> None:
        records.setdefault(site, []).append(values)

    def raised(site: int, exception: BaseException | None, values: tuple[Any, ...]) -> None:
        records.setdefault(site, []).append((exception, *values))
    namespace: dict[str, Any] = {"__name__": "g2c_master"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(module_code, namespace)
            namespace.update({CHECK: check, RAISED: raised})
            seed_generators()
            exec(compile(test.master_program, f"<test {test.name}>", "exec"), namespace)
    except Exception:  # noqa: BLE001 - a broken test costs its own item
        return MasterRun(records, traceback.format_exc(limit=-3))
    for site in test.sites:
        for values in records.get(site.index, []):
            problem = _judge_master(site, values)
            if problem:
                return MasterRun(records, f"the reference solution fails line {site.line}, `{site.text}`: {problem}")
    return MasterRun(records, None)


def _judge_master(site: Site, values: tuple[Any, ...]) -> str | None:
    """Why the master's own run of ``site`` fails (None when it holds)."""
    if site.kind in ("raises", "doctest_raises"):
        exception = values[0]
        sent = None if exception is None else {
            "types": [f"{c.__module__}.{c.__qualname__}" for c in type(exception).__mro__],
            "message": str(exception) if type(exception).__module__ == "builtins" else ""}
        return _judge_raised(site, sent, values)
    if site.kind == "doctest":
        return _judge_output(site, _doctest_repr(values[0]))
    if site.kind == "print":
        return _judge_printed(site, list(values))
    return _judge_skeleton(site, list(values))


# ----------------------------------------------------------------------------- data from the student's run

class NotData(ValueError):
    """A value the student's run sent that is not data the grader reads."""


def from_data(value: Any, arrays: dict[str, np.ndarray], subclasses: list[str] | None = None) -> Any:
    """A value the harness's ``_as_data`` sent, rebuilt here: plain JSON as it is, tagged
    containers, arrays (with their dtype) and tensors (as torch tensors); an instance of a
    subclass of a built-in type as the built-in value, its class's name added to
    ``subclasses``. Raises NotData for a refused value, with the reason, or for anything
    malformed."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        raise NotData("an untagged list")
    if type(value) is not dict or len(value) not in (1, 2):
        raise NotData("a malformed value")
    if "refused" in value:
        raise NotData(f"{value['refused']}, not a number, string, array, tensor or a list, tuple or dict of them")
    (tag, content), *rest = value.items()
    dtype = rest[0][1] if rest and rest[0][0] in ("dtype", "of") else None
    if tag == "sub" and isinstance(content, str) and rest:
        if subclasses is not None:
            subclasses.append(content.removeprefix("builtins."))
        return from_data(dtype, arrays, subclasses)
    if tag in ("list", "tuple", "set") and type(content) is list:
        items = [from_data(v, arrays, subclasses) for v in content]
        return {"list": list, "tuple": tuple, "set": set}[tag](items)
    if tag == "dict" and type(content) is list and all(type(p) is list and len(p) == 2 for p in content):
        return {_hashable(from_data(k, arrays, subclasses)): from_data(v, arrays, subclasses) for k, v in content}
    if tag == "float" and content in ("nan", "inf", "-inf"):
        return float(content)
    if tag == "scalar" and isinstance(dtype, str) and type(content) in (bool, int, float):
        return np.dtype(_known_dtype(dtype)).type(content)
    if tag == "np_dtype" and isinstance(content, str):
        return np.dtype(_known_dtype(content))
    if tag in ("array", "tensor", "torch_dtype"):
        return _array(tag, content, dtype, arrays)
    raise NotData("a malformed value")


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict, set, np.ndarray)):
        raise NotData("a dict key that is not a number, string or tuple")
    return key


NUMPY_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "bfloat16"}


def _known_dtype(name: str) -> str:
    if name not in NUMPY_DTYPES or name == "bfloat16":
        raise NotData(f"an unknown dtype {name[:40]!r}")
    return name


def _array(tag: str, content: Any, dtype: Any, arrays: dict[str, np.ndarray]) -> Any:
    import torch
    if tag == "torch_dtype":
        if content not in NUMPY_DTYPES:
            raise NotData("an unknown torch dtype")
        return getattr(torch, content)
    if not isinstance(content, str) or content not in arrays or dtype not in NUMPY_DTYPES:
        raise NotData("an array that did not arrive")
    data = arrays[content]
    if tag == "array":
        return data.astype(_known_dtype(dtype)) if data.dtype != np.dtype(_known_dtype(dtype)) else data
    return torch.from_numpy(np.array(data, dtype=np.float64)).to(getattr(torch, dtype))


# ----------------------------------------------------------------------------- verdicts

def evaluate(tests: list[InlineTest], context: CheckContext, runs: dict[str, MasterRun]) -> dict[str, Verdict]:
    """A verdict for every test: each decided on its own (``decide``)."""
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = (context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}")
        return {test.name: Verdict("error", reason or "the code was not probed") for test in tests}
    return decide({test.name: partial(_verdict, test, context, runs[test.name]) for test in tests})


def _verdict(test: InlineTest, context: CheckContext, master: MasterRun) -> Verdict:
    if master.problem:
        return Verdict("error", "this test fails on the reference solution (the grader's maintainers will fix it; "
                                "it is not your fault)", master.problem)
    out = context.probe.cases.get(test.case_name) if context.probe else None
    if out is None or out.status != "ok":
        why = (out.error or out.status) if out is not None else "it was not run"
        return _failed(test, f"the test did not finish: {why}")
    records = out.info.get("records")
    if not isinstance(records, list) or not all(isinstance(r, list) and len(r) == 2 for r in records):
        return _failed(test, "the test's results could not be read")
    runs: dict[int, list[Any]] = {}
    for site, values in records:
        if type(site) is not int or not 0 <= site < len(test.sites):
            return _failed(test, "the test's results could not be read")
        runs.setdefault(site, []).append(values)
    for site in test.sites:
        got, expected = runs.get(site.index, []), master.records.get(site.index, [])
        if len(got) != len(expected):
            return _failed(test, f"line {site.line}, `{site.text}`: ran {_times(len(got))}; with the reference "
                                 f"solution it runs {_times(len(expected))}")
        for number, (sent, reference) in enumerate(zip(got, expected), start=1):
            problem = _judge(site, sent, reference, out.arrays)
            if problem:
                nth = f" (its run {number} of {len(got)})" if len(got) > 1 else ""
                return _failed(test, f"line {site.line}{nth}, `{site.text}`: {problem}")
    checked = sum(len(v) for v in runs.values())
    if test.in_sandbox:   # a truth value the student's code reported: never points without a person
        return Verdict("error", SANDBOX_PASS.format(checks=_times(checked, "check")), "; ".join(test.sandbox_reasons))
    return Verdict("passed", f"{_times(checked, 'check')} passed")


def _times(count: int, noun: str = "time") -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _failed(test: InlineTest, detail: str) -> Verdict:
    said = f"{test.cell.message} ({detail})" if test.cell.message else detail
    return Verdict("failed", said + (f" [{SANDBOX_NOTE}]" if test.in_sandbox else ""))


def _judge(site: Site, sent: Any, reference: tuple[Any, ...], arrays: dict[str, np.ndarray]) -> str | None:
    """Why one run of ``site`` fails (None when it holds), from the student's data ``sent`` and
    the master's operands ``reference``."""
    if site.kind in ("raises", "doctest_raises"):
        return _judge_raised(site, sent, reference)
    if type(sent) is not list or len(sent) != sum(site.tainted):
        return "its values could not be read"
    received = iter(sent)
    values = []
    read_as_builtin: list[str] = []   # the student's values of a subclass of a built-in type, for the message
    for position, tainted in enumerate(site.tainted):
        if not tainted:
            values.append(reference[position])
            continue
        subclasses: list[str] = []
        try:
            values.append(from_data(next(received), arrays, subclasses))
        except NotData as exc:
            return f"`{site.operands[position]}` is {exc}"
        if subclasses and site.kind in ("doctest", "print"):
            return (f"`{site.operands[position]}` holds a {subclasses[0]}: it prints as its class says, which the "
                    "grader does not run (return the built-in type the example shows)")
        read_as_builtin += [f"`{site.operands[position]}` holds a {name}" for name in subclasses]
    for position in _compared(site, reference):
        problem = _layout_problem(values[position], reference[position]) if site.tainted[position] else None
        if problem:
            return f"`{site.operands[position]}` {problem}"
    if site.kind == "doctest":
        return _judge_output(site, _doctest_repr(values[0]))
    if site.kind == "print":
        return _judge_printed(site, values)
    problem = _judge_skeleton(site, values)
    if problem and read_as_builtin:   # say what was caught: such a class's own ==, < or bool would have passed
        problem += (f" ({'; '.join(read_as_builtin)}, compared as the built-in value it holds: its class's "
                    "methods never run)")
    return problem


COMPARISONS = frozenset(("allclose", "isclose", "array_equal", "array_equiv", "equal", "assert_close"))


def _compared(site: Site, reference: tuple[Any, ...]) -> list[int]:
    """The operands a comparison function of ``site`` (``np.allclose``, ``torch.testing.assert_close``,
    ``np.testing.assert_*``...) is given directly, which that function may broadcast or cast."""
    if site.kind not in ("assert", "call"):
        return []
    found = []
    for node in ast.walk(ast.parse(site.skeleton, mode="eval")):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and _is_comparison(reference[_operand_index(node.func)])):
            continue
        found += [_operand_index(a) for a in [*node.args, *(k.value for k in node.keywords)]
                  if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and a.value.id == VALUES]
    return found


def _is_comparison(function: Any) -> bool:
    name, module = getattr(function, "__name__", ""), getattr(function, "__module__", "") or ""
    if not module.split(".")[0] in ("numpy", "torch", "math"):
        return False
    return name in COMPARISONS or (name.startswith("assert_") and ".testing" in module)


def _layout_problem(got: Any, expected: Any) -> str | None:
    """How an array the student's code gave differs in shape or dtype from the reference
    solution's array in its place: a comparison function would broadcast an empty or a
    one-row array against it, or cast it, and call them close."""
    if _as_float_array(got) is None or _as_float_array(expected) is None:
        return None
    got_shape, expected_shape = tuple(got.shape), tuple(expected.shape)
    got_dtype, expected_dtype = (str(v.dtype).replace("torch.", "") for v in (got, expected))
    if got_shape != expected_shape:
        return f"has shape {got_shape}; with the reference solution it has shape {expected_shape}"
    if got_dtype != expected_dtype or isinstance(got, np.ndarray) != isinstance(expected, np.ndarray):
        kinds = ["a tensor" if not isinstance(v, np.ndarray) else "an array" for v in (got, expected)]
        return (f"is {kinds[0]} of dtype {got_dtype}; with the reference solution it is {kinds[1]} of "
                f"dtype {expected_dtype}")
    return None


def _judge_skeleton(site: Site, values: list[Any]) -> str | None:
    code = compile(site.skeleton, "<check>", "eval")
    try:
        with np.errstate(all="ignore"):
            result = eval(code, {"__builtins__": {}}, {VALUES: values})  # noqa: S307 - the grader's own skeleton
            holds = True if site.kind == "call" else bool(result)
    except AssertionError as exc:
        return _short(str(exc).strip() or "the assertion failed") + _operands(site, values)
    except Exception as exc:  # noqa: BLE001 - the comparison fails as Python would have failed it
        return f"{type(exc).__name__}: {_short(str(exc))}" + _operands(site, values)
    if holds:
        return None
    said = f"{site.message}; " if site.message else ""
    return f"{said}it is False" + _operands(site, values)


def _operands(site: Site, values: list[Any]) -> str:
    """What each operand was, the student's first: pytest's "where" lines, shortened."""
    order = sorted(range(len(values)), key=lambda i: not site.tainted[i])
    shown = [f"`{site.operands[i]}` is {_summary(values[i])}" for i in order   # not functions, nor literals
             if not callable(values[i]) and not isinstance(values[i], type) and site.operands[i] != repr(values[i])][:3]
    arrays = [i for i in order if _as_float_array(values[i]) is not None]
    detail = ""
    if len(arrays) >= 2:   # the student's first array against the next: where and by how much
        got, expected = (_as_float_array(values[i]) for i in arrays[:2])
        detail = "; " + describe(compare(got, expected))
    return (": " + "; ".join(shown) if shown else "") + detail


def _as_float_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.astype(np.float64)
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        return value.detach().double().numpy()
    return None


def _summary(value: Any) -> str:
    array = _as_float_array(value)
    if array is not None:
        kind = "a tensor" if not isinstance(value, np.ndarray) else "an array"
        # NaN and infinities fail every closeness check: name them, or the failure reads like a shape problem
        bad = [f"{count} {what}" for count, what in ((int(np.isnan(array).sum()), "NaN"),
                                                     (int(np.isinf(array).sum()), "infinite")) if count]
        return (f"{kind} of shape {tuple(array.shape)}, dtype {str(value.dtype).replace('torch.', '')}"
                + (f", holding {' and '.join(bad)} of {array.size} values" if bad else ""))
    return _short(repr(value), 120)


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _doctest_repr(value: Any) -> str:
    """What the interpreter would print for ``value`` at a ``>>>`` prompt."""
    return "" if value is None else repr(value) + "\n"


def _judge_output(site: Site, got: str) -> str | None:
    if doctest.OutputChecker().check_output(site.want, got, site.flags):
        return None
    return f"expected {_short(site.want.rstrip(), 300)!r}, got {_short(got.rstrip(), 300)!r}"


def _judge_printed(site: Site, values: list[Any]) -> str | None:
    roles = ast.literal_eval(site.skeleton)
    options = {role: value for role, value in zip(roles, values) if role}
    sep, end = options.get("sep", " "), options.get("end", "\n")
    if not all(x is None or isinstance(x, str) for x in (sep, end)):
        return "print's sep and end must be strings"
    shown = [str(v) for role, v in zip(roles, values) if role is None]
    return _judge_output(site, (" " if sep is None else sep).join(shown) + ("\n" if end is None else end))


def _judge_raised(site: Site, sent: Any, reference: tuple[Any, ...]) -> str | None:
    if sent is None:
        return "no exception was raised"
    if type(sent) is not dict or type(sent.get("types")) is not list or type(sent.get("message")) is not str:
        return "the exception could not be read"
    names = [n for n in sent["types"] if type(n) is str]
    raised = names[0].removeprefix("builtins.") if names else "an exception"
    if site.kind == "doctest_raises":
        return _judge_output(site, f"{raised}: {sent['message']}\n" if sent["message"] else f"{raised}\n")
    expected, match = reference[1], reference[2]
    classes = expected if isinstance(expected, tuple) else (expected,)
    wanted = [f"{c.__module__}.{c.__qualname__}" for c in classes if isinstance(c, type)]
    if not set(wanted) & set(names):
        return f"raised {raised}, not {' or '.join(w.removeprefix('builtins.') for w in wanted)}"
    if match is not None and not re.search(str(match), sent["message"]):
        return f"raised {raised} whose message {_short(sent['message'], 200)!r} does not match {str(match)!r}"
    return None

