"""Score changes across regrades, so a TA can answer "why did my score change".

``grader grade`` into a folder that already holds results compares each submission's final
items (after written answers and overrides) with what the folder held before, and appends
every difference to ``DIR/score_changes.json``: when, which grader versions, whether the
notebook itself changed, and old -> new per item. The summary page lists them.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grader.score import GradeResult

CHANGES_FILE = "score_changes.json"


def score_changes(before: GradeResult, after: GradeResult) -> dict[str, Any] | None:
    """old -> new for every item whose score differs (None when nothing changed)."""
    old = {i.name: i for i in before.items}
    items = []
    for item in after.items:
        previous = old.get(item.name)
        if previous is None or previous.score != item.score:
            items.append({"id": item.name, "title": item.title,
                          "old": previous.score if previous else None, "new": item.score})
    items += [{"id": name, "title": i.title, "old": i.score, "new": None}
              for name, i in old.items() if name not in {j.name for j in after.items}]
    if not items:
        return None
    return {"submission_id": after.submission_id, "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "old_total": before.score, "new_total": after.score,
            "old_grader_version": before.grader_version, "new_grader_version": after.grader_version,
            "notebook_changed": before.submission_sha256 != after.submission_sha256, "items": items}


def record_changes(out_dir: Path, before: dict[str, GradeResult], after: list[GradeResult]) -> list[dict[str, Any]]:
    """Append the changes between ``before`` (by submission id) and ``after``; returns them."""
    found = [change for result in after if result.submission_id in before
             for change in [score_changes(before[result.submission_id], result)] if change]
    if found:
        path = out_dir / CHANGES_FILE
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(read_changes(out_dir) + found, indent=2))
        os.replace(temporary, path)
    return found


def read_changes(out_dir: Path) -> list[dict[str, Any]]:
    """Every recorded change, oldest first (empty when none was recorded or the file is damaged)."""
    try:
        changes = json.loads((out_dir / CHANGES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return changes if isinstance(changes, list) else []
