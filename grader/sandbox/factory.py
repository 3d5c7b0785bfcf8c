"""The sandbox a command grades in: :func:`make_sandbox` from the rubric's limits, and
:func:`hidden_paths`, the assignment's files it must keep from student code."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from grader.assignment import Assignment
from grader.checks import CHECKS_FOLDER
from grader.report.terminal import say
from grader.rubric import Limits
from grader.sandbox import Limits as SandboxLimits
from grader.sandbox import Sandbox, SandboxUnavailable


class NoSandbox(Exception):
    """No sandbox can run here with the isolation asked for: the message says what to do."""


def make_sandbox(limits: Limits, allow_unsandboxed: bool, isolation: str = "auto",
                 protected_paths: Sequence[Path] = (), python_paths: Sequence[Path] = ()) -> Sandbox:
    """The sandbox for one submission's commands, from the rubric's (possibly overridden) limits.
    ``protected_paths``: what student code must not read besides the grader package (solutions,
    rubrics, outputs, other submissions), checked before the unprivileged-user isolation;
    ``python_paths``: what every run imports from besides the grader's environment (an
    assignment's installed requirements, ``grader.requirements``).
    Raises :class:`NoSandbox` when none can run."""
    enforced = SandboxLimits(memory_bytes=int(limits.memory_gib * 2**30), cpu_seconds=limits.cpu_seconds,
                             max_processes=limits.max_processes,
                             file_size_bytes=limits.file_size_mib * 2**20,
                             disk_bytes=limits.disk_mib * 2**20,
                             wall_seconds=limits.notebook_timeout_s)
    try:
        sandbox = Sandbox(enforced, allow_unsandboxed=allow_unsandboxed, isolation=isolation,
                          protected_paths=protected_paths, python_paths=python_paths)
    except SandboxUnavailable as exc:
        raise NoSandbox(f"the sandbox cannot run here: {exc}. Install bubblewrap (make install does, "
                        "as root) or pass --allow-unsandboxed to run student code WITHOUT isolation") from exc
    if sandbox.isolation != "bubblewrap":
        say(sandbox.note, sys.stderr)
    return sandbox


def hidden_paths(assignment: Assignment) -> list[Path]:
    """The assignment's files student code must never read: the master notebook's folder, the
    rubrics, and the checks an assignment root keeps beside them (``--assignment-root``)."""
    own_checks = assignment.root / CHECKS_FOLDER
    return [assignment.master_path.parent, assignment.rubric_path.parent, *([own_checks] if own_checks.is_dir() else [])]
