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

A page's size does not depend on what a submission holds. Each text a submission makes (an
item's message, a written answer, a traceback, what a cell printed, notes, the model's feedback
and rationales, flags, grounding values) is shown cut by ``cut`` at its ``MAX_..._CHARS``, the
cut said on the page with the file that holds the whole (results.json, written_inputs.json,
executed.ipynb: none of them is changed); at most ``MAX_LISTED_CELLS`` raising cells and
``MAX_LISTED_STAGES`` timing rows are listed, the page saying how many more. A shown character
becomes at most 5 bytes (``&`` is ``&amp;``), so with N check items and Q written questions of
C criteria each (the rubric's), report.html and review.html are at most 5 bytes times

    MAX_TEXT_CHARS x (N + 1)                      messages, notes
    + MAX_LINE_CHARS                              the name it was submitted as
    + Q x (MAX_ANSWER_CHARS + 3 x MAX_TEXT_CHARS  answer, message, feedback, flags
           + 3 x MAX_STREAM_CHARS                 grounding values
           + C x (2 + MAX_QUOTES) x MAX_LINE_CHARS)  rationales, waiting reasons, quotes
    + MAX_LISTED_CELLS x (MAX_LINE_CHARS + MAX_TRACEBACK_CHARS + MAX_STREAM_CHARS
                          + cells.FIRST_LINE_CHARS)
    + MAX_LISTED_STAGES x untrusted.MAX_STAGE_NAME
    + MAX_LISTED_ATTEMPTS x 3 x tampering.MAX_CODE_CHARS  (review.html) attempts on the grader

plus markup: 20 KB a page, 5 KB an item (its question and criteria included), 3 KB a listed
cell (about 2.8 MB for the course's 27 items and 10 questions). summary.html is at most 100 KB
(stylesheet, plots of N items, the 12 most common failure causes at MAX_MESSAGE_CHARS, one row
per queued item and question) plus 3 KB a student (its row); the queue itself is on its own
pages (``queue_pages``), ROWS_PER_PAGE groups a page, each page at most 5 bytes times

    MAX_EXCERPT_CHARS a row                       its first member's answer, or its cause
    + (MAX_LINE_CHARS + grouping.MAX_CHANGE_CHARS) a member   why it waits, how its words differ

plus markup: 20 KB a page (a written question's text and criteria, the rubric's, included), 2 KB
a row and 2 KB a member (its lines). A row whose answer is cut links to the review page that shows
it (up to MAX_ANSWER_CHARS). The TA's own text
(overrides, reviewers, comments) and the regrade history are not the submission's and are
shown whole.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from grader import cells
from grader.assignment import PROJECT_ROOT, Assignment
from grader.checks.tampering import KINDS as ATTEMPT_KINDS, MAX_ATTEMPTS
from grader.intake import SAFE_ID
from grader.pipeline import EXECUTED_NOTEBOOK, GRADER_ERRORS, SCAFFOLD_SOURCE
from grader.report.changes import CHANGES_FILE, read_changes
from grader.report.executed import MADE_FROM, cut, page_made_from, write_executed_page
from grader.report.grouping import Change, group_answers
from grader.report.overrides import OVERRIDES_FILE
from grader.report.plots import PassRate, histogram, pass_rates_svg
from grader.report.results import RESULTS_FILE
from grader.rubric import WRITTEN_TAG
from grader.score import NOT_SUBMITTED, WAITING, GradeResult, ItemResult, review_state
from grader.similarity import MAX_PASSAGE_CHARS, MAX_PASSAGES, SIMILARITY_FILE, flagged_groups, read_similarity
from grader.written import USAGE_FILE, WRITTEN_INPUTS
from grader.written.prompt import MAX_ANSWER_CHARS, MAX_QUOTES   # an answer on its pages: as much as the model reads

REPORT_PAGE = "report.html"
SIMILARITY_PAGE = "similarity.html"
RELEASE_FILE = "release.json"   # the folder's release state, kept between runs
REVIEW_PAGE = "review.html"
SUMMARY_PAGE = "summary.html"

# Which visibilities a student sees, by how far the course has released grades.
RELEASES = {"none": ("visible",), "due": ("visible", "after_due_date"),
            "published": ("visible", "after_due_date", "after_published")}
# What a page shows of the text a submission makes, in characters (``cut`` says each cut on the
# page, and which file holds the whole), and how many of its list entries; see the docstring.
MAX_TRACEBACK_CHARS = 3000      # a raising cell's traceback (its end)
MAX_STREAM_CHARS = 2000         # what a raising cell printed (its end); a grounding value
MAX_MESSAGE_CHARS = 200         # a common failure's message on the summary
MAX_TEXT_CHARS = 4000           # an item's message, the notes, the model's feedback, an item's flags
MAX_CAUSE_ITEMS = 6              # items named beside a failure cause on the class page (the rest counted)
MAX_ROW_ITEMS = 8                # items a class page's row names as lost (the rest counted)
MAX_LINE_CHARS = 500            # a cell's error, a rationale, a queue reason, the name submitted as
MAX_EXCERPT_CHARS = 400         # a written answer on a queue page (a group's first answer)
QUEUE_FOLDER = "queue"          # DIR/queue/<item>-<n>.html: the review queue, item by item
ROWS_PER_PAGE = 25              # groups on one queue page
CONFIDENCE_STEPS = (0.9, 0.8, 0.7)   # drafts at or above one of these are accepted with one block
MAX_LISTED_CELLS = 20           # raising cells; the page says how many more raised
MAX_LISTED_STAGES = 100         # timing rows (one per code cell that ran); the page says how many more
MAX_LISTED_ATTEMPTS = MAX_ATTEMPTS   # attempts on the grader, as many as a submission's reading keeps
MAX_SIMILAR_GROUPS = 100        # the summary's groups of flagged pairs; similarity.html has every pair
MAX_SHOWN_PAIRS = 50            # flagged pairs similarity.html shows with their passages (the rest in a table)
MAX_LISTED_PAIRS = 200          # rows of similarity.html's table of reported pairs
MAX_SHOWN_PASSAGES = MAX_PASSAGES   # passages a pair shows: what similarity.json keeps
MAX_SOURCE_ID_CHARS = 200       # a compared source's name as shown (an earlier term's folder can be long)
CUT_NOTICE_CHARS = 120          # characters ``cut`` adds to say what it cut
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A number standing alone (not the 64 of float64 or the 1 of ex1), for grouping messages.
# A number in a message, masked as # wherever messages are grouped: not inside a name (float64,
# x1, d_h2), and at a sentence's end too ("at position 16.").
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?(?!\w|\.\d)", re.IGNORECASE)


def masked(message: str) -> str:
    """``message`` with its numbers as #: the same mask for every grouping of messages."""
    return _NUMBER.sub("#", message)
# What written_inputs.json records per question, in the order a TA reads it.
GROUNDING_PARTS = (("reported", "the student's reported run (the one the answer discusses)"),
                   ("grounding", "the grader's re-run, in grading mode"),
                   ("agreement", "where the two runs must agree"))
EXECUTION_ITEM = "notebook_runs"   # every assignment's item for the notebook running headless

_templates = jinja2.Environment(loader=jinja2.PackageLoader("grader.report", "templates"),
                                autoescape=True, undefined=jinja2.StrictUndefined,
                                trim_blocks=True, lstrip_blocks=True)


def _review_anchor(submission_id: str, anchor: str = "", up: str = "") -> markupsafe.Markup:
    """The id linking to its review page (escaped; plain text when it cannot be a safe link);
    ``up`` is the way from the page's folder to the output folder (``../`` from the queue's)."""
    link = page_link(submission_id, REVIEW_PAGE, anchor)
    if not link:
        return markupsafe.escape(submission_id)
    return markupsafe.Markup('<a href="{}">{}</a>').format(up + link, submission_id)


def _similarity_anchor(source_id: str) -> markupsafe.Markup:
    """A compared source on the similarity pages: a submission of the class links to its review
    page; one of an earlier term (``<folder>/<id>``) is its name, cut."""
    if SAFE_ID.fullmatch(source_id):
        return _review_anchor(source_id)
    return markupsafe.escape(cut(source_id, MAX_SOURCE_ID_CHARS, SIMILARITY_FILE))


_templates.globals["review_anchor"] = _review_anchor
_templates.globals["similarity_anchor"] = _similarity_anchor
_templates.filters["cut"] = cut
_templates.globals.update(MAX_ROW_ITEMS=MAX_ROW_ITEMS, MAX_EXCERPT_CHARS=MAX_EXCERPT_CHARS,
                          MAX_TEXT_CHARS=MAX_TEXT_CHARS, MAX_LINE_CHARS=MAX_LINE_CHARS,
                          MAX_ANSWER_CHARS=MAX_ANSWER_CHARS, MAX_LISTED_STAGES=MAX_LISTED_STAGES,
                          MAX_LISTED_ATTEMPTS=MAX_LISTED_ATTEMPTS, MAX_SIMILAR_GROUPS=MAX_SIMILAR_GROUPS,
                          EXECUTED_NOTEBOOK=EXECUTED_NOTEBOOK, RESULTS_FILE=RESULTS_FILE,
                          WRITTEN_INPUTS=WRITTEN_INPUTS, MAX_QUOTES=MAX_QUOTES, MAX_CAUSE_ITEMS=MAX_CAUSE_ITEMS, review_state=review_state,
                          WAITING=WAITING)


@dataclass
class CellProblem:
    """One executed cell that raised, named as the student sees it: its number among the
    notebook's code cells, its first line and its execution count (the ``In [n]`` of the
    traceback), then what it raised and printed (truncated), and the items its error cost."""

    number: int
    first_line: str
    execution_count: int | None
    error: str
    traceback: str
    printed: str
    cell_id: str = ""
    costs: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return cells.code_cell_label(self.number, self.execution_count)


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
    answer: str = ""                 # a written answer's text (a page shows its start, MAX_EXCERPT_CHARS)
    flagged: bool = False
    confidence: float | None = None  # the model's, when it drafted a score
    written: bool = False
    # Flagged, or waiting for a reason other than the model's confidence (``reason`` says which):
    # never in a block that decides several answers at once, and never pre-filled with the draft.
    held: bool = False


def _folder_state(out_dir: Path) -> dict[str, Any]:
    """What RELEASE_FILE keeps ({} when nothing, or nothing readable, is there)."""
    try:
        stored = json.loads((out_dir / RELEASE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _keep_folder_state(out_dir: Path, **changes: Any) -> None:
    """Write RELEASE_FILE with ``changes`` over what it holds (a value None removes its key)."""
    state = {**_folder_state(out_dir), **changes}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RELEASE_FILE).write_text(json.dumps({k: v for k, v in state.items() if v is not None}) + "\n")


def assignment_root(out_dir: Path, given: Path | None = None) -> Path:
    """The root of the assignment the folder's results are of, where the pages read its
    questions, criteria, master and template: ``given`` (``grade --assignment-root``) is kept in
    RELEASE_FILE beside the release state, so ``grader report DIR`` finds it again; None reads
    what is kept (this project when nothing is)."""
    if given is not None:
        given = Path(given).resolve()
        kept = None if given == PROJECT_ROOT else str(given)
        if kept != _folder_state(out_dir).get("assignment_root"):
            _keep_folder_state(out_dir, assignment_root=kept)
        return given
    kept = _folder_state(out_dir).get("assignment_root")
    return Path(kept) if isinstance(kept, str) and kept else PROJECT_ROOT


def release_state(out_dir: Path, given: str | None = None) -> str:
    """How far the folder's grades are released. ``given`` (``--release`` on grade or report)
    becomes the folder's state; None keeps the state already stored there (``none`` for a new
    folder), so re-rendering after overrides never unpublishes anything by omission."""
    path = out_dir / RELEASE_FILE
    if given is not None:
        if given not in RELEASES:
            raise ValueError(f"release must be one of {sorted(RELEASES)}, not {given!r}")
        _keep_folder_state(out_dir, release=given, set=_now())
        return given
    try:
        stored = json.loads(path.read_text()).get("release", "none")   # a folder graded under a root keeps only that
    except (OSError, ValueError, AttributeError):
        return "none"
    if stored not in RELEASES:
        raise ValueError(f"{path}: release {stored!r} is not one of {sorted(RELEASES)}; set it with --release")
    return stored


def write_pages(out_dir: Path, results: list[GradeResult], release: str = "none",
                root: Path | None = None) -> list[Path]:
    """report.html and review.html for every result (and executed.html when its folder holds
    the executed notebook), then summary.html for the batch. ``root``: the assignment's root
    (``--assignment-root``; kept in the folder, see ``assignment_root``)."""
    if release not in RELEASES:
        raise ValueError(f"release must be one of {sorted(RELEASES)}, not {release!r}")
    root = assignment_root(out_dir, root)
    pages = []
    summarized: dict[str, bytes] = {}   # what the summary shows of each submission, gathered on the way
    for result in results:
        folder = out_dir / result.submission_id
        folder.mkdir(parents=True, exist_ok=True)
        executed, executed_note = write_executed_page(folder)   # linked from the TA's page only
        pages += [executed] if executed else []
        context, inputs = None, _page_inputs(folder, result, release, executed_note, root)
        summarized[result.submission_id] = hashlib.sha256(inputs + _stat_line(folder / SCAFFOLD_SOURCE)).digest()
        for name, audience, shown in ((REPORT_PAGE, "student", RELEASES[release]),
                                      (REVIEW_PAGE, "ta", None)):
            page = folder / name
            pages.append(page)
            made_from = f"{hashlib.sha256(inputs + audience.encode()).hexdigest()} {_page_code_digest()}"
            if page_made_from(page) == made_from:
                continue   # the page these inputs make is there: an unchanged regrade redraws nothing
            context = context or _submission_context(folder, result, root)
            html = _templates.get_template("report.html.j2").render(
                audience=audience, release=release, executed=executed.name if executed else "",
                executed_note=executed_note, **context, **_items_context(result, shown))
            page.write_text(f"<!-- {MADE_FROM} {made_from} -->\n" + html)
    summary = out_dir / SUMMARY_PAGE
    summary_inputs = _out_dir_inputs(out_dir) + b"".join(summarized[sid] for sid in sorted(summarized))
    made_from = f"{hashlib.sha256(summary_inputs).hexdigest()} {_page_code_digest()}"
    if page_made_from(summary) != made_from:   # its plots cost seconds
        context = summary_context(out_dir, results, root)
        _write_queue_pages(out_dir, context["queue_pages"])   # drawn from the same inputs as the summary
        html = _templates.get_template("summary.html.j2").render(**context)
        summary.write_text(f"<!-- {MADE_FROM} {made_from} -->\n" + html)
    pages.append(summary)
    similarity = write_similarity_page(out_dir, results[0].assignment if results else "")
    return pages + ([similarity] if similarity else [])


def write_similarity_page(out_dir: Path, assignment: str) -> Path | None:
    """SIMILARITY_PAGE from the folder's SIMILARITY_FILE (None when the class was not compared):
    each flagged pair with its passages side by side, the highest ``MAX_SHOWN_PAIRS``, then a
    table of the reported pairs; at most ``similarity_page_bound()`` bytes."""
    record = read_similarity(out_dir)
    if record is None:
        return None
    pairs = [p for p in record["pairs"] if isinstance(p, dict)]
    flagged = [p for p in pairs if p.get("flagged")]
    compared = record.get("compared") if isinstance(record.get("compared"), dict) else {}
    page = out_dir / SIMILARITY_PAGE
    page.write_text(_templates.get_template("similarity.html.j2").render(
        assignment=assignment, shown=flagged[:MAX_SHOWN_PAIRS], flagged=len(flagged), listed=pairs[:MAX_LISTED_PAIRS],
        reported=len(pairs), record={**record, "compared": compared}, summary=SUMMARY_PAGE,
        similarity_file=SIMILARITY_FILE, max_passages=MAX_SHOWN_PASSAGES, max_chars=MAX_PASSAGE_CHARS))
    return page


def similarity_page_bound() -> int:
    """SIMILARITY_PAGE's size bound in bytes, whatever submissions hold: a shown character is at
    most 5 bytes (``&amp;``), a cut adds its notice (``CUT_NOTICE_CHARS``), plus markup: 20 KB a
    page, 1 KB a shown pair and 300 bytes a listed one. Question ids are the rubric's."""
    side = MAX_PASSAGE_CHARS + CUT_NOTICE_CHARS
    source = MAX_SOURCE_ID_CHARS + CUT_NOTICE_CHARS
    shown = 2 * MAX_SHOWN_PASSAGES * side + 4 * source
    return (5 * (MAX_SHOWN_PAIRS * shown + MAX_LISTED_PAIRS * 2 * source) + 20_000 + 1000 * MAX_SHOWN_PAIRS
            + 300 * MAX_LISTED_PAIRS)


def _stat_line(path: Path) -> bytes:
    """A file as a page's inputs name it: its size and mtime (the grader rewrites what it changes)."""
    try:
        found = path.stat()
        return f"{path.name} {found.st_size} {found.st_mtime_ns}\0".encode()
    except OSError:
        return f"{path.name} absent\0".encode()


def _page_inputs(folder: Path, result: GradeResult, release: str, executed_note: str,
                 root: Path = PROJECT_ROOT) -> bytes:
    """What a submission's two pages are drawn from, but for their audience: the result, the
    release state, the folder's files the pages read and the assignment's files. With the
    audience, digested, and the digest of the code that draws them, it makes a page's first line."""
    # As results.json holds it: a result read back from there makes the same inputs as the one
    # just graded (whose execution time is not rounded yet), so the next run redraws nothing.
    shown = json.dumps([result.to_json(), release, executed_note, _assignment_digest(result.assignment, root)],
                       sort_keys=True, default=str)
    return f"{shown}\0".encode() + b"".join(_stat_line(folder / name) for name in (EXECUTED_NOTEBOOK, WRITTEN_INPUTS))


def _out_dir_inputs(out_dir: Path) -> bytes:
    """The output folder's own files that summary.html shows (score changes, the model's usage,
    the similarity groups)."""
    return b"".join(_stat_line(out_dir / name) for name in (CHANGES_FILE, USAGE_FILE, SIMILARITY_FILE))


@functools.lru_cache(maxsize=8)
def _assignment_digest(name: str, root: Path = PROJECT_ROOT) -> str:
    """The master, the template and the rubric file of the assignment (questions and criteria
    are shown from them); "" for an assignment the root does not have."""
    assignment = _assignment(name, root)
    try:
        return hashlib.sha256(assignment.fingerprint.encode() + assignment.rubric_path.read_bytes()).hexdigest()
    except OSError:
        return ""


@functools.cache
def _page_code_digest() -> str:
    """Every file of the grader package that could change how a page is drawn: all its code and
    templates (any edit of the grader redraws the pages once)."""
    package = Path(__file__).resolve().parent.parent
    files = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".j2", ".css") and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(package)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _submission_context(folder: Path, result: GradeResult, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    problems = cell_problems(folder / EXECUTED_NOTEBOOK, result, root)
    return {"result": result, "problems": problems[:MAX_LISTED_CELLS],
            "unlisted_problems": len(problems[MAX_LISTED_CELLS:]),
            "answers": _answers(folder), "asked": written_context(folder, result, root), "generated": _now()}


def badge(item: ItemResult) -> tuple[str, str]:
    """An item's state as its badge shows it: (CSS class, words). Partial credit (a TA's 2 of 3,
    a check's fraction) is not drawn as a failure; a waiting item says it waits."""
    if review_state(item).state == "waiting":
        return "pending_review", "awaiting review"
    if item.status == "failed" and 0 < item.score < item.max_score:
        return "partial", "partial credit"
    return item.status, item.status.replace("_", " ")


_templates.globals["badge"] = badge
_templates.globals["attempt_kinds"] = ATTEMPT_KINDS


def _counted(items: list[ItemResult], what: str) -> str:
    """'3 written answers' / '1 check': how many of ``items`` a sentence names, by kind."""
    written = sum(WRITTEN_TAG in i.tags for i in items)
    parts = [f"{n} {noun}{'s' if n != 1 else ''}" for n, noun in
             ((written, "written answer"), (len(items) - written, "check")) if n]
    return " and ".join(parts) if parts else f"no {what}"


def _items_context(result: GradeResult, shown: tuple[str, ...] | None) -> dict[str, Any]:
    """The items a page shows (``shown``: the visibilities released; None: all, for a TA), the
    total over them, and what the total leaves out: the items not released yet, and the shown
    items still waiting for a TA (counted 0 until one decides)."""
    items = [i for i in result.items if shown is None or i.visibility in shown]
    withheld = [i for i in result.items if i not in items]
    waiting = [i for i in items if review_state(i).state == "waiting"]
    return {"items": items, "checks": [i for i in items if WRITTEN_TAG not in i.tags],
            "written": [i for i in items if WRITTEN_TAG in i.tags],
            "shown_score": round(sum(i.score for i in items), 4),
            "shown_max": round(sum(i.max_score for i in items), 4),
            "total_max": result.max_score,
            "withheld": len(withheld), "withheld_max": round(sum(i.max_score for i in withheld), 4),
            "withheld_kinds": _counted(withheld, "item"),
            "waiting": len(waiting), "waiting_max": round(sum(i.max_score for i in waiting), 4),
            "waiting_kinds": _counted(waiting, "item"),
            "shown_names": [i.name for i in items], "titles": {i.name: i.title for i in items},
            "override_lines": {i.name: override_lines(result.submission_id, i) for i in items}}


def cell_problems(executed: Path, result: GradeResult | None = None, root: Path = PROJECT_ROOT) -> list[CellProblem]:
    """Cells of the executed notebook that raised, in order (empty when there is no notebook),
    numbered among code cells as the student counts them; with ``result``, each names the items
    its error cost.

    The notebook was written inside the sandbox: it is read as data, capped, and escaped by
    the template like everything else."""
    try:
        text = executed.read_text()
    except (OSError, ValueError):
        return []
    found = []
    for cell in cells.executed_code_cells(text):
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if not errors:
            continue
        error = errors[0]
        printed = "".join(_text(o.get("text", "")) for o in cell.outputs if o.get("output_type") == "stream")
        traceback = _ANSI.sub("", "\n".join(map(str, error.get("traceback", []))))
        found.append(CellProblem(cell.number, cells.first_line(cell.source), cell.execution_count,
                                 cut(f"{error.get('ename', 'Error')}: {error.get('evalue', '')}", MAX_LINE_CHARS,
                                     EXECUTED_NOTEBOOK),
                                 cut(traceback, MAX_TRACEBACK_CHARS, EXECUTED_NOTEBOOK, keep_end=True),
                                 cut(printed, MAX_STREAM_CHARS, EXECUTED_NOTEBOOK, keep_end=True),
                                 cell.cell_id))
    if result is not None:
        defines = answer_cells(result.assignment, root)
        for problem in found:
            missing = defines.get(problem.cell_id, ())
            problem.costs = [i.name for i in result.items if i.status != "passed" and WRITTEN_TAG not in i.tags and (
                i.name == EXECUTION_ITEM or any(re.search(rf"\b{name}\b", i.output) for name in missing))]
    return found


@functools.lru_cache(maxsize=8)
def _assignment(name: str, root: Path = PROJECT_ROOT) -> Assignment:
    """The assignment results name, under ``root``, loaded once per process: parsing its rubric
    again for every page was most of the cost of rewriting a class's pages."""
    return Assignment(name, root)


@functools.lru_cache(maxsize=8)
def answer_cells(assignment: str, root: Path = PROJECT_ROOT) -> dict[str, tuple[str, ...]]:
    """Cell id -> the answer variables that cell assigns, read from the trusted master notebook
    (never from the student's cell; ids are the template's): a raising cell costs the items
    that read them."""
    try:
        template = _assignment(assignment, root)
        wanted = set(template.rubric.answer_variables)
        notebook = template.master
    except Exception:  # noqa: BLE001 - an unknown or broken assignment only loses the links
        return {}
    found = {}
    for cell in notebook.cells:
        if cell.get("cell_type") != "code" or not cell.get("id"):
            continue
        assigned = cells.assigned_names(cells.source(cell), wanted)
        if assigned:
            found[cell["id"]] = tuple(sorted(assigned))
    return found


def asked_questions(assignment: str, root: Path = PROJECT_ROOT) -> dict[str, tuple[Any, str]]:
    """Written item name -> (the rubric's question, with its criteria; the question as the
    master asks it), for the assignment under ``root``; {} for one that cannot be read there."""
    try:
        template = _assignment(assignment, root)
        asked = template.reference_answers
        return {q.item_name: (q, asked[q.id].question if q.id in asked else "") for q in template.rubric.questions}
    except Exception:  # noqa: BLE001 - an unknown assignment's pages still show the answers
        return {}


def written_context(folder: Path, result: GradeResult, root: Path = PROJECT_ROOT) -> dict[str, dict[str, Any]]:
    """For each written item: the question as the template asks it, the rubric's criteria and
    the grounding values the answer was judged against, as the written stage recorded them (the
    student's reported run, the grader's re-run, and whether the two agree where they must)."""
    questions = asked_questions(result.assignment, root)
    if not questions:
        return {}
    try:
        inputs = json.loads((folder / WRITTEN_INPUTS).read_text())
    except (OSError, ValueError, RecursionError):
        inputs = {}
    inputs = inputs if isinstance(inputs, dict) else {}
    context = {}
    for name, (question, text) in questions.items():
        runs = []
        for part, label in GROUNDING_PARTS:
            found = inputs.get(part)
            values = found.get(question.id) if isinstance(found, dict) else None
            if values:
                runs.append((label, cut(json.dumps(values, indent=1, default=str), MAX_STREAM_CHARS,
                                        WRITTEN_INPUTS, keep_end=True)))
        context[name] = {"question": text, "criteria": {c.id: c for c in question.criteria}, "grounding": runs}
    return context


def override_lines(submission_id: str, item: ItemResult, score: float | None = None, typed: bool = False) -> str:
    """The overrides.yaml lines that set ``item`` to ``score`` (default: confirm what it has,
    or the LLM's suggested score for a flagged written answer); ``typed``: the score left for
    the TA to type, as ``null``, which overrides.yaml refuses until it is a number."""
    return f"{json.dumps(submission_id)}:\n" + _override_item_lines(item, score, typed)


def _override_item_lines(item: ItemResult, score: float | None = None, typed: bool = False) -> str:
    """The item's lines, carrying the override it has (its comment and reviewer), so that pasting
    them again loses nothing already decided."""
    override = item.override or {}
    if score is None:
        details = item.details or {}
        score = details.get("draft_score", item.score) if item.status == "pending_review" else item.score
    shown = (f"null   # of {item.max_score:g}: type the score you decide (nothing is pre-filled)" if typed
             else f"{float(score):g}   # of {item.max_score:g}")
    return (f"  {item.name}:\n    score: {shown}\n"
            f"    comment: {json.dumps(str(override.get('comment', '')), ensure_ascii=False)}\n"
            f"    reviewer: {json.dumps(str(override.get('reviewer', '')), ensure_ascii=False)}")


def review_queue(out_dir: Path, results: list[GradeResult]) -> list[QueueEntry]:
    """What waits for a person, in the order to look at it: written answers question by question
    (each question's flagged answers first, then drafts by the model's confidence, lowest first,
    then answers with no draft), then errored autograded items item by item."""
    order = {}
    entries = []
    for result in sorted(results, key=lambda r: r.submission_id):
        answers = _answers(out_dir / result.submission_id) if SAFE_ID.fullmatch(result.submission_id) else {}
        for position, item in enumerate(result.items):
            internal = item.name in result.grader_errors or "*" in result.grader_errors
            reason = _needs_review(item, internal)
            if not reason:
                continue
            details = item.details or {}
            confidence = details.get("confidence") if "draft_score" in details else None
            held = bool(review_state(item).reasons or details.get("needs_review"))
            order.setdefault(item.name, position)
            entries.append(QueueEntry(result.submission_id, item.name, item.title,
                                      cut(reason, MAX_LINE_CHARS, RESULTS_FILE), item.score,
                                      item.max_score, override_lines(result.submission_id, item),
                                      answers.get(item.name, "") if WRITTEN_TAG in item.tags else "",
                                      bool(details.get("flags")),
                                      float(confidence) if isinstance(confidence, (int, float)) else None,
                                      WRITTEN_TAG in item.tags, held))

    def rank(entry: QueueEntry) -> tuple:
        drafted = entry.confidence is not None
        return (not entry.written, order[entry.item], not entry.flagged, not drafted,
                entry.confidence if drafted else 0.0, entry.submission_id)
    return sorted(entries, key=rank)


@dataclass(frozen=True)
class QueueMember:
    """One entry of a row: how its words differ from the answer the row shows (``grouping``'s
    runs; empty when they do not), and for a held entry its own lines, the score left for the TA
    to type."""

    entry: QueueEntry
    changes: Change = ()
    own_block: str = ""


@dataclass(frozen=True)
class QueueRow:
    """Queued entries decided together: answers that say the same thing (``grouping``), or one
    cause of an errored item. ``block`` holds the overrides.yaml lines of every member but the
    held ones (each held member has its own lines), each under its own id, so that a later
    regrade that groups otherwise changes nothing decided, and a member is split out by editing
    its lines; "" when every member is held."""

    members: tuple[QueueMember, ...]
    kind: str                       # grouping's level, or "same cause"
    shown: str                      # the first member's answer (cut), or the cause
    block: str
    whole: str = ""                 # when ``shown`` is a cut answer: the submission whose review page shows it whole

    @property
    def together(self) -> int:
        """The members its block decides."""
        return sum(not m.entry.held for m in self.members)


@dataclass(frozen=True)
class QueuePage:
    """One page of one item's queue (``QUEUE_FOLDER/<item>-<number>.html``)."""

    item: str
    title: str
    written: bool
    number: int
    pages: int
    waiting: int                    # entries of the item, on all its pages
    groups: int                     # rows of the item, on all its pages
    held: int                       # held entries of the item (in no block with others), on all its pages
    rows: tuple[QueueRow, ...]
    accept: tuple[tuple[float, int, str], ...]   # (confidence, drafts at or above it, their block): first page only
    question: str = ""              # a written item's question, as the master asks it
    criteria: tuple[tuple[str, str, float], ...] = ()   # its rubric's criteria: (id, what earns it, points)

    @property
    def file_name(self) -> str:
        return queue_page_name(self.item, self.number)


def queue_page_name(item: str, number: int) -> str:
    return f"{item}-{number}.html"


def queue_pages(results: list[GradeResult], queue: list[QueueEntry], root: Path = PROJECT_ROOT) -> list[QueuePage]:
    """The queue as pages, item by item in the queue's order, ``ROWS_PER_PAGE`` rows a page. A
    written question's answers are grouped by what they say (``grouping.group_answers``, on the
    whole answers), each member beside its changes from the answer its row shows, and its first
    page offers, for each of ``CONFIDENCE_STEPS``, one block that accepts every draft at or above
    that confidence but the held ones; an errored item's entries are grouped by their cause
    (numbers masked). A held entry is in no block with others: its row says why and holds its
    own lines, the score left for the TA to type. A written item's pages show its question and
    criteria (from the assignment under ``root``), and a row whose answer is cut links to the
    review page that shows it whole."""
    items = {(r.submission_id, i.name): i for r in results for i in r.items}
    asked = asked_questions(results[0].assignment, root) if results else {}
    by_item: dict[str, list[QueueEntry]] = {}
    for entry in queue:
        by_item.setdefault(entry.item, []).append(entry)
    pages = []
    for name, entries in by_item.items():
        first = entries[0]
        by_id = {e.submission_id: e for e in entries}
        if first.written:   # grouped on the whole answers, which review_queue read once
            # A held answer never leads a group that others join (its hidden characters would hide
            # what they are decided on); rows keep the queue's order of their first-placed member.
            place = {e.submission_id: n for n, e in enumerate(entries)}
            found = group_answers({e.submission_id: e.answer for e in sorted(entries, key=lambda e: e.held)})
            groups = [([(by_id[sid], changes) for sid, changes in zip(g.members, g.changes)], g.kind,
                       by_id[g.members[0]].answer)
                      for g in sorted(found, key=lambda g: min(map(place.__getitem__, g.members)))]
        else:
            causes: dict[str, list[QueueEntry]] = {}
            for entry in entries:
                causes.setdefault(masked(entry.reason), []).append(entry)
            groups = [([(e, ()) for e in members], "same cause", cause) for cause, members in causes.items()]

        def lines(entry: QueueEntry, typed: bool = False) -> str:
            return override_lines(entry.submission_id, items[(entry.submission_id, name)], typed=typed)
        rows = []
        for members, kind, shown in groups:
            # the shown answer's words first, then each set of changes once, its members together
            variants = {changes: n for n, changes in enumerate(dict.fromkeys(changes for _, changes in members))}
            members = sorted(members, key=lambda member: variants[member[1]])
            whole = members[0][0].submission_id if first.written and len(shown) > MAX_EXCERPT_CHARS else ""
            rows.append(QueueRow(tuple(QueueMember(e, changes, lines(e, typed=True) if e.held else "")
                                       for e, changes in members),
                                 kind, cut(shown, MAX_EXCERPT_CHARS, WRITTEN_INPUTS if first.written else RESULTS_FILE),
                                 "\n".join(lines(e) for e, _ in members if not e.held), whole))
        # a held draft waits for a reason the model's confidence does not answer
        accept = tuple((step, len(chosen), "\n".join(map(lines, chosen)))
                       for step in CONFIDENCE_STEPS
                       for chosen in [[e for e in entries if e.confidence is not None and e.confidence >= step
                                       and not e.held]] if chosen) if first.written else ()
        count = max(1, -(-len(rows) // ROWS_PER_PAGE))
        held = sum(e.held for e in entries)
        question, text = asked.get(name, (None, ""))
        criteria = tuple((c.id, c.earns, c.points) for c in question.criteria) if question is not None else ()
        for number in range(1, count + 1):
            pages.append(QueuePage(name, first.title, first.written, number, count, len(entries), len(rows), held,
                                   tuple(rows[(number - 1) * ROWS_PER_PAGE:number * ROWS_PER_PAGE]),
                                   accept if number == 1 else (), text, criteria))
    return pages


def _write_queue_pages(out_dir: Path, pages: list[QueuePage]) -> None:
    """The queue's pages, in a folder of their own that holds nothing else (old pages go)."""
    folder = out_dir / QUEUE_FOLDER
    if folder.is_dir() and not folder.is_symlink():
        for old in folder.glob("*.html"):
            old.unlink()
    folder.mkdir(exist_ok=True)
    template = _templates.get_template("queue.html.j2")
    for page in pages:
        (folder / page.file_name).write_text(template.render(
            page=page, assignment_pages=pages, overrides_file=OVERRIDES_FILE, summary=f"../{SUMMARY_PAGE}"))


def _needs_review(item: ItemResult, internal_error: bool) -> str:
    review = review_state(item)
    if review.state == "decided":
        return ""   # a person has decided it
    flags = (item.details or {}).get("flags") or []
    if flags:
        return "flagged for review (" + "; ".join(flags) + ")"
    if review.state == "waiting":
        return "written answer awaiting review" + (f" ({'; '.join(review.reasons)})" if review.reasons else "") + (
            " (the model asked for a person)" if (item.details or {}).get("needs_review") else "")
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


@dataclass(frozen=True)
class FailureCause:
    """One distinct cause of failed autograded items across the class: its message (numbers
    masked), how many submissions it cost, and the items it cost there (titles, most often first)."""

    message: str
    submissions: int
    items: list[str]


def common_failures(results: list[GradeResult], limit: int = 12) -> list[FailureCause]:
    """The distinct failure causes, most submissions first: a cause that costs several items (a
    forward that raises costs every item that needs it) is one row, not one per item."""
    submissions: dict[str, set[str]] = {}
    items: dict[str, Counter[str]] = {}
    for result in results:
        for item in result.items:
            if item.status in ("failed", "error") and WRITTEN_TAG not in item.tags:
                lines = item.output.splitlines()
                message = cut(masked(lines[1] if len(lines) > 1 else (lines[0] if lines else "")), MAX_MESSAGE_CHARS,
                              RESULTS_FILE)
                submissions.setdefault(message, set()).add(result.submission_id)
                items.setdefault(message, Counter())[item.title] += 1
    ranked = sorted(submissions, key=lambda m: (-len(submissions[m]), -sum(items[m].values()), m))[:limit]
    return [FailureCause(m, len(submissions[m]), [title for title, _ in items[m].most_common()]) for m in ranked]


def _code_lines(code: str) -> list[str]:
    return [line.rstrip() for line in code.splitlines() if line.strip()]


def not_attempted(folder: Path, result: GradeResult, template_code: str | None) -> bool:
    """Whether the submission is the notebook as handed out: its scaffold code is the template's
    (blank lines aside) and it gives no written answer (each blank or the template's). An item
    a TA decided makes it attempted as far as the pages go."""
    if template_code is None or any(i.override for i in result.items):
        return False
    if not all(i.output == NOT_SUBMITTED for i in result.items if WRITTEN_TAG in i.tags):
        return False
    try:
        code = (folder / SCAFFOLD_SOURCE).read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return _code_lines(code) == _code_lines(template_code)


def summary_context(out_dir: Path, results: list[GradeResult], root: Path | None = None) -> dict[str, Any]:
    """Everything summary.html shows, computed from the output folder. Submissions not attempted
    (``not_attempted``) are named as such and left out of the pass rates and failure causes,
    which would otherwise show their template's TODO errors as the class's failures."""
    root = assignment_root(out_dir) if root is None else root
    ordered = sorted(results, key=lambda r: r.submission_id)
    queue = review_queue(out_dir, ordered)
    scores = [r.score for r in ordered]
    try:
        template_code = _template_scaffold(ordered[0].assignment, root) if ordered else None
    except Exception:  # noqa: BLE001 - an assignment that cannot be read here only loses these comparisons
        template_code = None
    idle = {r.submission_id for r in ordered if SAFE_ID.fullmatch(r.submission_id)
            and not_attempted(out_dir / r.submission_id, r, template_code)}
    attempted = [r for r in ordered if r.submission_id not in idle]
    items: dict[str, list[ItemResult]] = {}
    for result in attempted:
        for item in result.items:
            items.setdefault(item.name, []).append(item)
    pass_rates = [PassRate.of(name, group) for name, group in items.items()]
    try:
        usage = json.loads((out_dir / USAGE_FILE).read_text())
    except (OSError, ValueError):
        usage = None
    times = [r.execution_time for r in ordered]
    overridden = [(r.submission_id, i) for r in ordered for i in r.items if i.override]
    tampering = [(r.submission_id, sorted({ATTEMPT_KINDS.get(a.get("kind", ""), "") for a in r.attempts} - {""}))
                 for r in ordered if r.attempts]
    return {
        "results": ordered, "generated": _now(), "count": len(ordered),
        "max_score": max((r.max_score for r in ordered), default=0),
        "mean": statistics.fmean(scores) if scores else 0, "median": statistics.median(scores) if scores else 0,
        "histogram_svg": histogram(scores, max((r.max_score for r in ordered), default=1)),
        "pass_rate_svg": pass_rates_svg(pass_rates), "pass_rates": pass_rates,
        "failures": common_failures(attempted), "queue_pages": queue_pages(ordered, queue, root),
        "not_attempted": sorted(idle), "waiting_entries": len(queue),
        "waiting_submissions": len({e.submission_id for e in queue}),
        "usage": usage, "times": times, "mean_time": statistics.fmean(times) if times else 0,
        "changes": read_changes(out_dir),
        "similar": flagged_groups(record) if (record := read_similarity(out_dir)) is not None else None,
        "similarity_page": SIMILARITY_PAGE,
        "overridden": overridden, "overrides_file": OVERRIDES_FILE, "tampering": tampering,
        "assignment": ordered[0].assignment if ordered else "",
    }


def _template_scaffold(assignment: str, root: Path = PROJECT_ROOT) -> str | None:
    """The scaffold code students start from, so that untouched notebooks do not pair up."""
    template = _assignment(assignment, root)
    if template.check_files():
        return None
    return "\n".join(cells.source(c) for c in template.template.cells if cells.SCAFFOLD in cells.tags(c)) or None


def _answers(folder: Path) -> dict[str, str]:
    try:
        answers = json.loads((folder / WRITTEN_INPUTS).read_text()).get("answers") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {f"written_{qid}": str(text) for qid, text in answers.items()}


def _text(value: Any) -> str:
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

