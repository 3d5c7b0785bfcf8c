"""Stage 2b, graft: the module the probe imports, built from trusted code and the student's symbols.

The grader's own copy of the provided code (the master notebook's ``provided`` cells, in
order, except ``demo`` cells that run experiments rather than define code) with each scaffold
cell grafted in its place: only the symbols its metadata declares (functions, or methods of
a class whose other members stay the grader's), plus the student's own helper imports and
functions. Redefinitions of provided names are dropped with a note. Nothing here runs
student code; it only parses it.
"""
from __future__ import annotations

import ast
import builtins
import copy

import nbformat

from grader import cells


class GraftError(ValueError):
    """The student's scaffold cell cannot be combined with the provided code."""


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _import_targets(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    """Name bound -> what it is bound to ("module" or "module:attribute"), for one import."""
    targets = {}
    for alias in node.names:
        if isinstance(node, ast.Import):
            module = alias.name if alias.asname else alias.name.split(".")[0]
            targets[alias.asname or alias.name.split(".")[0]] = module
        else:
            targets[alias.asname or alias.name] = f"{'.' * node.level}{node.module or ''}:{alias.name}"
    return targets


def provided_imports(sources: list[str]) -> dict[str, str]:
    """The names the imports of ``sources`` bind, and what each is bound to."""
    found: dict[str, str] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_import_targets(node))
    return found


def _strip_provided_imports(node: ast.Import | ast.ImportFrom, provided_names: set[str],
                            provided_imports: dict[str, str]) -> tuple[ast.stmt | None, list[str]]:
    """The import without the names it would rebind from the provided code (None if nothing is
    left), and the rebound names that differ from the provided binding (for a note).

    ``import torch`` next to the provided ``import torch`` changes nothing and goes silently;
    ``from math import pi as EPS`` would change the provided EPS and is dropped with a note, as
    is a star import (it could rebind anything).
    """
    targets = _import_targets(node)
    if "*" in targets:
        return None, ["*"]
    kept = [alias for alias in node.names if (alias.asname or alias.name.split(".")[0]) not in provided_names]
    rebound = sorted(name for name, target in targets.items()
                     if name in provided_names and provided_imports.get(name) != target)
    if not kept:
        return None, rebound
    stripped = copy.copy(node)
    stripped.names = kept
    return stripped, rebound


def _member_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found[-1] if found else None


def graft_scaffold(master_scaffold: str, student_scaffold: str, provided_names: set[str],
                   scaffold: cells.Scaffold, provided_imports: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """One scaffold cell as the probe runs it: the student's declared symbols, inside the
    grader's copy of each scaffold class (its other members), with the student's own helpers.

    Returns (source, notes). Student members named like a provided member are ignored, as
    are top-level statements that are not imports or definitions, and definitions or
    imports that would rebind a provided name (``provided_imports``: what the provided code's
    own imports bind, see ``_strip_provided_imports``).
    """
    master_tree = ast.parse(master_scaffold)
    try:
        student_tree = cells.parse_python(student_scaffold)
    except SyntaxError as exc:
        raise GraftError(f"the scaffold cell is not valid Python: {cells.syntax_problem(exc)}") from exc
    notes: list[str] = []
    classes = [owner for owner in scaffold.owners if scaffold.methods(owner)]
    grafted = [_graft_class(_find_class(master_tree, name), _find_class(student_tree, name),
                            scaffold.methods(name), notes) for name in classes]
    defined = {n.name for n in student_tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [owner for owner in scaffold.owners if owner not in classes and owner not in defined]
    if missing:
        notes.append(f"the scaffold cell defines no {', '.join(missing)}")
    extras = []
    for node in student_tree.body:
        if isinstance(node, ast.Expr) or (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        names = _top_level_names(ast.Module(body=[node], type_ignores=[]))
        if not names or not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                              ast.ClassDef, ast.Assign, ast.AnnAssign)):
            notes.append(f"scaffold cell line {node.lineno}: statement ignored by the grader")
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            line = node.lineno
            node, rebound = _strip_provided_imports(node, provided_names, provided_imports or {})
            if rebound == ["*"]:
                notes.append(f"scaffold cell line {line}: a star import is ignored by the grader; "
                             "import the names you use")
            elif rebound:
                notes.append(f"redefinition of provided {', '.join(rebound)} ignored; "
                             "the grader uses its own copy")
            if node is not None:
                extras.append(node)
            continue
        clash = names & provided_names
        if clash:
            notes.append(f"redefinition of provided {', '.join(sorted(clash))} ignored; "
                         "the grader uses its own copy")
            continue
        extras.append(node)
    module = ast.Module(body=extras + grafted, type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module)), notes


def _graft_class(master_class: ast.ClassDef | None, student_class: ast.ClassDef | None,
                 student_methods: frozenset[str], notes: list[str]) -> ast.ClassDef:
    """The master's class with the student's methods (and own members) in place of its own."""
    if master_class is None:
        raise GraftError("the master notebook's scaffold cell lacks a class it declares")
    if student_class is None:
        raise GraftError(f"the scaffold cell does not define class {master_class.name}")
    provided_members = {_member_name(n) for n in master_class.body} - {None} - student_methods
    body = [n for n in master_class.body if _member_name(n) not in student_methods]
    for node in student_class.body:
        name = _member_name(node)
        if name is None and isinstance(node, ast.Assign):   # ``_keys, _values = [], []``
            bound = _top_level_names(ast.Module(body=[node], type_ignores=[]))
            bound |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if bound and not bound & provided_members:
                body.append(node)
            continue
        if name is None:
            continue  # docstrings and stray expressions
        if name in provided_members:
            continue  # the grader's copy of provided members is authoritative
        body.append(node)
    missing = student_methods - {_member_name(n) for n in student_class.body}
    if missing:
        notes.append(f"{master_class.name} defines no {', '.join(sorted(missing))}")
    return ast.ClassDef(name=master_class.name, bases=master_class.bases, keywords=master_class.keywords,
                        body=body, decorator_list=[], type_params=[])


def provided_names(notebook: nbformat.NotebookNode) -> set[str]:
    """The top-level names the notebook's provided code binds in the module the probe imports:
    what a package-style submission imports from the course package instead (see ``load``)."""
    return set().union(*(_top_level_names(ast.parse(cells.source(c))) for c in notebook.cells
                         if c.cell_type == "code" and cells.PROVIDED in cells.tags(c)
                         and cells.DEMO not in cells.tags(c)))


def provided_definitions(notebook: nbformat.NotebookNode) -> str:
    """The grader's copy of the provided code as an inline check's test process runs it
    (``probe_harness.case_inline``): each provided cell's imports, definitions and constants, in
    order. What runs at definition time (decorators, defaults, bases, a class body, a constant's
    value) must read only names bound before it; anything else (a statement that binds no name,
    a value computed from the student's code) is left out, and the test reads such a name from
    the student's process instead."""
    bound = set(dir(builtins))
    kept: list[ast.stmt] = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or cells.PROVIDED not in cells.tags(cell) or cells.DEMO in cells.tags(cell):
            continue
        for node in ast.parse(cells.source(cell)).body:
            names = _top_level_names(ast.Module(body=[node], type_ignores=[]))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                keep = not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
                keep = bool(names) and _read_at_definition(node) <= bound
            else:
                keep = False
            if keep:
                kept.append(node)
                bound |= names
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


def _read_at_definition(node: ast.stmt) -> set[str]:
    """The names a definition or assignment reads when it runs (not its functions' bodies), less
    the names a class body binds for itself."""
    found: set[str] = set()
    own: set[str] = set()

    def visit(part: ast.AST, in_class: bool) -> None:
        if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = part.args
            for default in [*arguments.defaults, *[d for d in arguments.kw_defaults if d]]:
                visit(default, in_class)
            for decorator in getattr(part, "decorator_list", []):
                visit(decorator, in_class)
            if in_class and not isinstance(part, ast.Lambda):
                own.add(part.name)
            return
        if isinstance(part, ast.ClassDef) and part is not node:
            own.add(part.name)
        if isinstance(part, ast.Name):
            if isinstance(part.ctx, ast.Load):
                found.add(part.id)
            elif in_class:
                own.add(part.id)
            return
        for child in ast.iter_child_nodes(part):
            visit(child, in_class or isinstance(part, ast.ClassDef))
    visit(node, False)
    return found - own


def submission_module_source(master: nbformat.NotebookNode,
                             student_scaffolds: dict[str, str]) -> tuple[str, list[str]]:
    """Provided cells of the master (in order) with each grafted scaffold cell in its place;
    ``student_scaffolds`` maps each scaffold cell id to the student's cell."""
    declared = {s.cell_id: s for s in cells.scaffolds(master)}
    if not declared:
        raise GraftError("the master notebook has no scaffold cell")
    parts: list[str | cells.Scaffold] = []
    provided: list[str] = []
    masters: dict[str, str] = {}
    for cell in master.cells:
        if cell.cell_type != "code":
            continue
        if cells.SCAFFOLD in cells.tags(cell):
            scaffold = declared[str(cell.get("id"))]
            masters[scaffold.cell_id] = cells.source(cell)
            parts.append(scaffold)  # filled once every provided name is known
        elif cells.PROVIDED in cells.tags(cell) and cells.DEMO not in cells.tags(cell):
            provided.append(cells.source(cell))
            parts.append(cells.source(cell))
    names = provided_names(master)
    imports = provided_imports(provided)
    notes: list[str] = []
    sources = []
    futures: set[str] = set()
    for part in parts:
        if isinstance(part, cells.Scaffold):
            if part.cell_id not in student_scaffolds:   # load said why; the other cells are graded
                notes.append(f"{', '.join(part.symbols)}: not found in the notebook, not graded")
                sources.append("")
                continue
            try:
                part, graft_notes = graft_scaffold(masters[part.cell_id], student_scaffolds[part.cell_id],
                                                   names, part, imports)
                part, found = _without_futures(part)
            except (RecursionError, MemoryError) as exc:   # ast.unparse of a very deep expression
                raise GraftError(f"the scaffold cell cannot be graded: {cells.parse_failure(exc)}") from None
            notes.extend(graft_notes)
            futures.update(found)
        sources.append(part)
    # A future statement must open its module; in a notebook each cell is one, so a student's
    # ``from __future__ import annotations`` applies to the whole grafted module.
    head = f"from __future__ import {', '.join(sorted(futures))}\n\n\n" if futures else ""
    return head + "\n\n\n".join(sources) + "\n", notes


def _without_futures(grafted: str) -> tuple[str, set[str]]:
    """A grafted scaffold without its ``from __future__`` imports, and the features they name."""
    tree = ast.parse(grafted)
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    if not futures:
        return grafted, set()
    rest = ast.Module(body=[n for n in tree.body if n not in futures], type_ignores=[])
    return ast.unparse(rest), {alias.name for node in futures for alias in node.names}
