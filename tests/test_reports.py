"""Reports on recorded results, in process: pages, review queue, similarity groups, score changes,
the Canvas export and the terminal. (Pages of a really graded batch, in a real browser, are
tested in test_grading.py and test_pages.py.)"""
from __future__ import annotations

import csv
import html
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import markupsafe
import pytest
import yaml

from grader import cells
from grader.cli import main
from grader.pipeline import EXECUTED_NOTEBOOK, GRADER_ERRORS, SCAFFOLD_SOURCE
from grader.report.changes import CHANGES_FILE, read_changes, record_changes
from grader.report.export import ExportError, export_canvas
from grader.report.pages import (QUEUE_FOLDER, REPORT_PAGE, REVIEW_PAGE, SUMMARY_PAGE, common_failures,
                                 override_lines, queue_page_name, review_queue, write_pages)
from grader.report.results import GRADEBOOK_FILE, read_results, write_result
from grader.report.terminal import RunProgress, print_scores
from grader.score import WAITING, GradeResult, ItemResult
from grader.similarity import flagged_groups, read_similarity, write_similarity
from grader.written import WRITTEN_INPUTS

from conftest import SCAFFOLDS

HOSTILE = "<script>alert('x')</script>"


def recorded(assignment, submission_id: str, failed: dict[str, str] | None = None,
             written: dict[str, dict] | None = None) -> GradeResult:
    """A result as the pipeline writes it: every check passed except ``failed`` (id -> message),
    written items pending unless ``written`` gives their (score, status, details)."""
    failed = failed or {}
    items = [ItemResult(i.name, i.title, 0.0 if i.name in failed else i.points, i.points,
                        "failed" if i.name in failed else "passed", f"{i.title}\n{failed.get(i.name, 'ok')}",
                        list(i.tags), i.visibility) for i in assignment.rubric.items]
    for q in assignment.rubric.questions:
        entry = (written or {}).get(q.item_name, {})
        items.append(ItemResult(q.item_name, f"Written: {q.id}", entry.get("score", 0.0), q.points,
                                entry.get("status", "pending_review"), entry.get("output", "awaiting review"),
                                ["written"], "after_published", details=entry.get("details")))
    return GradeResult(submission_id, "linear_attention", "0.2.0", submission_id.encode().hex().ljust(64, "0"),
                       items, execution_time=12.5)


def executed_with_error(traceback_line: str) -> bytes:
    notebook = {"cells": [
        {"cell_type": "code", "id": "fine", "source": "print('fine')", "metadata": {}, "execution_count": 1,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "fine\n"}]},
        {"cell_type": "code", "id": "boom", "source": "boom()", "metadata": {}, "execution_count": 2, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["before the error ", HOSTILE, "\n"]},
            {"output_type": "error", "ename": "NameError", "evalue": "name 'boom' is not defined",
             "traceback": ["\x1b[0;31mNameError\x1b[0m  Traceback", traceback_line]}]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(notebook).encode()


@pytest.fixture
def folder(tmp_path, assignment) -> Path:
    """Three recorded submissions: one failing with a cell error and a flagged written answer,
    one LLM-graded, one whose scaffold is a renamed copy of another's."""
    first_question = assignment.rubric.questions[0]
    criteria = [{"id": c.id, "points": c.points, "max_points": c.points, "rationale": f"meets {c.id}"}
                for c in first_question.criteria]
    graded = {"written_" + first_question.id: {
        "score": first_question.points, "status": "passed", "output": "LLM draft",
        "details": {"model": "claude-test", "confidence": 0.9, "draft_score": first_question.points,
                    "criteria": criteria, "feedback": "Clear derivation.", "flags": [], "needs_review": False}}}
    flagged = {"written_" + first_question.id: {
        "score": 0.0, "status": "pending_review", "output": WAITING,
        "details": {"model": "claude-test", "confidence": 0.5, "draft_score": 2.0, "criteria": criteria,
                    "feedback": "ok", "flags": ["addresses the grader: 'ignore previous instructions'"],
                    "needs_review": False}}}
    carol = recorded(assignment, "carol", {"equivalence": f"float64: max-abs error 0.07 at position 16 {HOSTILE}",
                                           "decay_recurrent": "step decays S but not z"}, flagged)
    carol.items = [replace(i, score=0.0, status="error", output="grader error in check state_resume, please report it")
                   if i.name == "state_resume" else i for i in carol.items]
    carol.grader_errors = ["state_resume"]
    carol.artifacts = {EXECUTED_NOTEBOOK: executed_with_error("Cell In[2], line 1"),
                       GRADER_ERRORS: b"Traceback: grader/checks/linear_attention/items.py SECRET_CHECK_LINE",
                       WRITTEN_INPUTS: json.dumps({"answers": {first_question.id: f"My answer {HOSTILE}"}}).encode(),
                       SCAFFOLD_SOURCE: (SCAFFOLDS / "correct_einsum.py").read_bytes()}
    alice = recorded(assignment, "alice", written=graded)
    source = (SCAFFOLDS / "correct_bmm.py").read_text()
    alice.artifacts = {SCAFFOLD_SOURCE: source.encode(),
                       WRITTEN_INPUTS: json.dumps({"answers": {first_question.id: "An answer of my own words."}}).encode()}
    bob = recorded(assignment, "bob", {"causality": "output 3 changed when token 7 changed"})
    renamed = re.sub(r"\bq\b", "query", re.sub(r"\bk\b", "key", source)).replace("    ", "  ")
    bob.artifacts = {SCAFFOLD_SOURCE: ("# my own work\n" + renamed).encode()}
    for result in (alice, bob, carol):
        write_result(tmp_path, result)
    return tmp_path


def page(path: Path) -> str:
    return path.read_text()


def test_student_page_shows_released_items_escaped_and_no_internals(folder, assignment):
    results = read_results(folder)
    write_pages(folder, results)
    carol = page(folder / "carol" / REPORT_PAGE)
    checks_max = sum(i.points for i in assignment.rubric.items)
    lost = sum(i.points for i in assignment.rubric.items if i.name in ("equivalence", "decay_recurrent", "state_resume"))
    # written items are after_published: not shown before release, and the total says so
    assert f"{checks_max - lost:g} / {checks_max:g} points" in carol
    assert "Written: " not in carol and "will appear here once released" in carol
    assert "max-abs error 0.07 at position 16" in carol
    assert HOSTILE not in carol and "&lt;script&gt;" in carol          # student text is escaped
    assert "code cell 2" in carol and "starts <code>boom()</code>" in carol and "NameError: name &#39;boom&#39; is not defined" in carol
    assert "\x1b[" not in carol and "before the error" in carol       # ANSI colour codes stripped
    assert "SECRET_CHECK_LINE" not in carol and "overrides.yaml lines" not in carol
    write_pages(folder, results, release="published")
    carol = page(folder / "carol" / REPORT_PAGE)
    assert "Written: " in carol and "My answer" in carol and WAITING in carol
    # why a TA must look is the TA's: the student is never told they were suspected
    assert "lagged" not in carol and "addresses the grader" not in carol
    assert "Waiting for a TA: addresses the grader" in page(folder / "carol" / REVIEW_PAGE)
    alice = page(folder / "alice" / REPORT_PAGE)
    assert "Clear derivation." in alice and "meets " in alice and "claude-test" in alice


def test_review_page_and_queue_carry_the_override_lines_that_settle_them(folder, assignment):
    results = read_results(folder)
    write_pages(folder, results)
    review = page(folder / "carol" / REVIEW_PAGE)
    assert "Written: " in review and "overrides.yaml lines" in review   # TAs see every item
    queue = review_queue(folder, results)
    flagged = next(e for e in queue if e.submission_id == "carol" and "flagged" in e.reason)
    queue_page = page(folder / QUEUE_FOLDER / queue_page_name(flagged.item, 1))
    assert f'<a href="../carol/{REVIEW_PAGE}#item-{flagged.item}">carol</a>' in queue_page
    assert yaml.safe_load(flagged.yaml) == {"carol": {flagged.item: {"score": 2.0, "comment": "", "reviewer": ""}}}
    pending = {(e.submission_id, e.item) for e in queue if e.reason.startswith("written answer awaiting")}
    assert ("bob", flagged.item) in pending and ("alice", flagged.item) not in pending
    assert any(e.submission_id == "carol" and e.item == "state_resume" and e.reason.startswith("internal grader error")
               for e in queue)
    summary = page(folder / SUMMARY_PAGE)
    assert f'<a href="queue/{queue_page_name(flagged.item, 1)}">' in summary and "<svg" in summary
    assert f'<a href="queue/{queue_page_name("state_resume", 1)}">' in summary
    assert "SECRET_CHECK_LINE" not in summary + queue_page

    # Pasting the queue's lines into overrides.yaml confirms the score and empties that entry.
    (folder / "overrides.yaml").write_text(flagged.yaml.replace('reviewer: ""', "reviewer: jdoe"))
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    results = read_results(folder)
    carol = next(r for r in results if r.submission_id == "carol")
    assert next(i for i in carol.items if i.name == flagged.item).score == 2.0
    assert not any(e.submission_id == "carol" and e.item == flagged.item for e in review_queue(folder, results))
    summary = page(folder / SUMMARY_PAGE)
    assert 'id="overrides"' in summary and "jdoe" in summary


def test_a_page_is_redrawn_when_what_it_shows_changes_and_only_then(folder, assignment):
    def drawn() -> dict[str, int]:
        return {**{f"{sid}/{name}": (folder / sid / name).stat().st_mtime_ns
                   for sid in ("alice", "bob", "carol") for name in (REPORT_PAGE, REVIEW_PAGE)},
                SUMMARY_PAGE: (folder / SUMMARY_PAGE).stat().st_mtime_ns}

    def shown_items(sid: str) -> int:
        return page(folder / sid / REPORT_PAGE).count('<span class="state ')

    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    first, items = drawn(), shown_items("carol")
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    assert drawn() == first   # nothing changed: no page is drawn again

    with redirect_stdout(io.StringIO()):   # every student page now shows the written items too
        assert main(["report", str(folder), "--release", "published"]) == 0
    released = drawn()
    assert all(released[page_] != first[page_] for page_ in released)
    assert shown_items("carol") == items + len(assignment.rubric.questions)

    item = assignment.rubric.items[0].name   # a TA's override of one item of bob's
    (folder / "overrides.yaml").write_text(yaml.safe_dump(
        {"bob": {item: {"score": 0.0, "comment": "copied", "reviewer": "jdoe"}}}))
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    overridden = drawn()
    assert {name for name in overridden if overridden[name] != released[name]} == {
        f"bob/{REPORT_PAGE}", f"bob/{REVIEW_PAGE}", SUMMARY_PAGE}   # the summary lists overrides
    assert "jdoe" in page(folder / "bob" / REVIEW_PAGE)


def test_common_failures_and_pass_rates_in_the_summary(folder):
    write_pages(folder, read_results(folder))
    summary = page(folder / SUMMARY_PAGE)
    assert "step decays S but not z" in summary                      # the failure, counted
    assert "float64: max-abs error # at position #" in summary       # numbers blanked for grouping, not names
    assert summary.count("<svg") == 2 and "<?xml" not in summary     # histogram + pass rates, inline
    assert "mean 12.5 s, longest 12.5 s" in summary


def test_gradebook_leaves_pending_items_empty_and_counts_them(folder, assignment):
    """A pending written answer has no score yet: an empty cell, counted in `pending`, never a 0
    (which is what a failed item shows)."""
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    with (folder / GRADEBOOK_FILE).open(newline="") as handle:
        rows = {r["submission_id"]: r for r in csv.DictReader(handle)}
    written = [q.item_name for q in assignment.rubric.questions]
    first = written[0]
    checks = {i.name: i.points for i in assignment.rubric.items}
    assert [rows["bob"][w] for w in written] == [""] * len(written) and rows["bob"]["pending"] == str(len(written))
    assert rows["bob"]["causality"] == "0"                                     # failed: a score of 0
    assert float(rows["bob"]["total"]) == sum(checks.values()) - checks["causality"]
    assert rows["alice"][first] == f"{assignment.rubric.questions[0].points:g}"
    assert [rows["alice"][w] for w in written[1:]] == [""] * (len(written) - 1)
    assert rows["alice"]["pending"] == str(len(written) - 1)
    assert float(rows["alice"]["total"]) == sum(checks.values()) + assignment.rubric.questions[0].points
    # carol's flagged answer waits for a TA (its draft's 2 points are not in the total); her errored item is a 0
    assert rows["carol"][first] == "" and rows["carol"]["pending"] == str(len(written))
    assert rows["carol"]["state_resume"] == "0" and rows["carol"]["max"] == f"{assignment.rubric.max_score:g}"


def _pass_rate_labels(summary: str) -> dict[str, str]:
    """item id -> the text drawn beside its bar in the summary's pass-rate chart."""
    figure = summary.split('id="pass-rates"', 1)[1].split("</figure>", 1)[0]
    return dict(re.findall(r'<g id="rate-([^"]+)">\s*<text[^>]*>([^<]*)</text>', figure))


def _bar_widths(summary: str) -> dict[str, float]:
    """item id -> the drawn width of its bar (SVG units)."""
    figure = summary.split('id="pass-rates"', 1)[1].split("</figure>", 1)[0]
    widths = {}
    for name, path in re.findall(r'<g id="bar-([^"]+)">\s*<path d="([^"]*)"', figure):
        xs = [float(x) for x in re.findall(r"[ML] ([-\d.]+) [-\d.]+", path)]
        widths[name] = max(xs) - min(xs)
    return widths


def test_summary_pass_rates_leave_pending_out_and_say_how_many(folder, assignment):
    """The rate is passed / graded; pending items are counted beside the bar, not as failures."""
    write_pages(folder, read_results(folder))
    summary = page(folder / SUMMARY_PAGE)
    labels, widths = _pass_rate_labels(summary), _bar_widths(summary)
    written = [q.item_name for q in assignment.rubric.questions]
    assert set(labels) == set(widths) == {i.name for i in assignment.rubric.items} | set(written)
    # the first question: alice's draft passed; bob's and carol's (flagged) wait
    assert labels[written[0]] == "100% (1 of 1), 2 pending"
    assert all(labels[w] == "none graded yet, 3 pending" for w in written[1:])
    assert labels["equivalence"] == labels["causality"] == "67% (2 of 3)"      # carol's, bob's failure
    assert labels["state_resume"] == "67% (2 of 3)"                            # carol's error is graded
    assert labels["notebook_runs"] == "100% (3 of 3)"
    full = widths["notebook_runs"]
    assert full > 0 and widths[written[0]] == pytest.approx(full)
    assert widths["equivalence"] == pytest.approx(full * 2 / 3) and all(widths[w] == 0 for w in written[1:])
    pending = 2 + 3 * (len(written) - 1)
    assert f"the number pending is beside each bar ({pending} in all)" in summary


def similar_on_the_summary(folder: Path, assignment) -> list[tuple[tuple[str, ...], str]]:
    """The class compared (grader.similarity) and its pages written: the summary's groups."""
    write_similarity(folder, read_results(folder), assignment)
    write_pages(folder, read_results(folder))
    return [(g.members, g.what) for g in flagged_groups(read_similarity(folder))]


def test_similarity_pairs_a_renamed_copy_only(folder, assignment):
    assert similar_on_the_summary(folder, assignment) == [(("alice", "bob"), "code")]
    summary = page(folder / SUMMARY_PAGE)
    rows = summary.split('<table id="similar">')[1].split("</table>")[0].count("<tr><td>")
    assert rows == 1 and "alice</a>, <a" in summary


def test_similarity_leaves_out_untouched_templates_and_pairs_copied_answers(tmp_path, assignment):
    template = "\n".join(cells.source(c) for c in assignment.template.cells if cells.SCAFFOLD in cells.tags(c))
    answer = ("The KV cache grows linearly with the number of tokens because every layer keeps "
              "a key and a value for each head, while the linear state stays fixed.")
    for name, text in (("u1", answer), ("u2", answer.replace("because", "since")), ("u3", "Short.")):
        result = recorded(assignment, name)
        result.artifacts = {SCAFFOLD_SOURCE: template.encode(),
                            WRITTEN_INPUTS: json.dumps({"answers": {"ex5_memory_bill": text}}).encode()}
        write_result(tmp_path, result)
    assert similar_on_the_summary(tmp_path, assignment) == [(("u1", "u2"), "written answer ex5_memory_bill")]
    summary = page(tmp_path / SUMMARY_PAGE)
    assert "written answer ex5_memory_bill" in summary and "<td>code</td>" not in summary


def test_similarity_lists_a_ring_of_copies_as_one_group_on_the_page(tmp_path, assignment):
    template = "\n".join(cells.source(c) for c in assignment.template.cells if cells.SCAFFOLD in cells.tags(c))
    answer = ("The KV cache grows linearly with the number of tokens because every layer keeps "
              "a key and a value for each head, while the linear state stays fixed.")
    other = ("Attention over a prefix costs quadratic time in its length, which the recurrent form "
             "avoids by folding every token into a state of constant size as it arrives.")
    texts = {**{f"c{k}": answer for k in range(4)}, "c4": answer.replace("because", "since"), "c5": other}
    for name, text in texts.items():
        result = recorded(assignment, name)
        result.artifacts = {SCAFFOLD_SOURCE: template.encode(),
                            WRITTEN_INPUTS: json.dumps({"answers": {"ex5_memory_bill": text}}).encode()}
        write_result(tmp_path, result)
    assert similar_on_the_summary(tmp_path, assignment) == [(("c0", "c1", "c2", "c3", "c4"),
                                                            "written answer ex5_memory_bill")]
    (group,) = flagged_groups(read_similarity(tmp_path))
    assert 0.5 <= group.similarity < 1
    table = page(tmp_path / SUMMARY_PAGE).split('<table id="similar">')[1].split("</table>")[0]
    rows = table.split("<tr><td>")[1:]
    assert len(rows) == 1
    assert [name for name in texts if f">{name}</a>" in rows[0]] == ["c0", "c1", "c2", "c3", "c4"]
    assert f"{group.similarity:.3f}" in rows[0]


def test_score_changes_list_old_and_new_per_item(tmp_path, assignment):
    before = recorded(assignment, "alice")
    after = recorded(assignment, "alice", {"causality": "now caught"})
    after = replace(after, grader_version="0.3.0")
    assert record_changes(tmp_path, {"alice": before}, [after, recorded(assignment, "new")])
    (change,) = read_changes(tmp_path)
    assert change["items"] == [{"id": "causality", "title": next(i.title for i in after.items if i.name == "causality"),
                                "old": 8.0, "new": 0.0}]
    assert (change["old_grader_version"], change["new_grader_version"], change["notebook_changed"]) == ("0.2.0", "0.3.0", False)
    assert record_changes(tmp_path, {"alice": after}, [after]) == []        # nothing new, nothing appended
    assert len(json.loads((tmp_path / CHANGES_FILE).read_text())) == 1
    write_result(tmp_path, after)
    write_pages(tmp_path, read_results(tmp_path))
    summary = page(tmp_path / SUMMARY_PAGE)
    assert "grader 0.2.0 &rarr; 0.3.0" in summary and ": 8 &rarr; 0" in summary


def write_roster(path: Path, ids: list[str]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission_id", "Student", "ID", "SIS User ID", "SIS Login ID", "Section"])
        for n, submission_id in enumerate(ids):
            writer.writerow([submission_id, f"Student, {submission_id.title()}", 1000 + n, f"S{n}", submission_id, "L01"])
    return path


def test_canvas_export_has_canvas_columns_and_lists_everyone_left_out(folder):
    roster = write_roster(folder / "roster.csv", ["alice", "bob", "dave"])
    target = folder / "canvas.csv"
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(io.StringIO()) as err:
        assert main(["export", str(folder), "--roster", str(roster), "--format", "canvas",
                     "--column", "Linear attention (4242)", "--out", str(target)]) == 0
    rows = list(csv.reader(target.open()))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Linear attention (4242)"]
    assert rows[1][0].strip() == "Points Possible" and float(rows[1][5]) == read_results(folder)[0].max_score
    scores = {r[3]: r[5] for r in rows[2:]}   # by SIS Login ID
    results = {r.submission_id: r for r in read_results(folder)}
    assert scores == {"alice": f"{results['alice'].score:g}", "bob": f"{results['bob'].score:g}", "dave": ""}
    assert "wrote" in out.getvalue() and "2 students" in out.getvalue()
    assert "not in the roster (not exported): carol" in err.getvalue()
    assert "without a submission (left empty): dave" in err.getvalue()
    assert ("2 of 2 exported totals still wait for review of written answers (exported as their graded points; "
            "export again after review): alice, bob") in err.getvalue()
    # Canvas's numeric rule: a total still waiting is its graded points, a number as in gradebook.csv
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(folder)]) == 0
    gradebook = {r["submission_id"]: r for r in csv.DictReader((folder / GRADEBOOK_FILE).open(newline=""))}
    for login in ("alice", "bob"):
        assert float(scores[login]) == float(gradebook[login]["total"]) and int(gradebook[login]["pending"]) > 0


def test_canvas_export_rejects_a_bad_roster_or_header(folder, tmp_path):
    results = read_results(folder)
    roster = write_roster(tmp_path / "roster.csv", ["alice"])
    with pytest.raises(ExportError, match="Name \\(assignment id\\)"):
        export_canvas(results, roster, "Linear attention", tmp_path / "x.csv")
    (tmp_path / "bad.csv").write_text("submission_id,Student\nalice,A\n")
    with pytest.raises(ExportError, match="needs the columns ID, SIS User ID"):
        export_canvas(results, tmp_path / "bad.csv", "LA (1)", tmp_path / "x.csv")
    (tmp_path / "twice.csv").write_text(roster.read_text() + "alice,A,1,S,a,L\n")
    with pytest.raises(ExportError, match="appears twice"):
        export_canvas(results, tmp_path / "twice.csv", "LA (1)", tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


def test_terminal_progress_prints_a_line_per_unit_in_a_log(assignment):
    log = io.StringIO()
    with RunProgress(log, "grading", 2) as bar:
        bar.advance("alice: 81/106 (20 s)")
        bar.advance("bob: 60/106 (19 s)")
    assert log.getvalue().splitlines() == ["alice: 81/106 (20 s)", "bob: 60/106 (19 s)"]
    table = io.StringIO()
    print_scores([recorded(assignment, "alice", {"causality": "x"})], table)
    assert "alice" in table.getvalue() and "causality" in table.getvalue() and "10 written pending review" in table.getvalue()


def test_summary_shows_llm_tokens_and_cost(folder):
    write_pages(folder, read_results(folder))
    assert "The LLM was not used" in page(folder / SUMMARY_PAGE)
    (folder / "llm_usage.json").write_text(json.dumps({
        "mode": "batch", "model": "claude-test", "requests": 7, "input_tokens": 12345, "output_tokens": 678,
        "cache_write_tokens": 900, "cache_read_tokens": 5400, "cost_usd": 0.0421, "cached_drafts": 3,
        "graded": 10, "pending": 1}))
    write_pages(folder, read_results(folder))
    usage = re.search(r'<p id="usage">(.*?)</p>', page(folder / SUMMARY_PAGE), re.S).group(1)
    for words in ("batch with claude-test", "7 requests", "12345 input tokens", "678 output tokens", "$0.0421"):
        assert words in usage


def test_an_items_snippet_carries_its_override_so_pasting_it_again_loses_nothing():
    decided = ItemResult("written_x", "X", 2.0, 3.0, "failed", "o", ["written"],
                         override={"original_score": 0.0, "original_state": "pending_review", "score": 2.0,
                                   "comment": 'units "were" right: 16 GB', "reviewer": "jdoe", "notebook_sha256": "0"})
    assert yaml.safe_load(override_lines("alice", decided)) == {
        "alice": {"written_x": {"score": 2, "comment": 'units "were" right: 16 GB', "reviewer": "jdoe"}}}
    fresh = replace(decided, override=None, score=0.0)
    assert yaml.safe_load(override_lines("alice", fresh))["alice"]["written_x"] == {"score": 0, "comment": "",
                                                                                  "reviewer": ""}


def test_a_failure_cause_is_one_row_whatever_it_costs_and_numbers_are_masked_alike():
    raising = "forward\nforward raised NotImplementedError: TODO, at line 12; every item that needs forward is 0"
    def result(sid: str, outputs: dict[str, str]) -> GradeResult:
        return GradeResult(sid, "a", "v", "0", [ItemResult(name, name.title(), 0.0, 2.0, "failed", output, [])
                                                for name, output in outputs.items()])
    results = [result(sid, {"normalization": raising, "alignment": raising, "causality": raising})
               for sid in ("a", "b")]
    results.append(result("c", {"equivalence": "float64\nmax-abs error 0.07 at position 16.",
                                "decay_parallel": "float64\nmax-abs error 1.5e-3 at position 3."}))
    causes = common_failures(results)
    assert [(c.message, c.submissions, c.items) for c in causes] == [
        ("forward raised NotImplementedError: TODO, at line #; every item that needs forward is #", 2,
         ["Normalization", "Alignment", "Causality"]),
        ("max-abs error # at position #.", 1, ["Equivalence", "Decay_Parallel"])]


def _state_badges(html: str, item: str) -> list[str]:
    """The badges drawn for ``item`` on a page: its card's heading and its row in the checks table."""
    card = re.search(rf'<div class="item" id="item-{item}">(.*?)\n</div>', html, re.S).group(1)
    return re.findall(r'<span class="state ([a-z_]+)">([^<]*)</span>', card)


def test_before_release_the_total_says_what_is_withheld(folder, assignment):
    results = read_results(folder)
    write_pages(folder, results)
    alice = page(folder / "alice" / REPORT_PAGE)
    checks_max = sum(i.points for i in assignment.rubric.items)
    written_max = sum(q.points for q in assignment.rubric.questions)
    total = re.search(r'id="total">([^<]*)<', alice).group(1)
    # Not "104 / 104 points" for an assignment out of 129: the total says it is out of more.
    assert total == f"{checks_max:g} / {checks_max:g} points released so far, of {checks_max + written_max:g}"
    withheld = re.search(r'id="withheld">([^<]*)<', alice).group(1)
    n = len(assignment.rubric.questions)
    assert f"Not released yet: {n} written answers ({written_max:g} points)" in withheld
    assert 'id="waiting"' not in alice   # the waiting written answers are not shown yet


def test_published_with_answers_waiting_the_page_says_how_many_points_wait_and_the_terminal_warns(folder, assignment):
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as warned:
        assert main(["report", str(folder), "--release", "published"]) == 0
    questions = assignment.rubric.questions
    waiting_max = sum(q.points for q in questions)   # bob's and carol's answers all wait; alice's first is graded
    bob = page(folder / "bob" / REPORT_PAGE)
    total_max = sum(i.points for i in assignment.rubric.items) + waiting_max
    bob_score = next(r for r in read_results(folder) if r.submission_id == "bob").score
    assert re.search(r'id="total">([^<]*)<', bob).group(1) == f"{bob_score:g} / {total_max:g} points"
    waiting = re.search(r'id="waiting">([^<]*)<', bob).group(1)
    assert waiting.startswith(f"{waiting_max:g} of these {total_max:g} points wait for a TA's review "
                              f"({len(questions)} written answers)")
    alice_waits = waiting_max - questions[0].points
    alice = page(folder / "alice" / REPORT_PAGE)
    assert re.search(r'id="waiting">([^<]*)<', alice).group(1).startswith(f"{alice_waits:g} of these")
    # the TA who published is told on the terminal, with the count and the points
    pending = 3 * len(questions) - 1
    assert (f"grader: warning: released to students (published) while {pending} items of 3 submissions "
            f"({2 * waiting_max + alice_waits:g} points) still wait for a TA's review") in warned.getvalue()
    # nothing released waits: no warning
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as quiet:
        assert main(["report", str(folder), "--release", "none"]) == 0
    assert "warning" not in quiet.getvalue()


def test_a_tas_partial_credit_is_not_drawn_as_a_failure(folder, assignment):
    question = next(q for q in assignment.rubric.questions if q.points > 1)
    check = next(i for i in assignment.rubric.items if i.points > 1)
    (folder / "overrides.yaml").write_text(yaml.safe_dump({"bob": {
        question.item_name: {"score": question.points - 1, "comment": "", "reviewer": "jdoe"},
        check.name: {"score": check.points - 1, "comment": "", "reviewer": "jdoe"},
        "causality": {"score": 0, "comment": "", "reviewer": "jdoe"}}}))
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["report", str(folder), "--release", "published"]) == 0
    for name in (REPORT_PAGE, REVIEW_PAGE):
        bob = page(folder / "bob" / name)
        assert _state_badges(bob, question.item_name) == [("partial", "partial credit")]
        assert _state_badges(bob, check.name) == [("partial", "partial credit")]
        assert _state_badges(bob, "causality") == [("failed", "failed")]   # no credit is still a failure
        row = re.search(rf'href="#item-{check.name}">.*?</tr>', bob, re.S).group(0)
        assert '<span class="state partial">partial credit</span>' in row
    alice = page(folder / "alice" / REPORT_PAGE)
    assert _state_badges(alice, questions_waiting := assignment.rubric.questions[1].item_name) == [
        ("pending_review", "awaiting review")], questions_waiting


def _untouched(assignment, submission_id: str = "zed") -> GradeResult:
    """The notebook as handed out: the template's scaffold code, every check lost to its TODOs,
    every written answer not submitted."""
    not_submitted = "not submitted (the answer is blank, or unchanged from the template)"   # as results.json says
    todo = "forward raised NotImplementedError: TODO: implement the parallel form"
    result = recorded(assignment, submission_id, {i.name: todo for i in assignment.rubric.items})
    result.items = [replace(i, status="failed", output=not_submitted) if "written" in i.tags else i
                    for i in result.items]
    template = "\n\n".join(cells.source(c) for c in assignment.template.cells if cells.SCAFFOLD in cells.tags(c))
    result.artifacts = {SCAFFOLD_SOURCE: template.encode()}
    return result


def _rate_label(summary: str, item: str) -> str:
    return re.search(rf'id="rate-{item}".*?<text[^>]*>([^<]*)<', summary, re.S).group(1).strip()


def test_the_class_page_leads_with_the_queue_and_calls_an_untouched_notebook_not_attempted(folder, assignment):
    write_result(folder, _untouched(assignment))
    write_pages(folder, read_results(folder))
    summary = page(folder / SUMMARY_PAGE)
    headings = re.findall(r"<h2[^>]*>([^<]*)</h2>", summary)
    assert headings[0] == "Review queue: what waits for you" and headings.index("Scores") > 0
    waiting = review_queue(folder, read_results(folder))
    assert re.search(r'id="waiting-total">([^<]*)<', summary).group(1).startswith(
        f"{len(waiting)} entries wait for a person, from {len({e.submission_id for e in waiting})} submissions")
    row = re.search(r'<tr><td><a href="zed/review.html">zed</a></td>.*?</tr>', summary, re.S).group(0)
    assert "not attempted" in row and "equivalence" not in row
    assert 'id="not-attempted">Not attempted (1): <a href="zed/review.html">zed</a>.' in summary
    # its TODOs are not the class's failures, and its blank answers are not graded answers
    assert "NotImplementedError" not in summary
    second = assignment.rubric.questions[1].item_name
    assert _rate_label(summary, second) == "none graded yet, 3 pending"
    # an attempted row names at most MAX_ROW_ITEMS lost items, and counts the rest
    bob_like = recorded(assignment, "many", {i.name: "wrong" for i in assignment.rubric.items[:12]})
    write_result(folder, bob_like)
    write_pages(folder, read_results(folder))
    row = re.search(r'<tr><td><a href="many/review.html">many</a></td>.*?</tr>', page(folder / SUMMARY_PAGE), re.S).group(0)
    assert "and 4 more" in row and assignment.rubric.items[8].name not in row


def test_a_queue_page_shows_the_question_its_criteria_and_a_way_to_the_whole_answer(folder, assignment):
    question = assignment.rubric.questions[0]
    long_answer = "The linear state stays fixed while the cache grows. " * 30
    dave = recorded(assignment, "dave")
    dave.artifacts = {WRITTEN_INPUTS: json.dumps({"answers": {question.id: long_answer}}).encode()}
    write_result(folder, dave)
    write_pages(folder, read_results(folder))
    queue = page(folder / QUEUE_FOLDER / queue_page_name(question.item_name, 1))
    asked = assignment.reference_answers[question.id].question
    assert re.search(r'<blockquote class="question" id="question">([^<]*)</blockquote>', queue).group(1) == \
        str(markupsafe.escape(asked))
    criteria = re.search(r'<table id="criteria">(.*?)</table>', queue, re.S).group(1)
    for criterion in question.criteria:
        assert f"<td>{markupsafe.escape(criterion.id)}</td><td>{markupsafe.escape(criterion.earns)}</td>" in criteria
    # dave's answer is cut on the queue page, which links to the review page showing it whole
    assert f'The whole answer: <a href="../dave/{REVIEW_PAGE}#item-{question.item_name}">dave</a>' in queue
    assert long_answer.strip() in html.unescape(page(folder / "dave" / REVIEW_PAGE))
    # bob's short answer is whole already: no link for it
    assert f'<a href="../bob/{REVIEW_PAGE}#item-{question.item_name}">bob</a>&#39;s review page' not in queue
    # its explanations read as sentences even where a reader joins the lines ("shown.A row's")
    prose = re.sub(r"<(pre|blockquote|table)\b.*?</\1>", "", queue, flags=re.S)
    prose = re.sub(r"<[^>]+>", "", prose).replace("\n", "")
    assert not re.search(r"[a-z]\.[A-Z]", prose), re.findall(r".{20}[a-z]\.[A-Z].{10}", prose)


def test_after_an_override_no_page_says_the_answer_still_awaits_review(folder, assignment):
    question = assignment.rubric.questions[1]
    (folder / "overrides.yaml").write_text(yaml.safe_dump(
        {"bob": {question.item_name: {"score": question.points, "comment": "clear", "reviewer": "jdoe"}}}))
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["report", str(folder), "--release", "published"]) == 0
    decided = f"Reviewed by a TA (jdoe): {question.points:g} / {question.points:g}. clear"
    for name in (REPORT_PAGE, REVIEW_PAGE):
        card = re.search(rf'<div class="item" id="item-{question.item_name}">(.*?)\n</div>',
                         page(folder / "bob" / name), re.S).group(1)
        shown = re.sub(r'<p class="note">Before the review, the grader said: [^<]*</p>', "", card)
        assert decided in shown and "awaiting review" not in shown, (name, card)
    review = page(folder / "bob" / REVIEW_PAGE)
    assert "Before the review, the grader said: awaiting review" in review


def test_counts_read_as_english():
    from grader.report.terminal import counted
    assert counted(1, "submission") == "1 submission" and counted(0, "submission") == "0 submissions"
    assert counted(2, "item") == "2 items"


def test_the_help_shows_no_markup_and_says_the_exit_statuses():
    from grader.cli import build_parser
    helped = build_parser().format_help()
    assert "``" not in helped and "Exit status: 0" in helped
