"""What a kept result depends on: a digest of the grader's execution and one of its evaluation.

A submission's grading has two halves. *Execution* runs student code in the sandbox and reads
back its raw outputs (``ExecutionResult``, ``ProbeResult``); *evaluation* turns those raw
outputs into verdicts and scores. The cache key (``SubmissionGrader.cache_key``) covers both
digests, so a fix to either regrades; a kept run (``SubmissionGrader.kept_run``) is reused
only under the same execution digest, so a change to evaluation alone recomputes every verdict
from the kept raw outputs without starting a sandbox, and a change to execution runs again.

Both digests are computed from file bytes (paths relative to the package, so a copy of the
tree digests the same), once per ``SubmissionGrader``.

EXECUTION (what runs and what raw outputs come back; a change runs every submission again):
  - ``EXECUTION_FILES``: the version (``__init__.py``), ``assignment.py`` (which master and
    template), ``rubric.py`` (parses the limits), ``pipeline.py`` (which stage runs on what, and
    the kept-run format), ``digests.py`` (this classification), ``intake.py``, ``load.py`` and
    ``cells.py`` (what is read of a submission), ``graft.py`` (the module the probe imports),
    ``execute.py``, ``probe.py``, ``sandbox/`` (but ``factory.py``), ``untrusted.py`` (running and reading back),
    and ``harness/*.py`` (the drivers inside the sandbox);
  - the checks module's ``PROBE_DRIVER`` file, and the probe cases as data (names, kinds,
    configs, input arrays, kept outputs, segments, groups: ``probe_cases_digest``): its own and
    the test cells' rewritten programs (``grader.checks.inline``), so a change to ``cases.py``
    or ``inline/`` that changes no case is evaluation only;
  - the master and template notebooks' bytes (``Assignment.fingerprint``), and the rubric's
    limits, answer variables and checks module name;
  - the Python version and the versions of the libraries the run uses (``LIBRARIES``).

EVALUATION (raw outputs -> verdicts and scores; a change recomputes the verdicts only):
  - ``EVALUATION_FILES``: every ``checks/**/*.py`` except the probe drivers (hidden checks,
    their references and the case definitions they read), ``score.py``, ``reference.py`` (the
    master's code as the checks' trusted model) and ``written/*.py`` (the grade-time screening
    and the written stage's inputs);
  - the whole parsed rubric (items, points, tolerances, written questions and settings; its
    limits too, which are also execution).

Within evaluation, ``screening_digest`` covers what the written stage's grade-time screening
and its inputs file depend on (``written/*.py``, the rubric without its items and tolerances,
the look-alike table's package): when only the checks or a tolerance changed, the kept flags
are reused, since the detector alone costs more than every check together.

A checks module kept outside the grader package (an assignment root's ``checks/``, see
``grader.checks.checks_for``) is digested from its own files the same way (``outside_files``):
its driver file with execution, the rest with evaluation.

NEITHER (``NEITHER``, with the reason): what chooses submissions, schedules them or presents
results, none of which changes a verdict.

The class comparison (``grader.similarity``) is neither, and keeps its own file only while the
code it compares with is unchanged (``similarity_digest``: ``SIMILARITY_FILES`` and
``SIMILARITY_LIBRARIES``).
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from types import ModuleType

import numpy as np

from grader.probe import ProbeCase
from grader.rubric import Rubric

GRADER_DIR = Path(__file__).resolve().parent

EXECUTION_FILES = ("__init__.py", "assignment.py", "rubric.py", "pipeline.py", "digests.py", "intake.py", "load.py",
                   "cells.py", "graft.py", "execute.py", "probe.py", "untrusted.py", "requirements.py", "harness/*.py",
                   *(f"sandbox/{name}.py" for name in ("__init__", "limits", "mounts", "watch", "uids", "levels", "guard",
                                                      "readers", "run")))
EVALUATION_FILES = ("checks/**/*.py", "score.py", "reference.py", "written/*.py")
NEITHER = {
    "batch.py": "discovery and the reuse decision: which submissions are graded, not how",
    "executors/__init__.py": "the interface the batch calls to run submissions; which executor, not how one is graded",
    "executors/common.py": "a worker's lifecycle and the results' arrival; a worker grades with the pipeline",
    "executors/local.py": "the worker pool: where submissions are graded, not how",
    "executors/dask.py": "carries submissions to Dask workers and results back; a worker grades with the pipeline "
                         "and refuses work whose digests differ from its own",
    "cli.py": "parses options; the limits and isolation it sets are in both keys as values",
    "sandbox/factory.py": "the command's sandbox from the rubric's limits and the paths it hides; the limits and "
                          "isolation are in both keys as values",
    "report/*.py": "pages, gradebook, overrides and score changes are built from results after grading",
    "assign.py": "writes the student notebook and check.py; the template's bytes are digested instead",
    "check_template.py": "the students' check.py, never run by the grader",
    "validate.py": "checks the master against the checks before a class is graded",
    "gradescope.py": "packages the grader for Gradescope; runs nothing itself",
    "importers/*.py": "turn a peer's notebook into an assignment, whose files are digested as any assignment's",
    "similarity.py": "compares the graded submissions after grading; it changes no result",
}
LIBRARIES = ("numpy", "torch", "nbformat", "nbclient", "ipykernel")
SCREENING_FILES = ("written/*.py",)
SCREENING_LIBRARIES = ("confusable-homoglyphs", "pyspellchecker")   # the look-alike table, the word lists
# What similarity.json's pairs depend on besides the submissions: the comparison, the boilerplate's
# reading of notebooks, the answers' reading (the queue's tokens, the screen's undoing of hidden
# characters) and the passages' cutting.
SIMILARITY_FILES = ("similarity.py", "cells.py", "report/grouping.py", "report/executed.py", "written/*.py")
SIMILARITY_LIBRARIES = ("copydetect", *SCREENING_LIBRARIES)


def _expand(patterns: tuple[str, ...], root: Path) -> set[Path]:
    return {path for pattern in patterns for path in root.glob(pattern) if path.is_file()}


def driver_file(checks: ModuleType, root: Path = GRADER_DIR) -> Path | None:
    """The checks module's probe driver, as a path under ``root`` (the tree digested); None
    when it has none or keeps it outside the grader package (``outside_files``)."""
    driver = getattr(checks, "PROBE_DRIVER", None)
    if not driver or not Path(driver).resolve().is_relative_to(GRADER_DIR):
        return None
    return root / Path(driver).resolve().relative_to(GRADER_DIR)


def outside_files(checks: ModuleType) -> tuple[Path, list[Path], list[Path]]:
    """A checks module kept outside the grader package: the folder its names are relative to,
    its driver file (execution; kept in that folder) and its other files (evaluation); no files
    for the grader's own."""
    origin = Path(checks.__file__ or "").resolve()
    if origin.is_relative_to(GRADER_DIR):
        return GRADER_DIR, [], []
    package = origin.name == "__init__.py"
    base = origin.parent.parent if package else origin.parent
    files = sorted(origin.parent.rglob("*.py")) if package else [origin]
    driver = getattr(checks, "PROBE_DRIVER", None)
    drivers = [Path(driver).resolve()] if driver and not Path(driver).resolve().is_relative_to(GRADER_DIR) else []
    return base, drivers, [f for f in files if f not in drivers]


def execution_files(checks: ModuleType, root: Path = GRADER_DIR) -> list[Path]:
    driver = driver_file(checks, root)
    return sorted(_expand(EXECUTION_FILES, root) | ({driver} if driver else set()))


def evaluation_files(checks: ModuleType, root: Path = GRADER_DIR) -> list[Path]:
    """The evaluation files, without the checks module's own driver (another assignment's
    driver stays in: it only makes this digest change more often than it must)."""
    driver = driver_file(checks, root)
    return sorted(_expand(EVALUATION_FILES, root) - ({driver} if driver else set()))


def files_digest(files: list[Path], root: Path) -> str:
    """Names (relative to ``root``) and bytes of ``files``."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def probe_cases_digest(cases: list[ProbeCase]) -> str:
    """Every case as the probe sends it: a change here changes what student code is run on."""
    digest = hashlib.sha256()
    for case in cases:
        segments = case.segments
        digest.update(json.dumps([case.name, case.kind, case.family, case.config, list(case.keep),
                                  None if segments is None else [segments.array, [list(b) for b in segments.bounds],
                                                                 segments.axis]],
                                 sort_keys=True, default=repr).encode())
        for name in sorted(case.arrays):
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(case.arrays[name]), allow_pickle=False)
            digest.update(name.encode() + b"\0" + buffer.getvalue())
    return digest.hexdigest()


def _library_versions(names: tuple[str, ...] = LIBRARIES) -> str:
    found = []
    for name in names:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    return f"python {sys.version}; " + ", ".join(found)


def execution_digest(checks: ModuleType, rubric: Rubric, assignment_fingerprint: str,
                     root: Path = GRADER_DIR, cases: list[ProbeCase] | None = None) -> str:
    """The digest of everything that decides what runs and what raw outputs come back.
    ``cases``: every probe case (the test cells' too), by default the checks module's."""
    base, drivers, _ = outside_files(checks)
    cases = checks.probe_cases(rubric) if cases is None else cases
    parts = [files_digest(execution_files(checks, root), root), probe_cases_digest(cases),
             assignment_fingerprint, repr((rubric.checks, rubric.limits, rubric.answer_variables)),
             _library_versions(), files_digest(drivers, base)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def evaluation_digest(checks: ModuleType, rubric: Rubric, root: Path = GRADER_DIR) -> str:
    """The digest of everything that turns raw outputs into verdicts and scores."""
    base, _, files = outside_files(checks)
    parts = [files_digest(evaluation_files(checks, root), root), repr(rubric), files_digest(files, base)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def similarity_digest(root: Path = GRADER_DIR) -> str:
    """The digest of the code and libraries the class comparison compares with."""
    return hashlib.sha256("\n".join([files_digest(sorted(_expand(SIMILARITY_FILES, root)), root),
                                      _library_versions(SIMILARITY_LIBRARIES)]).encode()).hexdigest()


def screening_digest(rubric: Rubric, root: Path = GRADER_DIR) -> str:
    """The digest of the written stage's grade-time screening (part of evaluation)."""
    written = replace(rubric, items=(), tolerances={}, source_sha256="")
    parts = [files_digest(sorted(_expand(SCREENING_FILES, root)), root), repr(written),
             _library_versions(SCREENING_LIBRARIES)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
