"""Grade a folder of submissions: discovery, parallel workers, resume, progress.

Results are written as each submission finishes. A submission whose results.json already
carries the current cache key (same notebook and package file bytes, grader version,
assignment files and limits) is not executed again, so an interrupted batch resumes where it
stopped.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from grader import __version__
from grader.assignment import Assignment
from grader.load import package_files, submission_files, submission_sha256
from grader.pipeline import GRADER_ERROR_NOTE, GRADER_ERRORS, SubmissionGrader
from grader.report.results import RESULTS_FILE, write_result
from grader.report.terminal import RunProgress
from grader.rubric import Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult, ItemResult, result_from_json, written_item


@dataclass(frozen=True)
class SubmissionPath:
    submission_id: str
    path: Path | None          # the notebook; None when there is none
    problem: str | None = None  # why the submission cannot be graded at all
    folder: Path | None = None  # a ``<id>/`` folder, which may hold package files; None for a lone notebook


def discover(paths: list[Path], package_files: Sequence[str] = ()) -> list[SubmissionPath]:
    """A notebook, or a folder of ``<id>.ipynb`` files and ``<id>/`` folders, each holding one
    notebook and/or ``package_files`` (the assignment's, relative to ``<id>/``)."""
    found: list[SubmissionPath] = []
    for path in paths:
        if path.is_file():
            found.append(SubmissionPath(path.stem, path))
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such notebook or folder")
        for entry in sorted(path.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_file() and entry.suffix == ".ipynb":
                found.append(SubmissionPath(entry.stem, entry))
            elif entry.is_dir():
                notebooks = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
                packaged = any((entry / name).is_file() for name in package_files)
                if len(notebooks) == 1 or (packaged and not notebooks):
                    found.append(SubmissionPath(entry.name, notebooks[0] if notebooks else None, folder=entry))
                else:
                    problem = ("the folder holds no .ipynb notebook" if not notebooks else
                               f"the folder holds {len(notebooks)} notebooks; submit exactly one")
                    found.append(SubmissionPath(entry.name, None, problem))
    ids = [s.submission_id for s in found]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise ValueError(f"two submissions share the id(s) {sorted(duplicates)}; rename one")
    return found


def unreadable_result(submission: SubmissionPath, rubric: Rubric, reason: str, sha256: str = "") -> GradeResult:
    """Every item at zero with one reason: for submissions the pipeline could not take."""
    items = [ItemResult(i.name, i.title, 0.0, i.points, "error", reason, list(i.tags), i.visibility)
             for i in rubric.items]
    items += [written_item(rubric, q, "error", reason) for q in rubric.questions]
    return GradeResult(submission.submission_id, rubric.assignment, __version__, sha256, items, [reason])


# Worker processes build their grader once; it is not picklable across processes.
_worker: SubmissionGrader | None = None


def _init_worker(assignment: Assignment, sandbox: Sandbox, rubric: Rubric) -> None:
    global _worker
    _worker = SubmissionGrader(assignment, sandbox, rubric)


def _grade_in_worker(submission: SubmissionPath, out_dir: Path) -> GradeResult:
    try:
        result = _worker.grade(submission.path, submission.submission_id, submission.folder)
    except Exception:  # a grader bug must not take the batch down; the traceback is kept
        detail = traceback.format_exc()
        result = unreadable_result(submission, _worker.rubric,
                                   f"{GRADER_ERROR_NOTE}, please report it (not your fault; it will be regraded)")
        result.artifacts[GRADER_ERRORS] = detail.encode()   # hidden code: beside results.json, not in it
        sys.stderr.write(f"{submission.submission_id}: {GRADER_ERROR_NOTE}, see {GRADER_ERRORS}\n")
    write_result(out_dir, result)
    return result


@dataclass
class BatchOutcome:
    results: list[GradeResult]
    reused: int
    internal_errors: int


def grade_batch(submissions: list[SubmissionPath], assignment: Assignment, sandbox: Sandbox,
                rubric: Rubric, out_dir: Path, workers: int,
                progress: TextIO = sys.stderr) -> BatchOutcome:
    """Grade everything not already graded with the current cache key; returns all results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key_for = SubmissionGrader(assignment, sandbox, rubric).cache_key
    declared = package_files(assignment.template)
    results: list[GradeResult] = []
    todo: list[SubmissionPath] = []
    for submission in submissions:
        if submission.problem:
            result = unreadable_result(submission, rubric, submission.problem)
            write_result(out_dir, result)
            results.append(result)
            continue
        previous = _previous_result(out_dir, submission.submission_id)
        digest = submission_sha256(submission_files(submission.path, submission.folder, declared))
        if (previous is not None and previous.cache_key == key_for(digest)
                and not any(GRADER_ERROR_NOTE in note for note in previous.notes)):
            results.append(previous)
        else:
            todo.append(submission)
    reused = len(results)
    if reused:
        progress.write(f"{reused} of {len(submissions)} submissions already graded (unchanged); skipping them\n")
    with RunProgress(progress, "grading", len(submissions), reused) as bar:
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
    internal = sum(1 for r in results if any(GRADER_ERROR_NOTE in n for n in r.notes))
    return BatchOutcome(results, reused, internal)


def _previous_result(out_dir: Path, submission_id: str) -> GradeResult | None:
    path = out_dir / submission_id / RESULTS_FILE
    try:
        return result_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def default_workers() -> int:
    return os.cpu_count() or 1


