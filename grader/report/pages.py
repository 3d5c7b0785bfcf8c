"""HTML pages: ``DIR/<id>/report.html`` for the student, ``review.html`` and ``DIR/summary.html`` for TAs.

Every page is one self-contained file (inline CSS, plots as inline SVG made by matplotlib),
so it opens from disk, from a zip or from an LMS attachment with no network. Pages are
rebuilt from what the output folder holds (results.json, the executed notebook, the written
answers, the usage and audit files), so ``grader report DIR`` re-renders them after overrides.

What a student's page leaves out, on purpose: items whose visibility is not released yet
(``--release``), internal grader tracebacks (they show hidden check code), and the probe's
inputs (item messages say what differed and where, never the hidden weights or tokens).
A TA's ``review.html`` shows every item and the exact ``overrides.yaml`` lines that would
confirm or change each one.
"""
from __future__ import annotations

import atexit
import io
import json
import os
import re
import shutil
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import markupsafe


def _private_matplotlib_config() -> None:
    """matplotlib caches its font list in ~/.cache and ~/.config when it is imported: a grader
    run leaves nothing outside its output folder, so the cache lives in a temporary folder
    removed at exit (unless MPLCONFIGDIR says otherwise)."""
    if "MPLCONFIGDIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="g2c-matplotlib-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ["MPLCONFIGDIR"] = folder


_private_matplotlib_config()
from matplotlib.figure import Figure  # noqa: E402  (after the config folder is chosen)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from grader import cells
from grader.assignment import Assignment
from grader.intake import SAFE_ID
from grader.pipeline import EXECUTED_NOTEBOOK, GRADER_ERRORS
from grader.report.changes import read_changes
from grader.report.executed import write_executed_page
from grader.report.integrity import similar_pairs
from grader.report.overrides import OVERRIDES_FILE
from grader.rubric import WRITTEN_TAG
from grader.score import GradeResult, ItemResult
from grader.written import USAGE_FILE, WRITTEN_INPUTS

REPORT_PAGE = "report.html"
REVIEW_PAGE = "review.html"
SUMMARY_PAGE = "summary.html"

# Which visibilities a student sees, by how far the course has released grades.
RELEASES = {"none": ("visible",), "due": ("visible", "after_due_date"),
            "published": ("visible", "after_due_date", "after_published")}
MAX_TRACEBACK_CHARS = 3000
MAX_STREAM_CHARS = 2000
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A number standing alone (not the 64 of float64 or the 1 of ex1), for grouping messages.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", re.IGNORECASE)
MAX_MESSAGE_CHARS = 200

_templates = jinja2.Environment(loader=jinja2.PackageLoader("grader.report", "templates"),
                                autoescape=True, undefined=jinja2.StrictUndefined,
                                trim_blocks=True, lstrip_blocks=True)


def _review_anchor(submission_id: str, anchor: str = "") -> markupsafe.Markup:
    """The id linking to its review page (escaped; plain text when it cannot be a safe link)."""
    link = page_link(submission_id, REVIEW_PAGE, anchor)
    if not link:
        return markupsafe.escape(submission_id)
    return markupsafe.Markup('<a href="{}">{}</a>').format(link, submission_id)


_templates.globals["review_anchor"] = _review_anchor


@dataclass
class CellProblem:
    """One executed cell that raised: where, what, and what it printed (truncated)."""

    index: int
    error: str
    traceback: str
    printed: str


@dataclass
class QueueEntry:
    """One thing a person should look at, with the overrides.yaml lines that settle it."""

    submission_id: str
    item: str
    title: str
    reason: str
    score: float
    max_score: float
    yaml: str


def write_pages(out_dir: Path, results: list[GradeResult], release: str = "none") -> list[Path]:
    """report.html and review.html for every result (and executed.html when its folder holds
    the executed notebook), then summary.html for the batch."""
    if release not in RELEASES:
        raise ValueError(f"release must be one of {sorted(RELEASES)}, not {release!r}")
    pages = []
    for result in results:
        folder = out_dir / result.submission_id
        folder.mkdir(parents=True, exist_ok=True)
        context = _submission_context(folder, result)
        executed, executed_note = write_executed_page(folder)   # linked from the TA's page only
        pages += [executed] if executed else []
        for name, audience, shown in ((REPORT_PAGE, "student", RELEASES[release]),
                                      (REVIEW_PAGE, "ta", None)):
            html = _templates.get_template("report.html.j2").render(
                audience=audience, release=release, executed=executed.name if executed else "",
                executed_note=executed_note, **context, **_items_context(result, shown))
            (folder / name).write_text(html)
            pages.append(folder / name)
    summary = out_dir / SUMMARY_PAGE
    summary.write_text(_templates.get_template("summary.html.j2").render(**summary_context(out_dir, results)))
    pages.append(summary)
    return pages


def _submission_context(folder: Path, result: GradeResult) -> dict[str, Any]:
    return {"result": result, "problems": cell_problems(folder / EXECUTED_NOTEBOOK),
            "answers": _answers(folder), "generated": _now()}


def _items_context(result: GradeResult, shown: tuple[str, ...] | None) -> dict[str, Any]:
    items = [i for i in result.items if shown is None or i.visibility in shown]
    withheld = [i for i in result.items if i not in items]
    return {"items": items, "checks": [i for i in items if WRITTEN_TAG not in i.tags],
            "written": [i for i in items if WRITTEN_TAG in i.tags],
            "shown_score": round(sum(i.score for i in items), 4),
            "shown_max": round(sum(i.max_score for i in items), 4),
            "withheld": len(withheld), "withheld_max": round(sum(i.max_score for i in withheld), 4),
            "override_lines": {i.name: override_lines(result.submission_id, i) for i in items}}


def cell_problems(executed: Path) -> list[CellProblem]:
    """Cells of the executed notebook that raised, in order (empty when there is no notebook).

    The notebook was written inside the sandbox: it is read as data, capped, and escaped by
    the template like everything else."""
    try:
        notebook = json.loads(executed.read_text())
    except (OSError, ValueError):
        return []
    found = []
    for index, cell in enumerate(notebook.get("cells", []) if isinstance(notebook, dict) else []):
        outputs = cell.get("outputs", []) if isinstance(cell, dict) else []
        errors = [o for o in outputs if isinstance(o, dict) and o.get("output_type") == "error"]
        if not errors:
            continue
        error = errors[0]
        printed = "".join(_text(o.get("text", "")) for o in outputs
                          if isinstance(o, dict) and o.get("output_type") == "stream")
        traceback = _ANSI.sub("", "\n".join(map(str, error.get("traceback", []))))
        found.append(CellProblem(index, f"{error.get('ename', 'Error')}: {error.get('evalue', '')}",
                                 _tail(traceback, MAX_TRACEBACK_CHARS), _tail(printed, MAX_STREAM_CHARS)))
    return found


def override_lines(submission_id: str, item: ItemResult, score: float | None = None) -> str:
    """The overrides.yaml lines that set ``item`` to ``score`` (default: confirm what it has,
    or the LLM's suggested score for a flagged written answer)."""
    if score is None:
        details = item.details or {}
        score = details.get("draft_score", item.score) if item.status == "pending_review" else item.score
    return (f"{json.dumps(submission_id)}:\n  {item.name}:\n    score: {float(score):g}   # of {item.max_score:g}\n"
            f"    comment: \"\"\n    reviewer: \"\"")


def review_queue(out_dir: Path, results: list[GradeResult]) -> list[QueueEntry]:
    """Pending or flagged written answers, errored items (execution, internal grader errors)."""
    queue = []
    for result in sorted(results, key=lambda r: r.submission_id):
        for item in result.items:
            internal = item.name in result.grader_errors or "*" in result.grader_errors
            reason = _needs_review(item, internal)
            if reason:
                queue.append(QueueEntry(result.submission_id, item.name, item.title, reason, item.score,
                                        item.max_score, override_lines(result.submission_id, item)))
    return queue


def _needs_review(item: ItemResult, internal_error: bool) -> str:
    if item.override:
        return ""   # a person has decided it
    flags = (item.details or {}).get("flags") or []
    if flags:
        return "flagged: the answer seems to address the grader (" + "; ".join(flags) + ")"
    if item.status == "pending_review":
        return "written answer awaiting review" + (" (the model asked for a person)"
                                                   if (item.details or {}).get("needs_review") else "")
    if (item.details or {}).get("needs_review"):
        return "the model asked for a person to review this grade"
    if item.status == "error":
        return (f"internal grader error (traceback in {GRADER_ERRORS})" if internal_error
                else "could not be graded: " + _last_line(item.output))
    return ""


def page_link(submission_id: str, page: str, anchor: str = "") -> str:
    """A relative link to a submission's page, built only from a safe id (see ``intake``): an id
    read back from an edited results.json that is not one gets no link at all."""
    if not SAFE_ID.fullmatch(submission_id):
        return ""
    return f"{submission_id}/{page}" + (f"#{anchor}" if anchor else "")


def common_failures(results: list[GradeResult], limit: int = 12) -> list[tuple[str, str, int]]:
    """(item title, message with numbers blanked, count), most frequent first."""
    counts: Counter[tuple[str, str]] = Counter()
    for result in results:
        for item in result.items:
            if item.status in ("failed", "error") and WRITTEN_TAG not in item.tags:
                lines = item.output.splitlines()
                message = lines[1] if len(lines) > 1 else (lines[0] if lines else "")
                message = _NUMBER.sub("#", message)
                if len(message) > MAX_MESSAGE_CHARS:
                    message = message[:MAX_MESSAGE_CHARS].rsplit(" ", 1)[0] + " ..."
                counts[(item.title, message)] += 1
    return [(title, message, n) for (title, message), n in counts.most_common(limit)]


def summary_context(out_dir: Path, results: list[GradeResult]) -> dict[str, Any]:
    """Everything summary.html shows, computed from the output folder."""
    ordered = sorted(results, key=lambda r: r.submission_id)
    scores = [r.score for r in ordered]
    items: dict[str, list[ItemResult]] = {}
    for result in ordered:
        for item in result.items:
            items.setdefault(item.name, []).append(item)
    pass_rates = [(group[0].title, name, sum(i.status == "passed" for i in group) / len(group), len(group))
                  for name, group in items.items()]
    try:
        usage = json.loads((out_dir / USAGE_FILE).read_text())
    except (OSError, ValueError):
        usage = None
    times = [r.execution_time for r in ordered]
    overridden = [(r.submission_id, i) for r in ordered for i in r.items if i.override]
    return {
        "results": ordered, "generated": _now(), "count": len(ordered),
        "max_score": max((r.max_score for r in ordered), default=0),
        "mean": statistics.fmean(scores) if scores else 0, "median": statistics.median(scores) if scores else 0,
        "histogram_svg": _histogram(scores, max((r.max_score for r in ordered), default=1)),
        "pass_rate_svg": _pass_rates(pass_rates), "pass_rates": pass_rates,
        "failures": common_failures(ordered), "queue": review_queue(out_dir, ordered),
        "usage": usage, "times": times, "mean_time": statistics.fmean(times) if times else 0,
        "changes": read_changes(out_dir),
        "pairs": similar_pairs(out_dir, ordered, _template_scaffold(ordered[0].assignment) if ordered else None),
        "overridden": overridden, "overrides_file": OVERRIDES_FILE,
        "assignment": ordered[0].assignment if ordered else "",
    }


def _template_scaffold(assignment: str) -> str | None:
    """The scaffold code students start from, so that untouched notebooks do not pair up."""
    template = Assignment(assignment)
    if template.check_files():
        return None
    return "\n".join(cells.source(c) for c in template.template.cells if cells.SCAFFOLD in cells.tags(c)) or None


def _svg(figure: Figure) -> str:
    """The figure as an inline <svg> element (no XML prolog, no date, stable ids)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _histogram(scores: list[float], max_score: float) -> str:
    figure = Figure(figsize=(6.5, 2.6))
    axes = figure.add_subplot()
    bins = min(20, max(5, len(scores)))
    axes.hist(scores, bins=bins, range=(0, max(max_score, 1)), color="#3a6ea5", edgecolor="white")
    axes.set_xlabel("score")
    axes.set_ylabel("submissions")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _pass_rates(rates: list[tuple[str, str, float, int]]) -> str:
    figure = Figure(figsize=(6.5, 0.28 * max(len(rates), 1) + 0.8))
    axes = figure.add_subplot()
    labels = [name for _, name, _, _ in rates][::-1]
    values = [100 * rate for _, _, rate, _ in rates][::-1]
    axes.barh(labels, values, color="#5a9a5a")
    axes.set_xlim(0, 100)
    axes.set_xlabel("% of submissions passed")
    axes.tick_params(axis="y", labelsize=8)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _answers(folder: Path) -> dict[str, str]:
    try:
        answers = json.loads((folder / WRITTEN_INPUTS).read_text()).get("answers") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {f"written_{qid}": str(text) for qid, text in answers.items()}


def _text(value: Any) -> str:
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[... truncated ...]\n" + text[-limit:]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

