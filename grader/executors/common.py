"""What the local pool and Dask share: the worker's side of a submission's grading and its
lifecycle, and the coordinator's side of a result's arrival.

On a worker (a pool process, or a Dask worker's grading thread):

* :func:`stop_with` makes the process ignore Ctrl-C, stop its grading on SIGTERM and get SIGTERM
  when the coordinator, its parent, dies (``PR_SET_PDEATHSIG``); :func:`stopped_by_sigterm` is
  the block in which SIGTERM stops the grading (the sandbox kills the run's whole tree and its
  scratch is removed) and the process then exits without a result. A Dask worker grades in a
  thread of its own, not its main one: SIGTERM raises there (:func:`_on_stop`) all the same.
* :func:`graded` grades one submission; a grader bug becomes a result
  (:func:`grader_error_result`), never a lost batch.

On the coordinator: :func:`record_arrival` writes each result as it arrives, with its artifacts,
and keeps it without them; :func:`signal_handlers` sets the handlers of a block (a second Ctrl-C
must not cut a cleanup short); :class:`BatchError` says the batch cannot go on.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from grader import __version__
from grader.intake import SubmissionPath
from grader.pipeline import GRADER_ERROR_NOTE, GRADER_ERRORS, KeptRun, SubmissionGrader
from grader.report.executed import page_artifact
from grader.report.results import write_result
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.score import GradeResult, ItemResult, written_item


class BatchError(Exception):
    """The batch cannot go on (an executor that cannot start, a Dask worker running other grader
    code); every result that arrived before is written."""


# ----------------------------------------------------------------------------- results

def unreadable_result(submission: SubmissionPath, rubric: Rubric, reason: str, sha256: str = "") -> GradeResult:
    """Every item at zero with one reason: for submissions the pipeline could not take."""
    items = [ItemResult(i.name, i.title, 0.0, i.points, "error", reason, list(i.tags), i.visibility)
             for i in rubric.items]
    items += [written_item(rubric, q, "error", reason) for q in rubric.questions]
    return GradeResult(submission.submission_id, rubric.assignment, __version__, sha256, items, [reason],
                       submitted_as=submission.original)


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


def keep(result: GradeResult, out_dir: Path, results: list[GradeResult]) -> None:
    """Write ``result`` with its artifacts and append it to ``results`` without them."""
    write_result(out_dir, result)
    result.artifacts = {}   # on disk now: the coordinator keeps no executed notebook in memory
    results.append(result)


def record_arrival(result: GradeResult, out_dir: Path, results: list[GradeResult], bar: RunProgress) -> None:
    """A result arrived from an executor: write it with its artifacts, keep it without them,
    advance the progress bar."""
    keep(result, out_dir, results)
    bar.advance(f"{result.submission_id}: {result.score:g}/{result.max_score:g} ({result.execution_time:.0f} s)")


# ----------------------------------------------------------------------------- a worker's lifecycle

_grading: int | None = None   # the thread inside stopped_by_sigterm (SIGTERM then cleans up before exiting)
_PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


class _Stopped(BaseException):
    """Raised in a worker by SIGTERM. Not an Exception: no ``except Exception`` of the pipeline
    may keep the worker grading."""


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
