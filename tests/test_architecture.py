"""The grader's modules import one another without a circle.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of a module under ``grader/``, at module level and inside functions alike (a function-level import
is a circle all the same, only deferred), relative imports resolved against the module's package.
An edge goes to the grader module named: ``from grader.checks import inline`` names the module
``grader.checks.inline``, ``from grader.checks import CHECKS_FOLDER`` the package
``grader.checks`` (its ``__init__``). A package's ``__init__`` importing its own submodules is an
edge like any other, so a submodule that imports from its package's face closes a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

GRADER = Path(__file__).resolve().parent.parent / "grader"


def module_name(path: Path) -> str:
    parts = path.relative_to(GRADER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def grader_modules() -> dict[str, Path]:
    """Every module of the grader package by its dotted name (packages by their ``__init__``)."""
    return {module_name(path): path for path in sorted(GRADER.rglob("*.py")) if "__pycache__" not in path.parts}


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The grader modules that the module ``name`` (at ``path``) imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from P import m``: the submodule P.m when there is one, else a name of P itself.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import grader.a.b`` names grader.a.b; a name below a module resolves to the module.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = grader_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [circle(graph, set(component)) for component in components]


def circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, within the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return sorted(component)


def test_the_graph_is_read_from_every_module() -> None:
    graph = import_graph()
    edges = sum(len(targets) for targets in graph.values())
    print(f"grader import graph: {len(graph)} modules, {edges} edges")
    assert "grader.cli" in graph and "grader.batch" in graph["grader.cli"]
    assert edges > len(graph)


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
