"""The local pool, ``grader grade``'s default executor: spawned worker processes on this
machine, each with its own ``SubmissionGrader``, grading one submission at a time.

Lifecycle: the workers never outlive the coordinator (the process that runs the batch),
however it ends.

* Only the coordinator writes results, as they arrive: a worker left running could never
  write one after the coordinator is gone.
* Each worker is set up by :func:`grader.executors.common.stop_with`: Ctrl-C ignored (it
  reaches the terminal's whole process group, and the coordinator decides), SIGTERM stops the
  sandbox run it is in and the worker exits without a result, and the kernel sends it SIGTERM
  when the coordinator dies (``PR_SET_PDEATHSIG``).
* A :class:`grader.sandbox.Guard`, outside the coordinator's process group, watches the
  workers: when the coordinator closes it or dies (``kill -9`` included) it sends them
  SIGTERM, SIGKILL after a grace period, and kills every process a sandbox uid left; then it
  removes the folders it was asked to (the batch's ``meanwhile`` folder).
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from grader.assignment import Assignment
from grader.executors.common import graded, record_arrival, signal_handlers, stop_with, stopped_by_sigterm
from grader.intake import SubmissionPath
from grader.pipeline import SubmissionGrader
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.sandbox import Guard, Sandbox
from grader.score import GradeResult

# Worker processes build their grader once; it is not picklable across processes.
_worker: SubmissionGrader | None = None


def _init_worker(assignment: Assignment, sandbox: Sandbox, rubric: Rubric, coordinator: int) -> None:
    global _worker
    stop_with(coordinator)
    atexit.register(exit_at_once)
    _worker = SubmissionGrader(assignment, sandbox, rubric)


def exit_at_once() -> None:
    """A worker's way out once the pool has let it go (an exit handler, run after its threads
    are joined): its output flushed, then no teardown of the interpreter. Every result has been
    sent and every sandbox run has ended by then; freeing torch's modules one by one took each
    worker about 0.3 s, which the command waited for before it wrote its pages."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _grade_in_worker(submission: SubmissionPath) -> GradeResult:
    with stopped_by_sigterm():
        return graded(_worker, submission)


def _started() -> None:
    """The task that starts a worker (its initializer does the work)."""


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
