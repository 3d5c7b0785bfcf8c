"""``grader grade --executor dask``: the batch's submissions graded on a Dask cluster.

The coordinator (the process running ``grader.batch.grade_batch``) stays where the submissions and the
output folder are; Dask workers, here (a ``LocalCluster``) or on other machines (a scheduler
at ``tcp://HOST:PORT``), each grade whole submissions, one at a time per thread, in their own
sandbox. Nothing is shared but the scheduler's connections:

* **Submissions travel as bytes** (:class:`Parcel`): the coordinator reads the notebook and
  the folder's declared package files (``intake.submission_files``), each only up to the
  size limit + 1 byte, as the cache digest does; the worker rebuilds them in a temporary
  folder of its own (a file past the limit as a sparse file of its real size, so that the
  refusal reads the same) and grades that.
* **Results come back as data**: the ``GradeResult`` with its artifacts as bytes. The
  coordinator writes each on arrival (``common.record_arrival``, as for the local pool) and
  keeps none of its artifacts; at most a few submissions per worker thread are in flight,
  so neither it nor the scheduler holds the class's notebooks. Resume and the cache work as
  with the pool: only the coordinator reads and writes the output folder.
* **A worker runs only the coordinator's grader**: each task carries the coordinator's
  :class:`GraderIdentity` (grader version, execution and evaluation digests, assignment
  fingerprint, isolation level). A worker builds its ``SubmissionGrader`` from its own checkout
  once per identity asked for, and refuses the task when its own
  identity differs (:class:`WorkerRefused`, as when it cannot make the coordinator's sandbox);
  the coordinator then stops the batch with a :class:`grader.executors.common.BatchError` naming what
  differs, never a grade from other code.
* **A worker lost mid-submission** (killed, out of memory, its machine gone) is Dask's to
  notice: the scheduler runs the task again elsewhere, up to ``allowed-failures`` times
  (:data:`WORKER_LOSSES_ALLOWED` on a ``LocalCluster``; a scheduler of your own keeps its own
  setting). Past that the submission gets a result saying so, marked as a grader error so
  that the next run grades it again. Each submission is one task: its result is written once.

Lifecycle (as :mod:`grader.executors.local` says for the pool): a ``LocalCluster``'s worker processes are
started with :class:`_StopWithCoordinator` (Ctrl-C ignored, SIGTERM stops the sandbox run, cleans
up and exits) and watched by a :class:`grader.sandbox.Guard`, the workers the nannies restart
too; the cluster is closed in a ``finally``, after an interrupt once the guard has stopped its
workers. When the coordinator dies (``kill -9``) each worker process exits at once (distributed
watches its parent), its bubblewrap sandbox with it (``--die-with-parent``), and the guard
sweeps the sandbox uids; the working folders of the runs cut short stay in TMPDIR, as after a
worker killed mid-submission. Workers of a scheduler of your own are services: they outlive
a coordinator, and a submission they are grading when it stops runs to its end, its result
dropped.
"""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import dask
from distributed import Client, Future, KilledWorker, LocalCluster, WorkerPlugin, get_worker, wait

from grader import __version__
from grader.assignment import Assignment
from grader.executors.common import (BatchError, graded, grader_error_result, record_arrival, signal_handlers,
                                     stop_with, stopped_by_sigterm, unreadable_result)
from grader.intake import SubmissionPath, display_name, submission_files
from grader.load import package_files
from grader.pipeline import SubmissionGrader
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.sandbox import Guard, Sandbox, SandboxUnavailable
from grader.sandbox import Limits as SandboxLimits
from grader.sandbox.factory import hidden_paths
from grader.score import GradeResult
from grader.untrusted import read_regular

#: How often the scheduler of a LocalCluster runs a submission again after losing its worker.
WORKER_LOSSES_ALLOWED = 2
#: Submissions in flight per worker thread: one graded, one waiting beside it.
IN_FLIGHT_PER_THREAD = 2
#: How often (seconds) the coordinator looks for worker processes the nannies restarted.
WATCH_INTERVAL = 1.0


@dataclass(frozen=True)
class GraderIdentity:
    """What makes two graders grade alike: a worker whose identity differs refuses the work."""

    version: str
    execution: str     # SubmissionGrader.digests
    evaluation: str
    fingerprint: str   # Assignment.fingerprint: the master's and the template's bytes
    isolation: str

    @classmethod
    def of(cls, grader: SubmissionGrader) -> GraderIdentity:
        return cls(__version__, grader.digests["execution"], grader.digests["evaluation"],
                   grader.assignment.fingerprint, grader.sandbox.isolation)

    def differences(self, other: GraderIdentity) -> list[str]:
        """``field ours vs theirs`` for each field that differs (digests shortened)."""
        def short(value: str) -> str:
            return value[:12] if len(value) == 64 else value
        return [f"{name} {short(getattr(self, name))} vs {short(getattr(other, name))}"
                for name in ("version", "execution", "evaluation", "fingerprint", "isolation")
                if getattr(self, name) != getattr(other, name)]


@dataclass(frozen=True)
class GraderSpec:
    """How a worker builds the coordinator's grader from its own checkout: the assignment by
    name, the coordinator's rubric (limits as given on the command line), its sandbox's limits
    and isolation level."""

    assignment: str
    rubric: Rubric
    limits: SandboxLimits
    isolation: str


class WorkerRefused(RuntimeError):
    """A Dask worker cannot grade as the coordinator does (another grader, no such sandbox): it
    grades nothing."""


@dataclass(frozen=True)
class Parcel:
    """One submission as bytes: its files by their paths relative to its folder (a lone
    notebook: its name), each as read (at most the size limit + 1 bytes) with its real size."""

    submission: SubmissionPath                      # as discovered: id, display name, notes
    files: tuple[tuple[str, bytes, int], ...]
    notebook: str | None                            # which of ``files`` is the notebook

    @classmethod
    def read(cls, submission: SubmissionPath, declared: list[str], max_bytes: int) -> Parcel | str:
        """The parcel of ``submission``, or why one of its files cannot be read."""
        root = submission.folder or (submission.path.parent if submission.path else None)
        files = []
        for path in submission_files(submission.path, submission.folder, declared).values():
            data, why = read_regular(path, root, max_bytes + 1, truncate=True)
            if data is None:
                return f"{display_name(str(path.relative_to(root)))} is {why}"
            files.append((str(path.relative_to(root)), data, max(len(data), os.lstat(path).st_size)))
        notebook = None if submission.path is None else str(submission.path.relative_to(root))
        return cls(submission, tuple(files), notebook)

    def unpack(self, into: Path) -> SubmissionPath:
        """The submission rebuilt under the empty folder ``into``, as the worker grades it."""
        original = self.submission
        root = into / "submission" if original.folder is not None else into
        for relative, data, size in self.files:
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if size > len(data):   # past the limit: the load refuses it by its real size, unread
                os.truncate(path, size)
        return SubmissionPath(original.submission_id, None if self.notebook is None else root / self.notebook,
                              folder=root if original.folder is not None else None,
                              original=original.original, notes=original.notes)


# ----------------------------------------------------------------------------- on a worker

# Built once per worker process and identity asked for: (the grader, its own identity).
_graders: dict[GraderIdentity, tuple[SubmissionGrader, GraderIdentity]] = {}


def _grader_for(spec: GraderSpec, wanted: GraderIdentity) -> SubmissionGrader:
    if wanted not in _graders:
        assignment = Assignment(spec.assignment)
        try:
            sandbox = Sandbox(spec.limits, isolation=spec.isolation, allow_unsandboxed=spec.isolation == "none",
                              protected_paths=hidden_paths(assignment))   # its own files, as grade protects them
        except SandboxUnavailable as exc:
            raise WorkerRefused(f"the Dask worker {get_worker().address} cannot run the coordinator's "
                                f"{spec.isolation} sandbox: {exc}") from None
        grader = SubmissionGrader(assignment, sandbox, spec.rubric)
        _graders[wanted] = grader, GraderIdentity.of(grader)
    grader, own = _graders[wanted]
    if own != wanted:
        raise WorkerRefused(f"the Dask worker {get_worker().address} runs another grader than the coordinator "
                            f"(coordinator vs worker: {'; '.join(wanted.differences(own))}); install the same "
                            "grader checkout, assignment and libraries on every worker machine")
    return grader


def grade_parcel(spec: GraderSpec, wanted: GraderIdentity, parcel: Parcel) -> GradeResult:
    """The Dask task: grade one submission, sent as bytes, with the coordinator's grader."""
    grader = _grader_for(spec, wanted)
    with stopped_by_sigterm(), tempfile.TemporaryDirectory(prefix="g2c-parcel-") as folder:
        return graded(grader, parcel.unpack(Path(folder)))


class _StopWithCoordinator(WorkerPlugin):
    """On a LocalCluster's worker process: what ``common.stop_with`` sets up for a pool worker."""

    name = "g2c-stop-with-coordinator"

    def setup(self, worker: object) -> None:
        stop_with(os.getppid())   # the coordinator, whose nannies started this process


# ----------------------------------------------------------------------------- the coordinator

def run_on_dask(todo: list[SubmissionPath], assignment: Assignment, sandbox: Sandbox, rubric: Rubric,
                out_dir: Path, workers: int, results: list[GradeResult], bar: RunProgress, *,
                scheduler: str | None) -> None:
    """Grade ``todo`` on the Dask scheduler at ``scheduler``, or on a LocalCluster of ``workers``
    processes (1 thread each) when it is None, writing and appending each result as it arrives.
    However this ends, no LocalCluster process or sandbox of it is left running."""
    grader = SubmissionGrader(assignment, sandbox, rubric)
    spec = GraderSpec(assignment.name, rubric, sandbox.limits, sandbox.isolation)
    wanted = GraderIdentity.of(grader)
    declared = package_files(assignment.template)
    max_bytes = int(rubric.limits.notebook_max_mib * 2**20)
    guard = Guard() if scheduler is None else None
    scratch = tempfile.TemporaryDirectory(prefix="g2c-dask-") if scheduler is None else None
    cluster: LocalCluster | None = None
    client: Client | None = None
    finished = False
    try:
        if scheduler is None:
            # Its scheduler's and workers' folders in ours, removed when it closes.
            with dask.config.set({"distributed.scheduler.allowed-failures": WORKER_LOSSES_ALLOWED,
                                  "temporary-directory": scratch.name}):
                cluster = LocalCluster(n_workers=max(1, min(workers, len(todo))), threads_per_worker=1,
                                       processes=True, host="127.0.0.1", dashboard_address=None,
                                       memory_limit=0,   # the sandbox bounds memory; a nanny must not
                                       silence_logs=logging.CRITICAL)
        try:
            client = Client(cluster or scheduler, set_as_default=False)
        except OSError as exc:
            raise BatchError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        watched: set[int] = set()
        if cluster is not None:
            client.register_plugin(_StopWithCoordinator())
            _watch_workers(cluster, guard, watched)
        queue = iter(todo)
        pending: dict[Future, SubmissionPath] = {}

        def fill() -> None:
            """Send submissions until each worker thread (as many as are connected now) has
            IN_FLIGHT_PER_THREAD; one whose files cannot be read gets its result here."""
            slots = IN_FLIGHT_PER_THREAD * max(1, sum(client.nthreads().values()))
            while len(pending) < slots and (submission := next(queue, None)) is not None:
                parcel = Parcel.read(submission, declared, max_bytes)
                if isinstance(parcel, str):
                    record_arrival(unreadable_result(submission, rubric, parcel), out_dir, results, bar)
                    continue
                future = client.submit(grade_parcel, spec, wanted, parcel, pure=False,
                                       key=f"grade-{submission.submission_id}-{os.urandom(4).hex()}")
                pending[future] = submission

        fill()
        with client.as_current():   # whom distributed.wait asks
            while pending:
                for future in _arrived(pending):
                    submission = pending.pop(future)
                    result = _result(future, submission, rubric)
                    future.release()   # the scheduler and the worker drop it too
                    record_arrival(result, out_dir, results, bar)
                fill()
                if cluster is not None:   # a worker process a nanny restarted is watched too
                    _watch_workers(cluster, guard, watched)
        finished = True
    finally:
        # A second Ctrl-C must not cut the cleanup short (kill -9 still can: the guard finishes it).
        with signal_handlers(SIGINT=signal.SIG_IGN, SIGTERM=signal.SIG_IGN):
            if cluster is not None and not finished:
                # Closing a nanny ends its worker process at once (distributed's own watch), before
                # the sandbox run is cleaned up; SIGTERM first lets each stop its run, and exit.
                for nanny in cluster.workers.values():
                    nanny.auto_restart = False
                guard.close()   # SIGTERM, SIGKILL after a grace, then the sandboxes' orphans
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
            if guard is not None and finished:
                guard.close(clean=True)
            if scratch is not None:
                scratch.cleanup()


def _arrived(pending: dict[Future, SubmissionPath]) -> set[Future]:
    """The futures done within :data:`WATCH_INTERVAL` (maybe none)."""
    try:
        return wait(list(pending), timeout=WATCH_INTERVAL, return_when="FIRST_COMPLETED").done
    except TimeoutError:
        return set()


def _watch_workers(cluster: LocalCluster, guard: Guard, watched: set[int]) -> None:
    """Have ``guard`` watch each of the cluster's worker processes not watched yet. Their pids
    come from the nannies here: not ``client.run(os.getpid)``, whose handling parses the builtin's
    signature with ``ast`` in the worker's main thread, and this project's CPython (3.11.7) shares
    the AST parser's recursion count between threads (gh-106905): the grading thread's
    ``ast.parse`` could then fail with "AST constructor recursion depth mismatch"."""
    for nanny in list(cluster.workers.values()):
        pid = nanny.pid
        if pid is not None and pid not in watched:
            guard.watch(pid)
            watched.add(pid)


def _result(future: Future, submission: SubmissionPath, rubric: Rubric) -> GradeResult:
    """The task's result. A worker that refused it stops the batch; a submission whose workers
    kept dying, or whose task failed outside the pipeline, gets a grader error (graded again on
    the next run)."""
    try:
        return future.result()
    except WorkerRefused as exc:
        raise BatchError(str(exc)) from None
    except KilledWorker:
        return grader_error_result(submission, rubric, "the Dask workers grading it were lost too often",
                                   traceback.format_exc())
    except Exception:
        return grader_error_result(submission, rubric, "please report it", traceback.format_exc())
