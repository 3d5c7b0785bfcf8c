"""Stage 6, report: results.json per submission, gradebook.csv and the terminal table.

Everything is rebuilt from the ``results.json`` files in the output folder, so ``grader
report DIR`` can re-render after a TA edits ``DIR/overrides.yaml``:

    alice:                      # submission id
      written_ex5_memory_bill: 3   # item name: new score (clamped to the item's points)
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import yaml

from grader.score import GradeResult, result_from_json

RESULTS_FILE = "results.json"
GRADEBOOK_FILE = "gradebook.csv"
OVERRIDES_FILE = "overrides.yaml"


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
    results = []
    for path in sorted(out_dir.glob(f"*/{RESULTS_FILE}")):
        try:
            results.append(result_from_json(json.loads(path.read_text())))
        except (ValueError, KeyError):
            continue  # not ours, or damaged: skipped here, regraded by the next `grade`
    return results


def apply_overrides(results: list[GradeResult], out_dir: Path) -> list[str]:
    """Apply DIR/overrides.yaml in place; returns what it changed (or could not)."""
    path = out_dir / OVERRIDES_FILE
    if not path.is_file():
        return []
    overrides = yaml.safe_load(path.read_text()) or {}
    log = []
    by_id = {r.submission_id: r for r in results}
    for submission_id, items in overrides.items():
        result = by_id.get(str(submission_id))
        if result is None or not isinstance(items, dict):
            log.append(f"override for unknown submission {submission_id!r} ignored")
            continue
        for name, score in items.items():
            item = next((i for i in result.items if i.name == name), None)
            if item is None:
                log.append(f"override {submission_id}/{name}: no such item")
                continue
            item.score = max(0.0, min(float(score), item.max_score))
            item.status = "passed" if item.score == item.max_score else "failed"
            item.output += f"\n[score set to {item.score:g} by a TA override]"
            log.append(f"{submission_id}/{name} -> {item.score:g}")
    return log


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


def summary_table(results: list[GradeResult]) -> str:
    """A plain-text table for the terminal: score, failed items, pending written answers."""
    if not results:
        return "no submissions graded"
    width = max(len("submission"), *(len(r.submission_id) for r in results))
    lines = [f"{'submission':<{width}}  {'score':>13}  not passed"]
    for result in sorted(results, key=lambda r: r.submission_id):
        failed = [i.name for i in result.items if i.status in ("failed", "error")]
        pending = sum(1 for i in result.items if i.status == "pending_review")
        shown = ", ".join(failed[:6]) + (f" (+{len(failed) - 6} more)" if len(failed) > 6 else "")
        extra = f"{'; ' if shown else ''}{pending} written pending review" if pending else ""
        lines.append(f"{result.submission_id:<{width}}  {result.score:>6g} / {result.max_score:<4g}  "
                     f"{shown or ('-' if not extra else '')}{extra}")
    return "\n".join(lines)
