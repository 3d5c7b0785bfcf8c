"""Attempts on the grader, read from a submission's code, for the TA: they change no score.

No verdict rests on anything a submission's process decides (the checks compare raw outputs
on the trusted side, the provided cells are the grader's copies, the probe's workers run
under an audit hook and a read-only sandbox), so a notebook that patches ``np.allclose``,
walks the stack for expected values or exits before a check gains nothing and loses nothing
for it: no item charges it. A TA still wants to know that it was tried. This module reads
the code the student wrote (every code cell that is not the assignment's own, and the package
files) and names each construct that only an attempt on the grader needs, with its cell,
line and code:

- ``library_patch``: an attribute of an imported module or class assigned, deleted or set
  with ``setattr`` (``np.allclose = ...``, ``torch.Tensor.__eq__ = ...``); configuration
  namespaces (``torch.backends``, ``*.config``, ``*.options``, ``rcParams``) are left alone;
- ``frame_access``: other code's frames, closures, namespaces and objects (``sys._getframe``,
  ``inspect.stack``, ``f_back``, ``f_globals``, ``__closure__``, ``gc.get_referrers``,
  ``sys.settrace``, ``sys.modules``, ``globals()`` called inside a function);
- ``code_replacement``: a function's ``__code__`` or defaults, an object's ``__class__``;
- ``comparison_override``: a class whose ``__eq__``/``__ne__``/``__bool__`` returns a constant
  (or, for a class defined inside a function, ``__repr__``/``__str__``), or that hooks torch's or
  numpy's dispatch (``__torch_function__``, ``__array_ufunc__``);
- ``traceback_silenced``: ``sys.excepthook``, IPython's ``showtraceback``, ``set_custom_exc``;
- ``process_control``: exits, kills and skips (``os._exit``, ``sys.exit``, ``os.kill``, ``raise
  SystemExit``, ``unittest.SkipTest``, ``pytest.skip``), signal handlers and alarms, ``fork``,
  ``ctypes``, audit hooks;
- ``grader_files``: a string naming where the grader keeps its material or its runs
  (``/proc/``, ``solutions/``, ``probe_harness``, ``/dev/shm`` ...), or an import of the grader;
- ``dynamic_code``: ``exec``, ``eval``, ``compile`` or an import of a name built at run time,
  which a reading cannot follow.

Names are resolved through the imports of the whole notebook (the provided cells' ``import
numpy as np`` makes ``np.allclose = ...`` in a student's cell a patch of numpy), and the usual
aliases are known without one. Honest code of this course needs none of these; ``tests/test_tampering.py`` measures both
ways: what the attack corpora must show and what the correct and mistaken solutions must not.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import nbformat

from grader import cells
from grader.load import Submission

MAX_CODE_CHARS = 160   # an attempt's line, as the TA's page shows it
MAX_ATTEMPTS = 50      # per submission: a notebook of a thousand patches is one finding, listed in part

# Attribute paths whose assignment configures a library rather than replacing its behaviour.
CONFIGURATION = {"backends", "config", "options", "rcParams", "flags", "defaults"}
FRAME_ATTRIBUTES = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "gi_frame",
                    "cr_frame", "ag_frame", "__closure__", "__globals__", "cell_contents"}
FRAME_CALLS = {"sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "threading.settrace",
               "threading.setprofile", "inspect.currentframe", "inspect.stack", "inspect.trace",
               "inspect.getouterframes", "inspect.getinnerframes", "gc.get_referrers", "gc.get_referents",
               "gc.get_objects"}
CODE_ATTRIBUTES = {"__code__", "__defaults__", "__kwdefaults__", "__class__", "__bases__", "__builtins__"}
DISPATCH_HOOKS = {"__torch_function__", "__torch_dispatch__", "__array_ufunc__", "__array_function__",
                  "__instancecheck__", "__subclasscheck__"}
CONSTANT_DUNDERS = {"__eq__", "__ne__", "__bool__"}
SILENCING_ATTRIBUTES = {"excepthook", "showtraceback", "showsyntaxerror", "set_custom_exc", "InteractiveTB"}
PROCESS_CALLS = {"os._exit", "os.kill", "os.killpg", "os.fork", "os.forkpty", "os.setsid", "sys.exit", "exit",
                 "quit", "signal.signal", "signal.alarm", "signal.setitimer", "signal.pthread_kill",
                 "sys.addaudithook", "resource.setrlimit", "pytest.skip", "pytest.exit", "pytest.xfail"}
PROCESS_MODULES = {"ctypes", "_ctypes"}
EXITING_EXCEPTIONS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "SkipTest"}
LOCAL_CLASS_DUNDERS = {"__repr__", "__str__"}   # constant in a class made inside a function: a printed fake
GRADER_PATHS = ("/proc/", "solutions/", "rubrics/", "grader/", "probe_harness", "run_notebook", "raw_outputs",
                "grader_errors", "results.json", "/dev/shm", "G2C-FILE", "__g2c", "/etc/", "/root")
GRADER_PACKAGE = "grader"
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module"}
DECODERS = {"base64", "codecs", "zlib", "marshal", "pickle", "bz2", "lzma"}
# Aliases known without an import in sight (a package file may import nothing of the notebook's).
USUAL_ALIASES = {"np": "numpy", "numpy": "numpy", "torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn",
                 "math": "math", "sys": "sys", "os": "os", "time": "time", "random": "random", "builtins": "builtins",
                 "inspect": "inspect", "gc": "gc", "plt": "matplotlib.pyplot", "pd": "pandas"}

KINDS = {
    "library_patch": "replaces part of a library",
    "frame_access": "reads other code's frames or objects",
    "code_replacement": "replaces a function's code or an object's class",
    "comparison_override": "changes how its values compare or dispatch",
    "traceback_silenced": "silences error reports",
    "process_control": "exits, kills or forks, or handles signals",
    "grader_files": "names the grader's files",
    "dynamic_code": "runs code built at run time",
    "unread": "could not be read for attempts",   # the reading itself failed (the pipeline's note)
}


@dataclass(frozen=True)
class Attempt:
    """One construct of an attempt on the grader: what it is, where, and the line itself."""

    kind: str     # a key of KINDS
    where: str    # "code cell 7, line 3" or "g2c/attention.py, line 12"
    code: str     # the line, cut to MAX_CODE_CHARS
    detail: str   # what exactly: the name, attribute or string

    def describe(self) -> str:
        return f"{self.where}: {KINDS[self.kind]} ({self.detail}): {self.code}"

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def submission_attempts(submission: Submission, template: nbformat.NotebookNode) -> list[Attempt]:
    """The attempts in what the student wrote (``student_code``), names resolved through the
    imports of the whole notebook and of ``template``."""
    codes = [cells.source(c) for c in template.cells if c.cell_type == "code"]
    if submission.notebook is not None:
        codes += [cells.source(c) for c in submission.notebook.cells if c.get("cell_type") == "code"]
    return attempts(student_code(submission, template), import_aliases(codes))


def student_code(submission: Submission, template: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(where, code) of what the student wrote: each code cell of the notebook whose source is not
    one of ``template``'s (the assignment's own code, provided cells included, is not the
    student's), then each package file graded in place of a scaffold cell."""
    own = {cells.source(c) for c in template.cells if c.cell_type == "code"}
    found = []
    if submission.notebook is not None:
        code_cells = [c for c in submission.notebook.cells if c.get("cell_type") == "code"]
        found += [(cells.code_cell_label(number), cells.source(cell)) for number, cell in enumerate(code_cells, 1)
                  if cells.source(cell) not in own]
    found += [(str(submission.package_scaffolds[cell_id]), submission.scaffold_sources[cell_id])
              for cell_id in submission.package_scaffolds if cell_id in submission.scaffold_sources]
    return found


def import_aliases(codes: Iterable[str]) -> dict[str, str]:
    """Local name -> module path, from the import statements of ``codes`` (the whole notebook,
    the assignment's cells included), over the usual aliases."""
    aliases = dict(USUAL_ALIASES)
    for code in codes:
        tree = _parsed(code)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    aliases[(alias.asname or alias.name).split(".")[0]] = (alias.name if alias.asname
                                                                          else alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _parsed(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def attempts(sources: Iterable[tuple[str, str]], aliases: dict[str, str] | None = None) -> list[Attempt]:
    """The attempts in ``sources``, (where, code) pairs in the order the student reads them, with
    names resolved through ``aliases`` (``import_aliases``; default the usual ones); code that
    does not parse shows none (the grader reports it elsewhere). At most MAX_ATTEMPTS."""
    found: list[Attempt] = []
    for where, code in sources:
        tree = _parsed(code)
        if tree is None:
            continue
        reader = _Reader(where, code.splitlines(), aliases or USUAL_ALIASES)
        try:
            reader.visit(tree)
        except RecursionError:
            continue
        found.extend(sorted(set(reader.found), key=lambda a: (_line_of(a.where), a.kind, a.detail)))
        if len(found) >= MAX_ATTEMPTS:
            return found[:MAX_ATTEMPTS]
    return found


def _line_of(where: str) -> int:
    return int(where.rsplit(" ", 1)[-1]) if where.rsplit(" ", 1)[-1].isdigit() else 0


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name or an Attribute chain on one, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


class _Reader(ast.NodeVisitor):
    """Walks one source's tree, noting each construct with its line."""

    def __init__(self, where: str, lines: list[str], aliases: dict[str, str]):
        self.where, self.lines = where, lines
        self.imported = dict(aliases)   # local name -> the module path it was imported as
        self.found: list[Attempt] = []
        self.depth = 0                  # functions around the node being read

    def note(self, kind: str, node: ast.AST, detail: str) -> None:
        line = getattr(node, "lineno", 0)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        text = text if len(text) <= MAX_CODE_CHARS else text[: MAX_CODE_CHARS - 3] + "..."
        self.found.append(Attempt(kind, f"{self.where}, line {line}", text, detail[:MAX_CODE_CHARS]))

    def qualified(self, node: ast.AST) -> str:
        """The dotted name with its import resolved (``np.allclose`` -> ``numpy.allclose``)."""
        name = dotted(node)
        head, _, rest = name.partition(".")
        if head in self.imported:
            return self.imported[head] + ("." + rest if rest else "")
        return name

    # --- imports -------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imported[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else \
                alias.name.split(".")[0]
            if alias.name.split(".")[0] in PROCESS_MODULES:
                self.note("process_control", node, f"imports {alias.name}")
            if alias.name.split(".")[0] == GRADER_PACKAGE:
                self.note("grader_files", node, f"imports {alias.name}")
            if alias.name.split(".")[0] in DECODERS:
                self.note("dynamic_code", node, f"imports {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            self.imported[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name
        if module.split(".")[0] in PROCESS_MODULES:
            self.note("process_control", node, f"imports from {module}")
        if module.split(".")[0] == GRADER_PACKAGE:
            self.note("grader_files", node, f"imports from {module}")
        if module.split(".")[0] in DECODERS:
            self.note("dynamic_code", node, f"imports from {module}")

    # --- assignments ---------------------------------------------------------------------

    def _target(self, target: ast.AST, node: ast.AST, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, node, verb)
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                and target.value.attr == "__dict__":
            target = target.value   # module.__dict__["name"] = ... is a patch of the module
        if not isinstance(target, ast.Attribute):
            return
        if target.attr in CODE_ATTRIBUTES:
            self.note("code_replacement", node, f"{verb} {dotted(target) or target.attr}")
        elif target.attr in SILENCING_ATTRIBUTES:
            self.note("traceback_silenced", node, f"{verb} {dotted(target) or target.attr}")
        elif self._is_library(target):
            self.note("library_patch", node, f"{verb} {self.qualified(target)}")

    def _is_library(self, target: ast.Attribute) -> bool:
        """Whether ``target`` (an attribute being set) belongs to something imported, outside the
        configuration namespaces."""
        name = dotted(target)
        head = name.split(".")[0]
        parts = self.qualified(target).split(".")
        return bool(name) and (head in self.imported or head == "__builtins__") \
            and not CONFIGURATION & set(parts)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target, node, "sets")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, node, "changes")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target, node, "sets")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._target(target, node, "deletes")
        self.generic_visit(node)

    # --- calls, attributes, names --------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualified(node.func)
        if name in ("setattr", "delattr") and node.args:
            first = node.args[0]
            field = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if field in CODE_ATTRIBUTES:
                self.note("code_replacement", node, f"{name} {field}")
            elif field in SILENCING_ATTRIBUTES:
                self.note("traceback_silenced", node, f"{name} {field}")
            elif dotted(first).split(".")[0] in self.imported and not CONFIGURATION & set(
                    self.qualified(first).split(".")):
                self.note("library_patch", node, f"{name} on {self.qualified(first)}")
        elif name in FRAME_CALLS:
            self.note("frame_access", node, name)
        elif name in ("globals", "vars") and not node.args and self.depth:
            self.note("frame_access", node, f"{name}() inside a function")
        elif name in PROCESS_CALLS:
            self.note("process_control", node, name)
        elif name in DYNAMIC_CALLS and not (node.args and isinstance(node.args[0], ast.Constant)):
            self.note("dynamic_code", node, name)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FRAME_ATTRIBUTES:
            self.note("frame_access", node, node.attr)
        elif self.qualified(node) == "sys.modules":
            self.note("frame_access", node, "sys.modules")
        elif node.attr in SILENCING_ATTRIBUTES and node.attr != "excepthook":
            self.note("traceback_silenced", node, node.attr)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if raised is not None and dotted(raised).split(".")[-1] in EXITING_EXCEPTIONS:
            self.note("process_control", node, f"raises {dotted(raised)}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(dotted(base).split(".")[-1] == "BaseException" for base in node.bases):
            self.note("process_control", node, f"class {node.name} derives from BaseException")
        for member in node.body:
            if not isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if member.name in DISPATCH_HOOKS:
                self.note("comparison_override", member, f"{node.name}.{member.name}")
            elif (member.name in CONSTANT_DUNDERS or self.depth and member.name in LOCAL_CLASS_DUNDERS) \
                    and _returns_constant(member):
                self.note("comparison_override", member, f"{node.name}.{member.name} returns a constant")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            hit = next((p for p in GRADER_PATHS if p in node.value), None)
            if hit:
                self.note("grader_files", node, repr(hit))


def _returns_constant(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether every return of ``function`` returns the same literal (``return True``)."""
    returns = [n for n in ast.walk(function) if isinstance(n, ast.Return)]
    values = {n.value.value for n in returns if isinstance(n.value, ast.Constant)}
    return bool(returns) and len(values) == 1 and all(isinstance(n.value, ast.Constant) for n in returns)
