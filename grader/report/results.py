"""results.json per submission (written atomically, read back) and gradebook.csv."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from grader.score import GradeResult, result_from_json

RESULTS_FILE = "results.json"
GRADEBOOK_FILE = "gradebook.csv"


def write_result(out_dir: Path, result: GradeResult) -> Path:
    """Write DIR/<id>/results.json atomically, so an interrupted batch never leaves half a file."""
    target = out_dir / result.submission_id / RESULTS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    for name, data in result.artifacts.items():
        (target.parent / name).write_bytes(data)
    temporary = target.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(result.to_json(), indent=2))
    os.replace(temporary, target)  # last, so a results.json always comes with its artifacts
    return target


def read_results(out_dir: Path) -> list[GradeResult]:
    """Every readable DIR/<id>/results.json, sorted by submission id."""
    results = []
    for path in sorted(out_dir.glob(f"*/{RESULTS_FILE}")):
        try:
            results.append(result_from_json(json.loads(path.read_text())))
        except (ValueError, KeyError):
            continue  # not ours, or damaged: skipped here, regraded by the next `grade`
    return results


def write_gradebook(out_dir: Path, results: list[GradeResult]) -> Path:
    """One row per submission: id, total, max, then one column per item."""
    columns: list[str] = []
    for result in results:
        for item in result.items:
            if item.name not in columns:
                columns.append(item.name)
    path = out_dir / GRADEBOOK_FILE
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission_id", "total", "max"] + columns)
        for result in sorted(results, key=lambda r: r.submission_id):
            scores = {i.name: i.score for i in result.items}
            writer.writerow([result.submission_id, f"{result.score:g}", f"{result.max_score:g}"]
                            + [f"{scores[c]:g}" if c in scores else "" for c in columns])
    return path
