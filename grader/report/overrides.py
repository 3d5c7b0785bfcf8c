"""TA overrides: ``DIR/overrides.yaml`` checked, applied to the results, and audited.

``grader report DIR`` re-renders everything after a TA edits ``DIR/overrides.yaml``:

    alice:                               # submission id
      written_ex5_memory_bill:           # item id
        score: 3
        comment: derivation is right, units were in the table
        reviewer: jdoe
      notebook_runs: 2                   # a bare number is a score with no comment

Overrides are checked first (unknown submission or item, a score outside the item's range:
nothing is applied and every problem is reported). Each applied override rewrites the item in
results.json and keeps the original score beside it, with the notebook's sha256, in the item's
``extra_data`` and in ``DIR/overrides_applied.json``. When a later ``grader grade`` regrades a
notebook that changed since its review, the override is not applied and is reported instead;
the TA's file is never edited.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from grader.report.results import write_result
from grader.score import GradeResult

OVERRIDES_FILE = "overrides.yaml"
APPLIED_FILE = "overrides_applied.json"   # what was applied, to which notebook (sha256)


class OverrideError(ValueError):
    """DIR/overrides.yaml names something that does not exist or a score out of range."""


@dataclass(frozen=True)
class Override:
    submission_id: str
    item: str
    score: float
    comment: str = ""
    reviewer: str = ""


def read_overrides(out_dir: Path, results: list[GradeResult]) -> list[Override]:
    """DIR/overrides.yaml checked against ``results``; raises OverrideError with every problem."""
    path = out_dir / OVERRIDES_FILE
    if not path.is_file():
        return []
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise OverrideError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise OverrideError(f"{path}: expected submission ids at the top level")
    by_id = {r.submission_id: r for r in results}
    found, problems = [], []
    for submission_id, entries in raw.items():
        result = by_id.get(str(submission_id))
        if result is None or not isinstance(entries, dict):
            problems.append(f"{submission_id}: no such submission in {out_dir}" if result is None
                            else f"{submission_id}: expected item ids under it")
            continue
        for name, entry in entries.items():
            item = next((i for i in result.items if i.name == name), None)
            entry = entry if isinstance(entry, dict) else {"score": entry}
            score = entry.get("score")
            if item is None:
                problems.append(f"{submission_id}/{name}: no such item")
            elif not isinstance(score, (int, float)) or isinstance(score, bool) or not 0 <= score <= item.max_score:
                problems.append(f"{submission_id}/{name}: score {score!r} is not a number in [0, {item.max_score:g}]")
            else:
                found.append(Override(str(submission_id), str(name), float(score), str(entry.get("comment", "")),
                                      str(entry.get("reviewer", ""))))
    if problems:
        raise OverrideError(f"{path}: nothing applied, fix these first:\n  " + "\n  ".join(problems))
    return found


def apply_overrides(results: list[GradeResult], out_dir: Path) -> list[str]:
    """Apply DIR/overrides.yaml to ``results`` and their results.json; returns what it did.
    Raises OverrideError (and applies nothing) when the file names something wrong."""
    overrides = read_overrides(out_dir, results)
    applied_path = out_dir / APPLIED_FILE
    try:
        ledger = json.loads(applied_path.read_text())
    except (OSError, ValueError):
        ledger = {}
    by_id = {r.submission_id: r for r in results}
    log, changed = [], {}
    for override in overrides:
        result = by_id[override.submission_id]
        item = next(i for i in result.items if i.name == override.item)
        before = ledger.get(override.submission_id, {}).get(override.item)
        if before and before["notebook_sha256"] != result.submission_sha256:
            log.append(f"{override.submission_id}/{override.item}: NOT applied, the notebook changed since the "
                       f"review (reviewed {before['notebook_sha256'][:12]}, now {result.submission_sha256[:12]}); "
                       "review it again and update overrides.yaml")
            continue
        original = item.override or {"original_score": item.score, "original_state": item.status}
        item.override = {"original_score": original["original_score"], "original_state": original["original_state"],
                         "score": override.score, "comment": override.comment, "reviewer": override.reviewer,
                         "notebook_sha256": result.submission_sha256}
        item.score = override.score
        item.status = "passed" if item.score == item.max_score else "failed"
        ledger.setdefault(override.submission_id, {})[override.item] = item.override
        changed[result.submission_id] = result
        log.append(f"{override.submission_id}/{override.item} -> {item.score:g} "
                   f"(was {original['original_score']:g})")
    for result in changed.values():
        write_result(out_dir, result)
    if changed:
        applied_path.write_text(json.dumps(ledger, indent=2))
    return log
