"""Every page's size has a bound that does not depend on what a submission holds (issue 30):
pages rendered in process from recorded results of extreme submissions (3,000 raising cells,
ten 400 KB written answers, a 400 KB item message: each fifty times its longest cut), alone and
several in one class, are under the bounds pages.py and executed.py state, say where they cut,
and leave the result files whole; an honest submission's pages cut nothing.
(tests/test_hostile_inputs.py grades one with 2 MB answers for real.)"""
from __future__ import annotations

import json
import time
from pathlib import Path

import markupsafe
import pytest

from grader.cells import FIRST_LINE_CHARS
from grader.pipeline import EXECUTED_NOTEBOOK
from grader.report.executed import EXECUTED_PAGE, MAX_CELLS_BYTES, cut
from grader.report.pages import (MAX_ANSWER_CHARS, MAX_EXCERPT_CHARS, MAX_LINE_CHARS, MAX_LISTED_CELLS, QUEUE_FOLDER,
                                 MAX_LISTED_STAGES, MAX_STREAM_CHARS, MAX_TEXT_CHARS, MAX_TRACEBACK_CHARS,
                                 REPORT_PAGE, REVIEW_PAGE, SUMMARY_PAGE, write_pages)
from grader.report.results import RESULTS_FILE, read_results, write_result
from grader.written.prompt import MAX_QUOTES
from grader.untrusted import MAX_STAGE_NAME
from grader.written import WRITTEN_INPUTS

from conftest import ROOT
from test_reports import recorded
from test_review import two_raising_cells

# Text that escaping makes as large as it can (every character 4 or 5 bytes on the page).
WORST = "<&>\"'"
HUGE = 400_000   # fifty times the longest cut (an answer's 8,000 characters)
RAISING_CELLS = 3000
CUT_SAID = "characters shown; the full text is in "


def worst_text(length: int, words: str = "") -> str:
    """``length`` characters of escaping's worst case, after ``words`` (what makes answers differ)."""
    return (words + " " + WORST * length)[:length]


def submission_page_bound(assignment) -> int:
    """pages.py's stated bound for report.html and review.html, in bytes (see its docstring)."""
    checks, questions = len(assignment.rubric.items), assignment.rubric.questions
    shown = (MAX_TEXT_CHARS * (checks + 1) + MAX_LINE_CHARS
             + sum(MAX_ANSWER_CHARS + 3 * MAX_TEXT_CHARS + 3 * MAX_STREAM_CHARS + len(q.criteria) * (2 + MAX_QUOTES) * MAX_LINE_CHARS
                   for q in questions)
             + MAX_LISTED_CELLS * (MAX_LINE_CHARS + MAX_TRACEBACK_CHARS + MAX_STREAM_CHARS + FIRST_LINE_CHARS)
             + MAX_LISTED_STAGES * MAX_STAGE_NAME)
    return 5 * shown + 20_000 + 5_000 * (checks + len(questions)) + 3_000 * MAX_LISTED_CELLS


def summary_bound(assignment, students: int) -> int:
    """pages.py's stated bound for summary.html: fixed, and the same share per student."""
    checks, questions = len(assignment.rubric.items), len(assignment.rubric.questions)
    per_student = (2_000 + checks * (5 * MAX_LINE_CHARS + 1_000)
                   + questions * (5 * (MAX_EXCERPT_CHARS + MAX_LINE_CHARS) + 1_000))
    assert per_student < 200_000
    return 100_000 + students * per_student


EXECUTED_PAGE_BOUND = 25_000 + MAX_CELLS_BYTES   # executed.py's stated bound


def raising_notebook(cells: int) -> bytes:
    """``cells`` code cells that each raise; the first with a source, an error, a traceback and
    printed text of 100,000 characters each (the others' are short, to keep the file small)."""
    listed = []
    for number in range(1, cells + 1):
        size = 100_000 if number == 1 else 200
        listed.append({"cell_type": "code", "id": f"c{number}", "metadata": {}, "execution_count": number,
                       "source": f"raise ValueError({number})  # " + worst_text(size),
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": worst_text(size)},
                                   {"output_type": "error", "ename": "ValueError", "evalue": worst_text(size),
                                    "traceback": [f"Cell In[{number}], line 1", worst_text(size)]}]})
    return json.dumps({"cells": listed, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def raiser(assignment):
    """3,000 raising cells, a HUGE message on the item they cost, notes and timings for each cell."""
    result = recorded(assignment, "raiser", {"notebook_runs": worst_text(HUGE, "cells raised")})
    result.notes = [f"note {n}: " + worst_text(1000) for n in range(RAISING_CELLS)]
    result.stages = [(f"code cell {n} (In[{n}])", 0.5) for n in range(1, RAISING_CELLS + 1)]
    result.submitted_as = worst_text(5000)
    result.artifacts = {EXECUTED_NOTEBOOK: raising_notebook(RAISING_CELLS)}
    return result


def writer(assignment, name: str):
    """Ten HUGE written answers (one per question); the first question with HUGE grounding
    values, drafted by the model with HUGE feedback, rationales and flags, the second pending
    with a HUGE message."""
    first, second = assignment.rubric.questions[:2]
    drafted = {"score": 0.0, "status": "pending_review", "output": worst_text(HUGE, "draft"),
               "details": {"model": "claude-test", "confidence": 0.4, "draft_score": 1.0, "needs_review": True,
                           "criteria": [{"id": c.id, "points": 0.0, "max_points": c.points, "suggested": c.points,
                                         "rationale": worst_text(HUGE, "why"), "waits": worst_text(HUGE, "waits"),
                                         "evidence": [worst_text(HUGE, f"quote {n}") for n in range(2 * MAX_QUOTES)]}
                                        for c in first.criteria],
                           "feedback": worst_text(HUGE, "feedback"),
                           "flags": [worst_text(HUGE // 4, f"flag {n}") for n in range(4)]}}
    written = {first.item_name: drafted, second.item_name: {"output": worst_text(HUGE, "pending")}}
    result = recorded(assignment, name, written=written)
    questions = assignment.rubric.questions
    # Few words apiece (the similarity search reads words), so that answers differ and stay cheap.
    inputs = {"answers": {q.id: worst_text(HUGE, f"{name} answers {q.id} in words of its own")
                          for q in questions},
              **{part: {first.id: {"VALUE": worst_text(HUGE)}} for part in ("reported", "grounding", "agreement")}}
    result.artifacts = {WRITTEN_INPUTS: json.dumps(inputs).encode()}
    return result


def honest(assignment, name: str, executed: bytes):
    """A result as an honest submission makes one: two raising cells, the reference answers."""
    result = recorded(assignment, name, {"notebook_runs": "2 cells raised an error"})
    answers = {qid: answer.answer for qid, answer in assignment.reference_answers.items()}
    result.artifacts = {EXECUTED_NOTEBOOK: executed,
                        WRITTEN_INPUTS: json.dumps({"answers": answers, "grounding": {}}).encode()}
    return result


def sizes(out: Path) -> dict[str, int]:
    return {str(path.relative_to(out)): path.stat().st_size
            for path in sorted(out.glob("**/*.html"))}


@pytest.fixture(scope="module")
def extreme(tmp_path_factory, assignment) -> tuple[Path, dict[str, int], float]:
    """(output folder, page sizes, seconds to render) of a class of one raiser and four writers."""
    out = tmp_path_factory.mktemp("extreme")
    for result in (raiser(assignment), *(writer(assignment, f"writer{n}") for n in range(4))):
        write_result(out, result)
    started = time.monotonic()
    write_pages(out, read_results(out))
    seconds = time.monotonic() - started
    found = sizes(out)
    print(f"\nrendered in {seconds:.1f} s: " + ", ".join(f"{name} {size:,} B" for name, size in found.items()))
    return out, found, seconds


def queue_page_bound(page: str) -> int:
    """pages.py's stated bound for a queue page, from the rows and members it lists."""
    rows, members = page.count('<pre class="block">'), page.count("<li>")
    return 20_000 + 5 * MAX_EXCERPT_CHARS * rows + (5 * MAX_LINE_CHARS + 2_000) * members


def test_every_page_of_extreme_submissions_is_under_its_stated_bound(extreme, assignment):
    out, found, _ = extreme
    bounds = {REPORT_PAGE: submission_page_bound(assignment), REVIEW_PAGE: submission_page_bound(assignment),
              EXECUTED_PAGE: EXECUTED_PAGE_BOUND, SUMMARY_PAGE: summary_bound(assignment, 5),
              **{name: queue_page_bound((out / name).read_text()) for name in found if name.startswith("queue/")}}
    print("bounds: " + ", ".join(f"{name} {bound:,} B" for name, bound in bounds.items()))
    bound_of = {name: bounds.get(name, bounds.get(Path(name).name)) for name in found}
    over = {name: (size, bound_of[name]) for name, size in found.items() if size > bound_of[name]}
    assert over == {}, f"pages over their bound (size, bound): {over}; all sizes: {found}"
    # every page was made, the executed page included
    assert {REPORT_PAGE, REVIEW_PAGE, EXECUTED_PAGE} <= {Path(n).name for n in found if n.startswith("raiser/")}
    assert len([n for n in found if n.endswith(REVIEW_PAGE)]) == 5


def test_the_cuts_are_said_on_the_pages(extreme, assignment):
    out = extreme[0]
    results = {r.submission_id: r for r in read_results(out)}
    item_output = next(i.output for i in results["raiser"].items if i.name == "notebook_runs")
    for page_name in (REPORT_PAGE, REVIEW_PAGE):
        page = (out / "raiser" / page_name).read_text()
        assert str(markupsafe.escape(cut(item_output, MAX_TEXT_CHARS, RESULTS_FILE))) in page
        assert f"and {RAISING_CELLS - MAX_LISTED_CELLS} more cells raised an error" in page
        assert page.count('<div class="cell"') == MAX_LISTED_CELLS
    review = (out / "raiser" / REVIEW_PAGE).read_text()
    assert f"and {RAISING_CELLS + 1 - MAX_LISTED_STAGES} more stages" in review
    assert f"see {RESULTS_FILE}" in review and f'see <a href="{EXECUTED_PAGE}">{EXECUTED_PAGE}</a> / {EXECUTED_NOTEBOOK}.' in review
    executed = (out / "raiser" / EXECUTED_PAGE).read_text()
    assert 'id="cells-left-out"' in executed and f"{EXECUTED_NOTEBOOK} holds them all" in executed
    answers = json.loads((out / "writer0" / WRITTEN_INPUTS).read_text())["answers"]
    question = assignment.rubric.questions[0]
    writer_review = (out / "writer0" / REVIEW_PAGE).read_text()
    assert str(markupsafe.escape(cut(answers[question.id], MAX_ANSWER_CHARS, WRITTEN_INPUTS))) in writer_review
    assert writer_review.count(CUT_SAID + WRITTEN_INPUTS) == len(assignment.rubric.questions) + 3  # answers, grounding
    queue = (out / QUEUE_FOLDER / f"{question.item_name}-1.html").read_text()
    assert str(markupsafe.escape(cut(answers[question.id], MAX_EXCERPT_CHARS, WRITTEN_INPUTS))) in queue
    # the four writers' answers differ by a name only: one group, its first answer shown (cut)
    assert queue.count(CUT_SAID + WRITTEN_INPUTS) == 1 and all(f"writer{n}/review.html" in queue for n in range(4))


def test_the_result_files_keep_the_full_text(extreme, assignment):
    out = extreme[0]
    raiser_json = json.loads((out / "raiser" / RESULTS_FILE).read_text())
    runs = next(t for t in raiser_json["tests"] if t["extra_data"]["id"] == "notebook_runs")
    assert runs["output"].endswith(worst_text(HUGE, "cells raised")) and len(runs["output"]) > HUGE
    assert (out / "raiser" / EXECUTED_NOTEBOOK).read_bytes() == raising_notebook(RAISING_CELLS)
    assert (out / "writer0" / WRITTEN_INPUTS).read_bytes() == writer(assignment, "writer0").artifacts[WRITTEN_INPUTS]
    first = assignment.rubric.questions[0]
    drafted = next(t for t in json.loads((out / "writer0" / RESULTS_FILE).read_text())["tests"]
                   if t["extra_data"]["id"] == first.item_name)
    assert drafted["extra_data"]["details"]["feedback"] == worst_text(HUGE, "feedback")


def test_the_summary_grows_by_a_bounded_share_per_student(tmp_path, assignment):
    """Twice the writers: the summary grows by no more than the stated share per student."""
    measured = {}
    for students in (2, 4):
        out = tmp_path / f"class_of_{students}"
        for n in range(students):
            write_result(out, writer(assignment, f"writer{n}"))
        write_pages(out, read_results(out))
        measured[students] = (out / SUMMARY_PAGE).stat().st_size
    share = (measured[4] - measured[2]) / 2
    per_student = summary_bound(assignment, 1) - summary_bound(assignment, 0)
    print(f"\nsummary.html: {measured} B; {share:,.0f} B per student, stated share {per_student:,} B")
    assert measured[2] <= summary_bound(assignment, 2) and measured[4] <= summary_bound(assignment, 4), measured
    assert 0 < share <= per_student, (measured, share, per_student)


def test_an_honest_submissions_pages_cut_nothing(tmp_path, assignment):
    """Two raising cells and the reference answers; the course's reference notebook as an
    executed notebook: no cut, no cell left unlisted, the answers whole on the pages. The one
    cut is by design: a queue page shows the start of each group's first answer (the two
    students' identical answers are one group)."""
    reference = (ROOT / "examples" / "submissions" / "linear_attention" / "reference.ipynb").read_bytes()
    for result in (honest(assignment, "two_cells", two_raising_cells()), honest(assignment, "reference", reference)):
        write_result(tmp_path, result)
    write_pages(tmp_path, read_results(tmp_path), release="published")
    found = sizes(tmp_path)
    print("\nhonest pages: " + ", ".join(f"{name} {size:,} B" for name, size in found.items()))
    assert (tmp_path / "reference" / EXECUTED_PAGE).is_file()
    for name in found:
        page = (tmp_path / name).read_text()
        if name.startswith(f"{QUEUE_FOLDER}/"):
            question = next(q for q in assignment.rubric.questions if name == f"{QUEUE_FOLDER}/{q.item_name}-1.html")
            answer = assignment.reference_answers[question.id].answer
            assert str(markupsafe.escape(cut(answer, MAX_EXCERPT_CHARS, WRITTEN_INPUTS))) in page
            assert page.count(CUT_SAID) == (len(answer) > MAX_EXCERPT_CHARS) and page.count('<pre class="block">') == 1
            continue
        for notice in (CUT_SAID, 'id="unlisted-cells"', 'id="unlisted-stages"', 'id="cells-left-out"'):
            assert notice not in page, (name, notice)
    review = (tmp_path / "two_cells" / REVIEW_PAGE).read_text()
    assert all(str(markupsafe.escape(answer.answer)) in review for answer in assignment.reference_answers.values())
