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

import difflib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from grader import cells
from grader.intake import Refused, read_file
from grader.report.results import write_result
from grader.score import GradeResult

OVERRIDES_FILE = "overrides.yaml"
APPLIED_FILE = "overrides_applied.json"   # what was applied, to which notebook (sha256)
MAX_OVERRIDES_BYTES = 4 * 2**20


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
    """DIR/overrides.yaml checked against ``results``; raises OverrideError with every problem.

    The file is read as a small YAML subset with the safe loader: submission ids, each a
    mapping of item ids to a score or to ``score``/``comment``/``reviewer``. A submission that
    appears twice (two pasted review snippets) is merged; the same submission and item twice
    is refused, naming both lines. Scores are finite numbers within the item's range."""
    path = out_dir / OVERRIDES_FILE
    if not os.path.lexists(path):
        return []
    try:
        text = read_file(path, out_dir, MAX_OVERRIDES_BYTES, OVERRIDES_FILE).decode("utf-8")
        entries, problems = _entries(text)
    except (Refused, UnicodeDecodeError) as exc:
        raise OverrideError(f"{path}: {exc}") from exc
    except yaml.MarkedYAMLError as exc:
        raise OverrideError(f"{path}: not valid YAML for overrides: {_marked(exc)}") from exc
    except (yaml.YAMLError, RecursionError, MemoryError, ValueError) as exc:   # nesting past the parser's limits
        raise OverrideError(f"{path}: not valid YAML for overrides: {cells.parse_failure(exc)}") from exc
    by_id = {r.submission_id: r for r in results}
    found = []
    for line, submission_id, name, score, given, comment, reviewer in entries:
        result = by_id.get(submission_id)
        item = next((i for i in result.items if i.name == name), None) if result else None
        if result is None:
            problems.append(f"line {line}: {submission_id}: no such submission in {out_dir}"
                            + _closest(submission_id, by_id))
        elif item is None:
            problems.append(f"line {line}: {submission_id}/{name}: no such item"
                            + _closest(name, [i.name for i in result.items]))
        elif score is None:
            problems.append(f"line {line}: {submission_id}/{name}: score {given} is not a number; give one in "
                            f"[0, {item.max_score:g}]")
        elif not 0 <= score <= item.max_score:
            problems.append(f"line {line}: {submission_id}/{name}: score {given} is outside [0, {item.max_score:g}]")
        else:
            found.append(Override(submission_id, name, score, comment, reviewer))
    if problems:
        raise OverrideError(f"{path}: nothing applied, fix these first:\n  " + "\n  ".join(problems))
    return found


def _marked(exc: yaml.MarkedYAMLError) -> str:
    """A YAML error as ``line L, column C: what is wrong`` (where the parser stopped)."""
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(part for part in (exc.context, exc.problem) if part)


def _closest(name: str, known: Iterable[str]) -> str:
    """``; did you mean ...?`` with the closest known names, or nothing when none is close."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


# line, submission, item, score (None: not a usable number), the score as written, comment, reviewer
_Entry = tuple[int, str, str, "float | None", str, str, str]


def _entries(text: str) -> tuple[list[_Entry], list[str]]:
    """Every (submission, item) override of the file's text with its line, and the problems of
    its shape. Only the three levels the format has are read; nothing is constructed but
    scalars, so anchors, tags and deep nesting cost nothing."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return [], []
        if not isinstance(root, yaml.MappingNode):
            return [], ["expected submission ids at the top level"]
        entries: list[_Entry] = []
        problems: list[str] = []
        first_line: dict[tuple[str, str], int] = {}
        for key, value in root.value:
            submission_id = _text(loader, key)
            line = key.start_mark.line + 1
            if submission_id is None or not isinstance(value, yaml.MappingNode):
                problems.append(f"line {line}: expected a submission id with item ids under it")
                continue
            for item_key, entry in value.value:
                name, item_line = _text(loader, item_key), item_key.start_mark.line + 1
                if name is None:
                    problems.append(f"line {item_line}: expected an item id")
                    continue
                if (submission_id, name) in first_line:
                    problems.append(f"lines {first_line[submission_id, name]} and {item_line}: "
                                    f"{submission_id}/{name} is overridden twice; keep one")
                    continue
                first_line[submission_id, name] = item_line
                fields = dict(entry.value) if isinstance(entry, yaml.MappingNode) else None
                by_name = {_text(loader, k): v for k, v in fields.items()} if fields else {}
                score_node = by_name.get("score") if fields is not None else entry
                given = score_node.value if isinstance(score_node, yaml.ScalarNode) else "(not a single value)"
                entries.append((item_line, submission_id, name, _score(loader, score_node), _shortened(given),
                                _text(loader, by_name.get("comment")) or "", _text(loader, by_name.get("reviewer")) or ""))
        return entries, problems
    finally:
        loader.dispose()


def _shortened(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _scalar(loader: yaml.SafeLoader, node: yaml.Node | None) -> object:
    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        return loader.construct_object(node)
    except (yaml.YAMLError, ValueError, OverflowError):   # e.g. an integer past int's digit limit
        return None


def _text(loader: yaml.SafeLoader, node: yaml.Node | None) -> str | None:
    value = _scalar(loader, node)
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def _score(loader: yaml.SafeLoader, node: yaml.Node | None) -> float | None:
    """A finite number, or None (a bool, a string, a huge integer, inf and nan are not scores)."""
    value = _scalar(loader, node)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        score = float(value)
    except OverflowError:
        return None
    return score if math.isfinite(score) else None


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
        decision = {"score": override.score, "comment": override.comment, "reviewer": override.reviewer}
        # when the decision was made: kept while the same decision is applied again
        made = original.get("time") if all(original.get(k) == v for k, v in decision.items()) else None
        item.override = {"original_score": original["original_score"], "original_state": original["original_state"],
                         **decision, "notebook_sha256": result.submission_sha256,
                         "time": made or datetime.now(timezone.utc).isoformat(timespec="seconds")}
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
