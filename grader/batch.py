"""Grade a folder of submissions: discovery, resume, regrade, the executor, progress.

Submissions are graded on an executor (:mod:`grader.executors`): a local pool of worker
processes (:class:`grader.executors.WorkerPool`, the default) or a Dask cluster
(:func:`grader.executors.dask_executor`, ``grader grade --executor dask``); both hand back each
result as it arrives, and only this process (the coordinator) writes it.

Results are written as each submission finishes. A submission whose results.json already
carries the current cache key (same notebook and package file bytes, grader version, execution
and evaluation digests, limits and isolation) is not graded again, so an interrupted batch
resumes where it stopped. One whose kept run (``SubmissionGrader.kept_run``) has the current
execution key but whose result does not (a change to the checks, the scoring or a tolerance,
or a crashed check) is regraded here, in this process, from its raw outputs: no sandbox, no pool.

Lifecycle: the workers never outlive the coordinator (the process that calls
:func:`grade_batch`), however it ends (:mod:`grader.executors.local` and
:mod:`grader.executors.dask` say how). SIGINT (Ctrl-C) and SIGTERM to the coordinator stop the
executor and raise :class:`BatchInterrupted`, which says how many submissions are graded and how
to resume. Workers ignore SIGINT: Ctrl-C reaches the terminal's whole process group, and the
coordinator decides.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from grader.assignment import Assignment
from grader.executors import Executor, WorkerPool, graded, keep, signal_handlers, unreadable_result
from grader.intake import SubmissionPath, submission_files, submission_sha256
from grader.load import package_files
from grader.pipeline import KeptRun, SubmissionGrader
from grader.report.results import RESULTS_FILE, write_result
from grader.report.terminal import RunProgress, counted
from grader.rubric import Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult, result_from_json


class BatchInterrupted(Exception):
    """SIGINT or SIGTERM stopped :func:`grade_batch`; every result that arrived before is written."""

    def __init__(self, signum: int, graded: int, total: int) -> None:
        self.signum, self.graded, self.total = signum, graded, total
        super().__init__(f"stopped by {signal.Signals(signum).name}: graded {graded} of {counted(total, 'submission')}; "
                         f"run the same command again to grade the remaining {total - graded}")

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum


class _Terminated(BaseException):
    """SIGTERM in the coordinator, raised where its main thread is (as KeyboardInterrupt for SIGINT)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


@dataclass
class BatchOutcome:
    results: list[GradeResult]
    reused: int
    internal_errors: int
    regraded: int = 0   # regraded from their kept raw outputs, nothing executed


def grade_batch(submissions: list[SubmissionPath], assignment: Assignment, sandbox: Sandbox,
                rubric: Rubric, out_dir: Path, workers: int,
                progress: TextIO = sys.stderr, executor: Executor | None = None,
                meanwhile: Callable[[Path], object] | None = None) -> BatchOutcome:
    """Grade everything not already graded with the current cache key; returns all results.
    What runs goes to ``executor`` (default: the local process pool, :class:`WorkerPool`).
    While the local pool runs submissions, ``meanwhile`` (what the caller needs next, such as
    an import) is called in a thread with a temporary folder of its own; it has returned when
    this does, and the folder is gone then: the pool's guard removes it, even after ``kill -9``.
    Raises :class:`BatchInterrupted` after SIGINT or SIGTERM, once nothing is left running, and
    :class:`BatchError` when the executor cannot go on."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # A first grading starts the pool's workers at once, so that their start (seconds: torch, the
    # checks) overlaps the coordinator's own below; a regrade decides first, as it may run nothing.
    runnable = [s for s in submissions if not s.problem]
    new = sum(1 for s in runnable if not (out_dir / s.submission_id / RESULTS_FILE).exists())
    pool = WorkerPool(assignment, sandbox, rubric, min(workers, len(runnable))) if executor is None and new else None
    helper: threading.Thread | None = None
    try:
        if pool is not None:
            pool.start(min(workers, new))
        grader = SubmissionGrader(assignment, sandbox, rubric)
        results, regrade, todo = _triage(submissions, grader, out_dir)
        reused = len(results)
        if reused:
            progress.write(f"{reused} of {counted(len(submissions), 'submission')} already graded (unchanged); "
                           "skipping them\n")
        if regrade:
            progress.write(f"{counted(len(regrade), 'submission')} regraded from their kept runs (the checks or the rubric "
                           "changed, not what runs); nothing executed for them\n")
        try:
            with signal_handlers(SIGTERM=_raise_terminated), RunProgress(progress, "grading", len(submissions),
                                                                  reused + len(regrade)) as bar:
                for submission, kept in regrade:
                    keep(graded(grader, submission, kept), out_dir, results)
                if todo and executor is None and pool is None:   # a regrade that runs some again
                    pool = WorkerPool(assignment, sandbox, rubric, min(workers, len(todo)))
                if todo and pool is not None:
                    pending = pool.submit(todo)
                    # Only now: every worker is started, so none is spawned while meanwhile runs
                    # (a thread that may change the environment a spawned process copies).
                    if meanwhile is not None:
                        folder = Path(tempfile.mkdtemp(prefix="g2c-coordinator-"))
                        pool.guard.remove(folder)
                        helper = threading.Thread(target=meanwhile, args=(folder,), name="meanwhile")
                        helper.start()
                    pool.collect(pending, out_dir, results, bar)
                elif todo and executor is not None:
                    executor(todo, assignment, sandbox, rubric, out_dir, workers, results, bar)
        except (KeyboardInterrupt, _Terminated) as exc:
            signum = signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT
            raise BatchInterrupted(signum, len(results), len(submissions)) from None
    finally:
        if helper is not None:
            helper.join()   # before the guard removes its folder
        if pool is not None:
            pool.close()
    internal = sum(1 for r in results if r.grader_errors)
    return BatchOutcome(results, reused, internal, len(regrade))


def _triage(submissions: list[SubmissionPath], grader: SubmissionGrader, out_dir: Path
            ) -> tuple[list[GradeResult], list[tuple[SubmissionPath, KeptRun]], list[SubmissionPath]]:
    """(the results that stand: unreadable submissions', written now, and unchanged ones'; the
    submissions to regrade from their kept runs; those to run)."""
    rubric = grader.rubric
    declared = package_files(grader.assignment.template)
    max_bytes = int(rubric.limits.notebook_max_mib * 2**20)
    results: list[GradeResult] = []
    regrade: list[tuple[SubmissionPath, KeptRun]] = []
    todo: list[SubmissionPath] = []
    for submission in submissions:
        if submission.problem:
            result = unreadable_result(submission, rubric, submission.problem)
            write_result(out_dir, result)
            results.append(result)
            continue
        previous = _previous_result(out_dir, submission.submission_id)
        digest = submission_sha256(submission_files(submission.path, submission.folder, declared),
                                   submission.folder, max_bytes)
        if previous is not None and previous.cache_key == grader.cache_key(digest) and not previous.grader_errors:
            results.append(previous)
        elif (kept := grader.kept_run(out_dir / submission.submission_id, digest)) is not None:
            regrade.append((submission, kept))
        else:
            todo.append(submission)
    return results, regrade, todo


def _previous_result(out_dir: Path, submission_id: str) -> GradeResult | None:
    path = out_dir / submission_id / RESULTS_FILE
    try:
        return result_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def default_workers() -> int:
    return os.cpu_count() or 1


