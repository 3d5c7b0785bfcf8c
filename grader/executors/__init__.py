"""Where a batch's submissions run: the interface the batch calls, and its two executors.

* :class:`WorkerPool` (:mod:`grader.executors.local`, the default): spawned worker processes on
  this machine, started early so that their start overlaps the coordinator's own work.
* :func:`dask_executor` (:mod:`grader.executors.dask`, ``grader grade --executor dask``): a Dask
  cluster, here (a ``LocalCluster``) or at a scheduler's address; Dask is imported only then.

Both grade each submission with the pipeline (``SubmissionGrader``) in a worker that stops with
the coordinator, and hand each result back to the coordinator, which alone writes it as it
arrives (:func:`record_arrival`): what they share is :mod:`grader.executors.common`. Nothing
here imports the command line; the sandbox a worker grades in comes from
:mod:`grader.sandbox.factory`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from grader.assignment import Assignment
from grader.executors.common import (BatchError, grader_error_result, graded, keep, record_arrival, signal_handlers,
                                     stop_with, stopped_by_sigterm, unreadable_result)
from grader.executors.local import WorkerPool
from grader.intake import SubmissionPath
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult

__all__ = ["BatchError", "Executor", "WorkerPool", "dask_executor", "graded", "grader_error_result", "keep",
           "record_arrival", "signal_handlers", "stop_with", "stopped_by_sigterm", "unreadable_result"]

#: Grades a batch's submissions that must run, writing and appending each result as it arrives
#: (through :func:`record_arrival`): ``(todo, assignment, sandbox, rubric, out_dir, workers,
#: results, bar)``, as :func:`dask_executor`'s runner (the local pool is :class:`WorkerPool`).
Executor = Callable[[list[SubmissionPath], Assignment, Sandbox, Rubric, Path, int, list[GradeResult], RunProgress],
                    None]


def dask_executor(scheduler: str | None) -> Executor:
    """The executor of ``--executor dask``: the Dask scheduler at ``scheduler``
    (``tcp://HOST:PORT``), or with None a ``LocalCluster`` of ``workers`` processes here.
    Raises :class:`BatchError` when Dask is not installed."""
    try:
        from grader.executors import dask as on_dask
    except ModuleNotFoundError as exc:
        if exc.name not in ("dask", "distributed"):
            raise
        raise BatchError(f"--executor dask needs Dask ({exc.name} is missing): pip install 'g2c-grader[dask]'") from None
    return functools.partial(on_dask.run_on_dask, scheduler=scheduler)
