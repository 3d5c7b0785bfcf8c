"""What a student and a TA see of one submission, in process: raising cells as the student
numbers them and the items they cost, written answers beside their question and criteria, the
review queue grouped and ordered, and the release state kept by the output folder."""
from __future__ import annotations

import html
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from grader.cli import main
from grader.pipeline import EXECUTED_NOTEBOOK
from grader.report.pages import (QUEUE_FOLDER, RELEASE_FILE, REPORT_PAGE, REVIEW_PAGE, SUMMARY_PAGE, queue_page_name,
                                 release_state, review_queue, write_pages)
from grader.report.results import read_results, write_result
from grader.written import WRITTEN_INPUTS

from test_reports import folder, recorded  # noqa: F401  (the recorded three-submission folder)


def _code(source: str, cell_id: str, count: int | None, error: tuple[str, str] | None = None) -> dict:
    outputs = [{"output_type": "error", "ename": error[0], "evalue": error[1],
                "traceback": [f"Cell In[{count}], line 1", f"{error[0]}: {error[1]}"]}] if error else []
    return {"cell_type": "code", "id": cell_id, "source": source, "execution_count": count, "outputs": outputs,
            "metadata": {}}


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "id": f"md-{abs(hash(text))}", "source": text, "metadata": {}}


def two_raising_cells() -> bytes:
    """Markdown between code cells (so notebook position and code-cell number differ), a student
    cell that raises, and the Exercise 5 cell (the master's id) raising too."""
    cells = [_markdown("# Linear attention"), _code("import torch", "setup", 1), _markdown("## Exercise 1"),
             _code("x = undefined_name + 1", "mine-1", 2, ("NameError", "name 'undefined_name' is not defined")),
             _markdown("## Exercise 5"),
             _code("# Exercise 5: the memory bill\nMEMORY_BILL = memory_bill()", "ex5-memory-bill", 3,
                   ("NotImplementedError", "TODO: the memory bill"))]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def test_raising_cells_are_numbered_as_the_student_counts_them_and_link_the_items_they_cost(tmp_path, assignment):
    missing = "MEMORY_BILL is not defined after running the notebook"
    bills = [i.name for i in assignment.rubric.items if i.name.startswith("bill_")]
    result = recorded(assignment, "dave", {"notebook_runs": "cells raised", **{name: missing for name in bills}})
    result.artifacts = {EXECUTED_NOTEBOOK: two_raising_cells()}
    write_result(tmp_path, result)
    write_pages(tmp_path, read_results(tmp_path))
    for page_name in (REPORT_PAGE, REVIEW_PAGE):
        html = (tmp_path / "dave" / page_name).read_text()
        boxes = re.findall(r'<div class="cell" id="(cell-\d+)">(.*?)</div>', html, re.S)
        # code cells 2 and 3 (notebook positions 3 and 5), each shown once with its In [n]
        assert [anchor for anchor, _ in boxes] == ["cell-2", "cell-3"], page_name
        first, fifth = boxes[0][1], boxes[1][1]
        assert "code cell 2 (In[2])" in first and "<code>x = undefined_name + 1</code>" in first
        assert "code cell 3 (In[3])" in fifth and "<code># Exercise 5: the memory bill</code>" in fifth
        # the student's own cell costs the run only; Exercise 5's cell costs the run and every bill item
        assert re.findall(r'href="#item-([a-z_A-Z0-9]+)"', first) == ["notebook_runs"]
        assert re.findall(r'href="#item-([a-z_A-Z0-9]+)"', fifth) == ["notebook_runs", *bills]
        card = re.search(rf'<div class="item" id="item-{bills[0]}">(.*?)</div>', html, re.S).group(1)
        assert 'Cost by the error in <a href="#cell-3">code cell 3 (In[3])</a>' in card
        assert html.count('class="cell"') == 2 and len(re.findall(r'<div class="item"', html)) == len(
            re.findall(r'<div class="item" id="item-[^"]+"', html))


def test_the_ta_page_shows_each_answer_beside_its_question_criteria_and_grounding(folder, assignment):  # noqa: F811
    question = assignment.rubric.questions[0]
    inputs = folder / "alice" / WRITTEN_INPUTS
    recorded_inputs = json.loads(inputs.read_text())
    recorded_inputs["grounding"] = {question.id: {"DECODE_BENCHMARK": {"history_lengths": [64, 1024]}}}
    recorded_inputs["reported"] = {question.id: {"DECODE_BENCHMARK": {"history_lengths": [64, 16384]}}}
    inputs.write_text(json.dumps(recorded_inputs))
    write_pages(folder, read_results(folder), release="published")
    review = (folder / "alice" / REVIEW_PAGE).read_text()
    card = re.search(rf'<div class="item" id="item-{question.item_name}">(.*?)\n</div>', review, re.S).group(1)
    asked = assignment.reference_answers[question.id].question
    assert f'<blockquote class="question">{asked[:40]}' in card.replace("&#39;", "'")
    assert "the student&#39;s answer" in card and "your answer" not in card
    for criterion in question.criteria:
        # the criterion, what earns it, the model's points, its rationale and its evidence, on one row
        row = re.search(rf"<tr><td>{criterion.id}</td><td>(.*?)</td><td class=\"num\">(.*?)</td><td>(.*?)</td>"
                        r"<td>(.*?)</td></tr>", card).groups()
        assert row[0][:30] == criterion.earns[:30].replace('"', "&#34;").replace("'", "&#39;")
        assert row[1] == f"{criterion.points:g} / {criterion.points:g}" and row[2] == f"meets {criterion.id}"
    assert "grounding values this answer was judged against" in card
    reported, rerun = card.index("the student&#39;s reported run"), card.index("the grader&#39;s re-run")
    assert reported < card.index("16384") < rerun < card.index("1024", rerun)
    student = (folder / "alice" / REPORT_PAGE).read_text()
    assert "your answer" in student and "what earns it" not in student and "judged against" not in student


def test_the_queue_is_grouped_by_question_flagged_first_then_by_confidence_then_undrafted(tmp_path, assignment):
    question = assignment.rubric.questions[0]

    def draft(confidence: float, flags: list[str]) -> dict:
        return {question.item_name: {"score": 0.0, "status": "pending_review", "output": "draft", "details": {
            "model": "m", "confidence": confidence, "draft_score": 1.0, "criteria": [], "feedback": "",
            "flags": flags, "needs_review": True}}}
    results = {"sure": recorded(assignment, "sure", written=draft(0.8, [])),
               "unsure": recorded(assignment, "unsure", written=draft(0.3, [])),
               "flagged": recorded(assignment, "flagged", written=draft(0.95, ["addresses the grader"])),
               "nodraft": recorded(assignment, "nodraft", {"equivalence": "x"})}
    results["nodraft"].items = [i if i.name != "causality" else type(i)(**{**vars(i), "status": "error",
                                                                           "output": "could not be graded: boom"})
                                for i in results["nodraft"].items]
    for sid, result in results.items():
        result.artifacts = {WRITTEN_INPUTS: json.dumps({"answers": {question.id: f"answer of {sid}"}}).encode()}
        write_result(tmp_path, result)
    read = read_results(tmp_path)
    queue = review_queue(tmp_path, read)
    first = [e.submission_id for e in queue if e.item == question.item_name]
    assert first == ["flagged", "unsure", "sure", "nodraft"]
    assert [e.answer for e in queue if e.item == question.item_name][0] == "answer of flagged"
    written_end = max(i for i, e in enumerate(queue) if e.written)
    assert all(not e.written for e in queue[written_end + 1:]) and queue[-1].item == "causality"
    write_pages(tmp_path, read)
    summary = (tmp_path / SUMMARY_PAGE).read_text()
    # the class page lists the queue's pages, the question first, then the errored items
    listed = re.findall(r'<tr><td><a href="queue/([^"]+)-1.html">(.*?)</a>', summary)
    assert listed[0] == (question.item_name, f"Written: {question.id}") and listed[-1][0] == "causality"
    page = (tmp_path / QUEUE_FOLDER / queue_page_name(question.item_name, 1)).read_text()
    members = re.findall(r'<li><a href="../([^/]+)/review.html#item-', page)
    assert members == ["flagged", "unsure", "sure", "nodraft"] and "answer of unsure" in page   # distinct: a row each
    blocks = [yaml.safe_load(html.unescape(b)) for b in re.findall(r'<pre class="block">(.*?)</pre>', page, re.S)]
    assert [list(b) for b in blocks] == [["flagged"], ["unsure"], ["sure"], ["nodraft"]]


def test_the_release_state_is_the_folders_until_changed(folder):  # noqa: F811
    assert release_state(folder) == "none"
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder), "--release", "published"]) == 0
    assert json.loads((folder / RELEASE_FILE).read_text())["release"] == "published"
    with redirect_stdout(io.StringIO()) as printed:
        assert main(["report", str(folder)]) == 0          # re-rendered after overrides: still published
    assert "released to students: published" in printed.getvalue()
    assert "Written: " in (folder / "carol" / REPORT_PAGE).read_text()
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder), "--release", "none"]) == 0
    assert "Written: " not in (folder / "carol" / REPORT_PAGE).read_text()
    (folder / RELEASE_FILE).write_text('{"release": "everything"}')
    with redirect_stderr(io.StringIO()) as said:
        assert main(["report", str(folder)]) == 2            # a hand-edited state is an error, not a guess
    assert "release.json: release 'everything' is not one of" in said.getvalue()
