"""The sandbox's program sliced: the top-level statements that compute only expected values
removed (:func:`_sliced`), and pytest's imports once its ``raises`` blocks are rewritten
(:func:`_without_pytest`)."""
from __future__ import annotations

import ast

from grader.checks.inline.sites import CHECK, RAISED, RAISES
from grader.checks.inline.taint import DEFINITIONS, _Taint, _binds, _loads, _scope_nodes


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
