"""Hidden checks: trusted code that turns raw probe outputs into verdicts.

One module or package per assignment (named by the rubric's ``checks`` key). It exposes
``probe_cases(rubric)`` (what to run inside the sandbox, as data), ``PROBE_DRIVER`` (a file of
case handlers the probe's harness runs beside its own ``call`` handler, or None) and
``evaluate(context)`` (a verdict per autograded rubric item), and may expose
``observed_answers(context)``: answer variables as the grader measured them in runs it observed,
which the written answers are then grounded on instead of the notebook's own figures
(``grounding_answers``). Nothing in this package is
visible inside the sandbox except the driver file, which holds no expected values.

Each item is decided on its own (``decide``): an exception in one check makes that item an
``error`` for the grader's maintainers to fix, and every other item is still decided.

Verdicts rest on raw outputs. A fact a worker reports about itself (a flag, a count, a type,
dtype or shape in a case's ``info``) is computed in the process where student code runs, which
can rewrite it: it may make an item fail, never pass. An item passes only on values the probe
relayed as arrays (``CaseOutput.arrays`` and ``states``, parsed here by ``grader.untrusted``'s
readers), whose shapes and dtypes are measured here and whose values are compared with the
checks' own computation.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from grader.execute import ExecutionResult
from grader.probe import ProbeCase, ProbeResult
from grader.rubric import Rubric


@dataclass
class Verdict:
    """The decision on one item: passed / failed / error, with a message for the student."""

    status: str                       # passed | failed | error
    message: str
    internal: str | None = None       # a grader traceback: for instructors, never shown to students

    @property
    def score_fraction(self) -> float:
        """Items are all or nothing: a passed item earns its points."""
        return 1.0 if self.status == "passed" else 0.0


@dataclass
class CheckContext:
    rubric: Rubric
    master_path: Path                      # the trusted master notebook
    probe: ProbeResult | None              # None when the scaffold could not be probed
    probe_problem: str | None              # why not
    execution: ExecutionResult | None      # None when the notebook could not be executed
    execution_problem: str | None
    answers: dict[str, Any] = field(default_factory=dict)   # exported answer variables
    # Owners of scaffold cells (a class, a function) the probe did not get, and why: the items
    # that need one are decided from that reason, while the other cells are graded.
    ungraded: dict[str, str] = field(default_factory=dict)


class LazyModule:
    """A module imported when code first reads one of its attributes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


# Checks modules take torch from here (``from grader.checks import torch``): imported at its first
# use, by evaluation. Probe cases need numpy only, so the CLI's look at an assignment, a batch's
# triage and a worker starting its first sandboxes go without torch's import (about 1.5 s).
if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")


class ChecksModule(Protocol):
    PROBE_DRIVER: Path | None
    def probe_cases(self, rubric: Rubric) -> list[ProbeCase]: ...
    def evaluate(self, context: CheckContext) -> dict[str, Verdict]: ...
    # Optional: ``warm_up()`` imports what ``evaluate`` will, called in a thread while a
    # submission's sandboxes run (a worker's first submission then does not wait for it after).


def import_torch() -> None:
    """Import torch now, where ``torch`` above would import it at its first use: a checks
    module's ``warm_up``. A failure is left to that first use, which reports it there."""
    try:
        importlib.import_module("torch")
    except ImportError:
        pass


CHECKS_FOLDER = "checks"   # an assignment root's own checks modules (``checks_for``)
_FROM_ROOTS: set[str] = set()   # names in sys.modules that checks_for loaded from a root's file


def checks_for(rubric: Rubric, root: Path | None = None) -> ChecksModule:
    """The checks module the rubric's ``checks`` key names. An assignment kept outside the
    project (``root``, ``grader grade --assignment-root``) may keep it beside its rubric, as
    ``<root>/checks/<name>.py`` or the package ``<root>/checks/<name>/``, loaded under that name;
    otherwise it is the module Python imports (the grader's own ``grader.checks.<name>``)."""
    name = rubric.checks
    path = None if root is None else root_checks_path(name, root)
    if path is None:
        if name in _FROM_ROOTS:   # a root's module of that name is not this assignment's
            sys.modules.pop(name, None)
            _FROM_ROOTS.discard(name)
        return importlib.import_module(name)  # type: ignore[return-value]
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
        return loaded  # type: ignore[return-value]
    folder = [str(path.parent)] if path.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=folder)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module   # before running it: its own submodules import it by name
    _FROM_ROOTS.add(name)
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        _FROM_ROOTS.discard(name)
        raise
    return module  # type: ignore[return-value]


def root_checks_path(name: str, root: Path) -> Path | None:
    """Where an assignment root keeps the checks module ``name`` (a file, or a package's
    ``__init__.py``), or None when it keeps none."""
    base = root.resolve() / CHECKS_FOLDER / name
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def grounding_answers(checks: ChecksModule, context: CheckContext) -> dict[str, Any]:
    """The answer variables the written answers are grounded on: the executed notebook's, each
    replaced by the checks module's own observation where it makes one (``observed_answers``; a
    None there means not observed, and the grounding says the variable is absent)."""
    observe = getattr(checks, "observed_answers", None)
    return {**context.answers, **(observe(context) if observe is not None else {})}


def decide(checks: Mapping[str, Callable[[], Verdict]]) -> dict[str, Verdict]:
    """Run each item's check alone; a check that raises errors its own item only."""
    verdicts = {}
    for name, check in checks.items():
        try:
            verdicts[name] = check()
        except Exception:  # noqa: BLE001 - a grader bug costs one item, never the submission
            verdicts[name] = Verdict("error", f"grader error in check {name}, please report it "
                                              "(this item is not your fault; it will be regraded)",
                                     traceback.format_exc())
    return verdicts


def execution_verdict(context: CheckContext) -> Verdict:
    """The notebook ran headless without an error: every assignment's ``notebook_runs``."""
    if context.execution is None:
        return Verdict("error", f"the notebook was not executed: {context.execution_problem}")
    problems = context.execution.problems()
    if problems:
        return Verdict("failed", "; ".join(problems[:5]))
    return Verdict("passed", f"all {len(context.execution.cells)} code cells ran without error")
