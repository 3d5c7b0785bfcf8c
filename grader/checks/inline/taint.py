"""Which names of a test cell may hold values from the student's code (:class:`_Taint`), the
scope helpers it reads a cell with, and the one refusal it leads to: a function the test
defines handed to the student's code (:func:`_functions_handed_over`)."""
from __future__ import annotations

import ast
import builtins
from typing import Callable, Iterator


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
