"""Gradebook exports for an LMS: Canvas's gradebook import CSV.

The roster (a CSV the instructor writes once per course) maps each submission id to the
student's Canvas fields::

    submission_id,Student,ID,SIS User ID,SIS Login ID,Section
    alice,"Liddell, Alice",40112,A0011,aliddell,L01

The export has Canvas's own columns (Student, ID, SIS User ID, SIS Login ID, Section), then
one column for the assignment whose header is Canvas's "Name (assignment id)", given on the
command line, and Canvas's "Points Possible" row under the header. Scores are the totals
after TA overrides. Nobody is dropped silently: submissions missing from the roster and
roster students without a submission are returned (and printed by the CLI); the latter get
an empty cell, which Canvas leaves as it was.

Canvas reads a score cell as a number or leaves the grade unchanged when it is empty, and any
extra column would become an assignment, so a pending mark cannot travel in the file: a
total that still waits for review of written answers is exported as its graded points (a
number, as gradebook.csv's ``total``), and the outcome lists those submissions
(``pending_review``) for the CLI to say how many totals are not final yet.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from grader.report.results import csv_row, graded_points, is_pending
from grader.score import GradeResult

CANVAS_FIELDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
ROSTER_ID = "submission_id"
CANVAS_COLUMN = re.compile(r".+ \(\d+\)$")   # "Homework 3 (12345)"


class ExportError(ValueError):
    """The roster or the column header is unusable: nothing was written."""


@dataclass
class ExportOutcome:
    path: Path
    exported: int = 0
    not_in_roster: list[str] = field(default_factory=list)     # graded, but no roster row
    no_submission: list[str] = field(default_factory=list)     # roster students with no result
    pending_review: list[str] = field(default_factory=list)    # exported totals still missing written points


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """submission id -> the student's Canvas fields; raises ExportError naming what is wrong."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in (ROSTER_ID, *CANVAS_FIELDS) if c not in (reader.fieldnames or [])]
            if missing:
                raise ExportError(f"{path}: the roster needs the columns {', '.join(missing)} "
                                  f"(expected: {ROSTER_ID}, {', '.join(CANVAS_FIELDS)})")
            rows = list(reader)
    except OSError as exc:
        raise ExportError(f"{path}: cannot read the roster: {exc}") from exc
    roster: dict[str, dict[str, str]] = {}
    for line, row in enumerate(rows, start=2):
        submission_id = (row.get(ROSTER_ID) or "").strip()
        if not submission_id:
            raise ExportError(f"{path}, line {line}: empty {ROSTER_ID}")
        if submission_id in roster:
            raise ExportError(f"{path}, line {line}: {ROSTER_ID} {submission_id!r} appears twice")
        roster[submission_id] = {c: (row.get(c) or "").strip() for c in CANVAS_FIELDS}
    return roster


def export_canvas(results: list[GradeResult], roster_path: Path, column: str, target: Path) -> ExportOutcome:
    """Write Canvas's gradebook import CSV for ``results`` to ``target``."""
    if not CANVAS_COLUMN.match(column):
        raise ExportError(f"the assignment column must be Canvas's header, 'Name (assignment id)', "
                          f"e.g. 'Homework 3 (12345)'; got {column!r}")
    roster = read_roster(roster_path)
    by_id = {r.submission_id: r for r in results}
    outcome = ExportOutcome(target, not_in_roster=sorted(set(by_id) - set(roster)),
                            no_submission=sorted(set(roster) - set(by_id)))
    points_possible = max((r.max_score for r in results), default=0)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(csv_row([*CANVAS_FIELDS, column]))
        writer.writerow(["    Points Possible", "", "", "", "", f"{points_possible:g}"])
        for submission_id, student in sorted(roster.items(), key=lambda kv: kv[1]["Student"]):
            result = by_id.get(submission_id)
            writer.writerow(csv_row([*(student[c] for c in CANVAS_FIELDS), f"{graded_points(result):g}" if result else ""]))
            if result:
                outcome.exported += 1
                if any(map(is_pending, result.items)):
                    outcome.pending_review.append(submission_id)
    return outcome
