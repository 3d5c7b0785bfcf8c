"""Grade a folder of submissions: discovery, parallel workers, resume, progress.

Results are written as each submission finishes. A submission whose results.json already
carries the current cache key (same notebook and package file bytes, grader version, execution
and evaluation digests, limits and isolation) is not graded again, so an interrupted batch
resumes where it stopped. One whose kept run (``SubmissionGrader.kept_run``) has the current
execution key but whose result does not (a change to the checks, the scoring or a tolerance,
or a crashed check) is regraded here, in this process, from its raw outputs: no sandbox, no pool.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from grader import __version__
from grader.assignment import Assignment
from grader.intake import SubmissionPath, submission_files, submission_sha256
from grader.load import package_files
from grader.pipeline import GRADER_ERROR_NOTE, GRADER_ERRORS, KeptRun, SubmissionGrader
from grader.report.results import RESULTS_FILE, write_result
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.sandbox import Sandbox
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


def _init_worker(assignment: Assignment, sandbox: Sandbox, rubric: Rubric) -> None:
    global _worker
    _worker = SubmissionGrader(assignment, sandbox, rubric)


def _grade_in_worker(submission: SubmissionPath, out_dir: Path) -> GradeResult:
    return _graded(_worker, submission, out_dir)


def _graded(grader: SubmissionGrader, submission: SubmissionPath, out_dir: Path,
            kept: KeptRun | None = None) -> GradeResult:
    """Grade (or, with ``kept``, regrade from its raw outputs) and write the result."""
    try:
        result = grader.grade(submission.path, submission.submission_id, submission.folder, kept)
        result.notes[:0] = submission.notes
        result.submitted_as = submission.original
    except Exception:  # a grader bug must not take the batch down; the traceback is kept
        detail = traceback.format_exc()
        result = unreadable_result(submission, grader.rubric,
                                   f"{GRADER_ERROR_NOTE}, please report it (not your fault; it will be regraded)")
        result.grader_errors = ["*"]
        result.artifacts[GRADER_ERRORS] = detail.encode()   # hidden code: beside results.json, not in it
        sys.stderr.write(f"{submission.submission_id}: {GRADER_ERROR_NOTE}, see {GRADER_ERRORS}\n")
    write_result(out_dir, result)
    return result


@dataclass
class BatchOutcome:
    results: list[GradeResult]
    reused: int
    internal_errors: int
    regraded: int = 0   # regraded from their kept raw outputs, nothing executed


def grade_batch(submissions: list[SubmissionPath], assignment: Assignment, sandbox: Sandbox,
                rubric: Rubric, out_dir: Path, workers: int,
                progress: TextIO = sys.stderr) -> BatchOutcome:
    """Grade everything not already graded with the current cache key; returns all results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    grader = SubmissionGrader(assignment, sandbox, rubric)
    declared = package_files(assignment.template)
    max_bytes = int(rubric.limits.notebook_max_mib * 2**20)
    results: list[GradeResult] = []
    todo: list[SubmissionPath] = []
    regrade: list[tuple[SubmissionPath, KeptRun]] = []
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
    reused = len(results)
    if reused:
        progress.write(f"{reused} of {len(submissions)} submissions already graded (unchanged); skipping them\n")
    if regrade:
        progress.write(f"{len(regrade)} submissions regraded from their kept runs (the checks or the rubric "
                       "changed, not what runs); nothing executed for them\n")
    results.extend(_graded(grader, submission, out_dir, kept) for submission, kept in regrade)
    with RunProgress(progress, "grading", len(submissions), reused + len(regrade)) as bar:
        if todo:
            # spawn, not fork: a forked child of a process whose torch thread pool is running deadlocks.
            with ProcessPoolExecutor(max_workers=max(1, min(workers, len(todo))), initializer=_init_worker,
                                     initargs=(assignment, sandbox, rubric),
                                     mp_context=multiprocessing.get_context("spawn")) as pool:
                pending: dict[Future, SubmissionPath] = {pool.submit(_grade_in_worker, s, out_dir): s
                                                         for s in todo}
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        pending.pop(future)
                        result = future.result()
                        results.append(result)
                        bar.advance(f"{result.submission_id}: {result.score:g}/{result.max_score:g} "
                                    f"({result.execution_time:.0f} s)")
    internal = sum(1 for r in results if r.grader_errors)
    return BatchOutcome(results, reused, internal, len(regrade))


def _previous_result(out_dir: Path, submission_id: str) -> GradeResult | None:
    path = out_dir / submission_id / RESULTS_FILE
    try:
        return result_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def default_workers() -> int:
    return os.cpu_count() or 1


