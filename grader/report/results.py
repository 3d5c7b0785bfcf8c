"""results.json per submission (written atomically, read back) and gradebook.csv.

In gradebook.csv an item still pending (a written answer awaiting review) is an empty cell,
never a 0: 0 is a score, pending is no score yet. ``total`` adds the graded items only and
``pending`` counts the items still waiting, so a row with pending items is visibly not final.
"""
from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

from grader.intake import SAFE_ID
from grader.score import GradeResult, ItemResult, result_from_json, review_state
from grader.untrusted import read_bytes

RESULTS_FILE = "results.json"
GRADEBOOK_FILE = "gradebook.csv"
MAX_RESULTS_BYTES = 64 * 2**20
# A spreadsheet evaluates a cell that starts with one of these (OWASP's CSV injection rule).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: str) -> str:
    """``value`` as a CSV cell that no spreadsheet runs: a leading formula character is
    escaped with a quote, as OWASP recommends."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def csv_row(values: list[str]) -> list[str]:
    return [csv_cell(str(v)) for v in values]


def write_result(out_dir: Path, result: GradeResult) -> Path:
    """Write DIR/<id>/results.json atomically, so an interrupted batch never leaves half a file.
    A graded result's timings get the ``report`` stage when it is first written: the time its
    artifacts (the executed notebook, the kept run...) took to write, measured before
    results.json, which holds it."""
    writing = time.monotonic()
    target = out_dir / result.submission_id / RESULTS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    for name, data in result.artifacts.items():
        (target.parent / name).write_bytes(data)
    if result.stages and all(name != "report" for name, _ in result.stages):   # a rewrite keeps the grading's
        result.stages.append(("report", round(time.monotonic() - writing, 3)))
    temporary = target.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(result.to_json(), indent=2))
    os.replace(temporary, target)  # last, so a results.json always comes with its artifacts
    return target


def read_results(out_dir: Path) -> list[GradeResult]:
    """Every readable DIR/<id>/results.json, sorted by submission id."""
    results = []
    for path in sorted(out_dir.glob(f"*/{RESULTS_FILE}")):
        if not SAFE_ID.fullmatch(path.parent.name):
            continue   # no submission folder of the grader's
        data = read_bytes(path, out_dir, MAX_RESULTS_BYTES)
        try:
            result = result_from_json(json.loads(data)) if data is not None else None
        except (ValueError, KeyError, TypeError, RecursionError):
            continue  # not ours, or damaged: skipped here, regraded by the next `grade`
        if result is not None and result.submission_id == path.parent.name:
            results.append(result)
    return results


def is_pending(item: ItemResult) -> bool:
    """Whether ``item`` has no score yet (a written answer waiting for a person or the LLM)."""
    return review_state(item).state == "waiting"


def graded_points(result: GradeResult) -> float:
    """The points of the items that have a score: what a total says before review ends."""
    return round(sum(review_state(i).counted for i in result.items), 4)


def write_gradebook(out_dir: Path, results: list[GradeResult]) -> Path:
    """One row per submission: id, total (graded points), max, pending (items without a score
    yet), then one column per item, empty where the item is pending or absent."""
    columns: list[str] = []
    for result in results:
        for item in result.items:
            if item.name not in columns:
                columns.append(item.name)
    path = out_dir / GRADEBOOK_FILE
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(csv_row(["submission_id", "total", "max", "pending"] + columns))
        for result in sorted(results, key=lambda r: r.submission_id):
            scores = {i.name: "" if is_pending(i) else f"{i.score:g}" for i in result.items}
            pending = sum(map(is_pending, result.items))
            writer.writerow(csv_row([result.submission_id, f"{graded_points(result):g}", f"{result.max_score:g}",
                                     str(pending)] + [scores.get(c, "") for c in columns]))
    return path
