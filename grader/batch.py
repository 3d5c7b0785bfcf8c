"""Grade a folder of submissions: discovery, parallel workers, resume, progress.

Submissions are graded on a local pool of worker processes (:class:`WorkerPool`, the default) or
on a Dask cluster (:func:`dask_executor`, ``grader grade --executor dask``, in
:mod:`grader.dask_executor`); both write each result as it arrives, through
:func:`record_arrival`.

Results are written as each submission finishes. A submission whose results.json already
carries the current cache key (same notebook and package file bytes, grader version, execution
and evaluation digests, limits and isolation) is not graded again, so an interrupted batch
resumes where it stopped. One whose kept run (``SubmissionGrader.kept_run``) has the current
execution key but whose result does not (a change to the checks, the scoring or a tolerance,
or a crashed check) is regraded here, in this process, from its raw outputs: no sandbox, no pool.

Lifecycle: the workers never outlive the coordinator (the process that calls
:func:`grade_batch`), however it ends.

* Only the coordinator writes results, as they arrive: a worker left running could never
  write one after the coordinator is gone.
* Each worker asks the kernel for SIGTERM when the coordinator dies (``PR_SET_PDEATHSIG``);
  SIGTERM stops the sandbox run it is in (the sandbox kills the run's whole tree and its
  scratch is removed) and the worker exits without a result. A Dask worker grades in a thread
  of its own, not its main one: SIGTERM raises there (:func:`_on_stop`) all the same
  (:mod:`grader.dask_executor` says how its LocalCluster's workers end with the coordinator).
* A :class:`grader.sandbox.Guard`, outside the coordinator's process group, watches the
  workers: when the coordinator closes it or dies (``kill -9`` included) it sends them
  SIGTERM, SIGKILL after a grace period, and kills every process a sandbox uid left; then it
  removes the coordinator's temporary folder (``grade_batch``'s meanwhile).
* SIGINT (Ctrl-C) and SIGTERM to the coordinator stop the pool the same way and raise
  :class:`BatchInterrupted`, which says how many submissions are graded and how to resume.
  Workers ignore SIGINT: Ctrl-C reaches the terminal's whole process group, and the
  coordinator decides.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from grader import __version__
from grader.assignment import Assignment
from grader.intake import SubmissionPath, submission_files, submission_sha256
from grader.load import package_files
from grader.pipeline import GRADER_ERROR_NOTE, GRADER_ERRORS, KeptRun, SubmissionGrader
from grader.report.executed import page_artifact
from grader.report.results import RESULTS_FILE, write_result
from grader.report.terminal import RunProgress, counted
from grader.rubric import Rubric
from grader.sandbox import Guard, Sandbox
from grader.score import GradeResult, ItemResult, result_from_json, written_item


def unreadable_result(submission: SubmissionPath, rubric: Rubric, reason: str, sha256: str = "") -> GradeResult:
    """Every item at zero with one reason: for submissions the pipeline could not take."""
    items = [ItemResult(i.name, i.title, 0.0, i.points, "error", reason, list(i.tags), i.visibility)
             for i in rubric.items]
    items += [written_item(rubric, q, "error", reason) for q in rubric.questions]
    return GradeResult(submission.submission_id, rubric.assignment, __version__, sha256, items, [reason],
                       submitted_as=submission.original)


# Worker processes build their grader once; it is not picklable across processes.
_worker: SubmissionGrader | None = None
_grading: int | None = None   # the thread inside stopped_by_sigterm (SIGTERM then cleans up before exiting)
_PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


class _Stopped(BaseException):
    """Raised in a worker by SIGTERM. Not an Exception: no ``except Exception`` of the pipeline
    may keep the worker grading."""


def _init_worker(assignment: Assignment, sandbox: Sandbox, rubric: Rubric, coordinator: int) -> None:
    global _worker
    stop_with(coordinator)
    _worker = SubmissionGrader(assignment, sandbox, rubric)


def stop_with(coordinator: int) -> None:
    """Make this worker process (in its main thread) ignore Ctrl-C, stop its grading on SIGTERM
    (:func:`stopped_by_sigterm`) and get SIGTERM when ``coordinator``, its parent, dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_stop)
    _die_with(coordinator)


def _die_with(parent: int) -> None:
    """Have the kernel send this process SIGTERM when ``parent`` (the thread that started it) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:   # it died before the signal was armed
        os._exit(1)


def _on_stop(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: the cleanup it starts runs to its end
    grading = _grading
    if grading is None:
        os._exit(1)
    if grading == threading.get_ident():
        raise _Stopped
    # Signal handlers run in the main thread; the grading thread gets _Stopped at its next bytecode
    # (the sandbox's watch loop wakes several times a second).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(grading), ctypes.py_object(_Stopped))


def _grade_in_worker(submission: SubmissionPath) -> GradeResult:
    with stopped_by_sigterm():
        return graded(_worker, submission)


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """Grade in the block, in a worker process set up by :func:`stop_with` (one submission at a
    time): SIGTERM ends the process once the block is left, cleaned up, with no result."""
    global _grading
    _grading = threading.get_ident()
    try:
        yield
    except _Stopped:
        # The sandbox run and its scratch were cleaned up on the way here; the coordinator is
        # gone or stopping and takes no result, so the submission stays ungraded.
        os._exit(1)
    finally:
        _grading = None


def graded(grader: SubmissionGrader, submission: SubmissionPath, kept: KeptRun | None = None) -> GradeResult:
    """Grade (or, with ``kept``, regrade from its raw outputs); the coordinator writes the result.
    A run that executed also brings its executed.html (a kept run's page is already written)."""
    try:
        result = grader.grade(submission.path, submission.submission_id, submission.folder, kept)
        result.notes[:0] = submission.notes
        result.submitted_as = submission.original
    except Exception:  # a grader bug must not take the batch down; the traceback is kept
        return grader_error_result(submission, grader.rubric, "please report it", traceback.format_exc())
    if kept is None:
        try:
            result.artifacts.update(page_artifact(result.artifacts, result.submission_id))
        except Exception:  # noqa: BLE001  the pages make it again, or say why they cannot
            pass
    return result


def grader_error_result(submission: SubmissionPath, rubric: Rubric, what: str, detail: str) -> GradeResult:
    """Every item at zero for an internal grader error (``what`` says more), which the next run
    grades again; ``detail`` (a traceback: hidden code) goes beside results.json, not in it."""
    result = unreadable_result(submission, rubric, f"{GRADER_ERROR_NOTE}, {what} (not your fault; it will be regraded)")
    result.grader_errors = ["*"]
    result.artifacts[GRADER_ERRORS] = detail.encode()
    sys.stderr.write(f"{submission.submission_id}: {GRADER_ERROR_NOTE}, see {GRADER_ERRORS}\n")
    return result


class BatchError(Exception):
    """The batch cannot go on (an executor that cannot start, a Dask worker running other grader
    code); every result that arrived before is written."""


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


@contextlib.contextmanager
def signal_handlers(**handlers: object) -> Iterator[None]:
    """Set signal handlers (``SIGTERM=...``) for the block, in the main thread only (where Python
    runs them); elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {name: signal.signal(getattr(signal, name), handler) for name, handler in handlers.items()}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


@dataclass
class BatchOutcome:
    results: list[GradeResult]
    reused: int
    internal_errors: int
    regraded: int = 0   # regraded from their kept raw outputs, nothing executed


#: Grades a batch's submissions that must run, writing and appending each result as it arrives
#: (through :func:`record_arrival`): ``(todo, assignment, sandbox, rubric, out_dir, workers,
#: results, bar)``, as :func:`dask_executor`'s runner (the local pool is :class:`WorkerPool`).
Executor = Callable[[list[SubmissionPath], Assignment, Sandbox, Rubric, Path, int, list[GradeResult], RunProgress],
                    None]


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
                    _keep(graded(grader, submission, kept), out_dir, results)
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


def _keep(result: GradeResult, out_dir: Path, results: list[GradeResult]) -> None:
    write_result(out_dir, result)
    result.artifacts = {}   # on disk now: the coordinator keeps no executed notebook in memory
    results.append(result)


def record_arrival(result: GradeResult, out_dir: Path, results: list[GradeResult], bar: RunProgress) -> None:
    """A result arrived from an executor: write it with its artifacts, keep it without them,
    advance the progress bar."""
    _keep(result, out_dir, results)
    bar.advance(f"{result.submission_id}: {result.score:g}/{result.max_score:g} ({result.execution_time:.0f} s)")


def dask_executor(scheduler: str | None) -> Executor:
    """The executor of ``--executor dask``: the Dask scheduler at ``scheduler``
    (``tcp://HOST:PORT``), or with None a ``LocalCluster`` of ``workers`` processes here.
    Raises :class:`BatchError` when Dask is not installed."""
    try:
        from grader import dask_executor as on_dask
    except ModuleNotFoundError as exc:
        if exc.name not in ("dask", "distributed"):
            raise
        raise BatchError(f"--executor dask needs Dask ({exc.name} is missing): pip install 'g2c-grader[dask]'") from None
    return functools.partial(on_dask.run_on_dask, scheduler=scheduler)


class WorkerPool:
    """The local pool: spawned worker processes, each with its own ``SubmissionGrader``, and the
    :class:`Guard` that stops them and their sandboxes with the coordinator. A worker starts when
    work is sent to it, or at :meth:`start`."""

    def __init__(self, assignment: Assignment, sandbox: Sandbox, rubric: Rubric, max_workers: int) -> None:
        self.guard = Guard()
        # spawn, not fork: a forked child of a process whose torch thread pool is running deadlocks.
        self.executor = ProcessPoolExecutor(max_workers=max(1, max_workers), initializer=_init_worker,
                                            initargs=(assignment, sandbox, rubric, os.getpid()),
                                            mp_context=multiprocessing.get_context("spawn"))
        self.finished = True   # nothing sent yet: nothing to stop but the workers
        self._watched: set[int] = set()

    def start(self, count: int) -> None:
        """Start ``count`` workers now: each imports torch and the checks (seconds), which then
        overlaps the coordinator's own work before it sends any."""
        for _ in range(count):
            self.executor.submit(_started)
        self._watch()

    def submit(self, todo: list[SubmissionPath]) -> dict[Future, SubmissionPath]:
        """Send ``todo`` to the workers, starting those it needs now (none is started later)."""
        self.finished = False
        pending = {self.executor.submit(_grade_in_worker, s): s for s in todo}
        self._watch()
        return pending

    def collect(self, pending: dict[Future, SubmissionPath], out_dir: Path, results: list[GradeResult],
                bar: RunProgress) -> None:
        """Write and append each result of ``pending`` as it arrives."""
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                pending.pop(future)
                record_arrival(future.result(), out_dir, results, bar)
        self.finished = True

    def _watch(self) -> None:
        # Submitting starts the workers it needs (the executor has no public list of them).
        for pid in list(self.executor._processes):
            if pid not in self._watched:
                self.guard.watch(pid)
                self._watched.add(pid)

    def close(self) -> None:
        """Stop the pool: once its workers are idle when every run it was sent finished, else at
        once, and the orphans of its sandboxes' uids swept."""
        # A second Ctrl-C must not cut the cleanup short (kill -9 still can: the guard finishes it).
        with signal_handlers(SIGINT=signal.SIG_IGN, SIGTERM=signal.SIG_IGN):
            if self.finished:
                self.executor.shutdown(wait=True)
                self.guard.close(clean=True)
            else:
                self.executor.shutdown(wait=False, cancel_futures=True)
                self.guard.close()   # the workers: SIGTERM, SIGKILL after a grace; then the sandboxes' orphans
                self.executor.shutdown(wait=True)


def _started() -> None:
    """The task that starts a worker (its initializer does the work)."""


def _previous_result(out_dir: Path, submission_id: str) -> GradeResult | None:
    path = out_dir / submission_id / RESULTS_FILE
    try:
        return result_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def default_workers() -> int:
    return os.cpu_count() or 1


