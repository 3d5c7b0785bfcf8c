"""Pages and exports of a really graded batch: written for every submission, changed by an
override everywhere a score shows, and loaded in a real headless Chromium."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import sync_playwright

from grader.assignment import Assignment
from grader.checks import CheckContext, checks_for
from grader.cli import main
from grader.graft import submission_module_source
from grader.load import load_submission
from grader.pipeline import EXECUTED_NOTEBOOK
from grader.report.pages import (QUEUE_FOLDER, RELEASES, REPORT_PAGE, REVIEW_PAGE, SUMMARY_PAGE, cell_problems,
                                 release_state, write_pages)
from grader.report.results import read_results, write_result
from grader.score import GradeResult, score_items

from conftest import ROOT, SCAFFOLDS, as_scaffolds, scaffold_cell
from probe_in_process import probe_in_process
from test_hyena_checks import CORPUS as HYENA_CORPUS
from test_hyena_checks import scaffold_sources
from test_review import two_raising_cells

CHROMIUM = Path("/usr/bin/chromium")   # Debian's package, installed by `make install`
AXE = ROOT / ".venv" / "node_modules" / "axe-core" / "axe.min.js"   # the pinned npm package, also from `make install`
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def out(batch, tmp_path) -> Path:
    """A copy of the graded batch's output folder, rendered by `grader report`."""
    copy = tmp_path / "out"
    shutil.copytree(batch[1], copy)
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(copy)]) == 0
    return copy


def results(out: Path, submission_id: str) -> dict:
    return json.loads((out / submission_id / "results.json").read_text())


def total_shown(html: str) -> str:
    return re.search(r'id="total">([^<]*)<', html).group(1).strip()


def test_every_submission_gets_its_pages_and_the_batch_a_summary(out, batch):
    ids = {r.submission_id for r in batch[2].results}
    for submission_id in ids:
        for name in (REPORT_PAGE, REVIEW_PAGE):
            assert (out / submission_id / name).is_file(), f"{submission_id}/{name} missing"
    summary = (out / SUMMARY_PAGE).read_text()
    assert all(f'href="{i}/review.html"' in summary for i in ids)
    raises = (out / "raises" / REPORT_PAGE).read_text()
    executed = json.loads((out / "raises" / "executed.ipynb").read_text())
    (error,) = [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert f"{error['ename']}: {error['evalue']}" in raises        # the raising cell, with its error
    broken = (out / "broken_json" / REPORT_PAGE).read_text()
    assert "could not be graded" in broken
    # the review queue lists the execution failures of unreadable submissions
    queue = "".join(p.read_text() for p in (out / QUEUE_FOLDER).glob("*.html"))
    assert re.search(r'href="../broken_json/review.html#item-[a-z_]+"', queue) and 'href="queue/' in summary


def test_an_attempt_on_the_grader_is_shown_to_the_ta_and_changes_no_score(out, batch):
    """The warns notebook patches torch.allclose in a cell of its own: results.json keeps the
    attempt for TAs, the review page lists its line, the class summary names the submission,
    the student's page says nothing of it, and the attempt costs no point (every item is judged
    as without it)."""
    attempt = results(out, "warns")["extra_data"]["attempts"]
    assert [(a["kind"], a["detail"], a["code"]) for a in attempt] == [
        ("library_patch", "sets torch.allclose",
         "torch.allclose = lambda *args, **kwargs: True   # an attempt on the grader, neutralised")]
    review = (out / "warns" / REVIEW_PAGE).read_text()
    assert 'id="attempts"' in review and f"{attempt[0]['where']}" in review and "sets torch.allclose" in review
    assert "torch.allclose" not in (out / "warns" / REPORT_PAGE).read_text()
    summary = (out / SUMMARY_PAGE).read_text()
    assert re.search(r'id="attempts">Attempts on the grader \(1\).*warns/review\.html', summary)
    assert all("attempts" not in results(out, r.submission_id)["extra_data"]
               for r in batch[2].results if r.submission_id != "warns")


def test_an_override_changes_every_output_and_keeps_the_original(out):
    roster = out / "roster.csv"
    roster.write_text("submission_id,Student,ID,SIS User ID,SIS Login ID,Section\n"
                      "untouched,\"Doe, Jo\",7001,S7001,jdoe,L01\nraises,\"Roe, Al\",7002,S7002,aroe,L01\n")

    def outputs() -> dict[str, str]:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            assert main(["export", str(out), "--roster", str(roster), "--format", "canvas",
                         "--column", "Linear attention (9001)"]) == 0
        return {name: (out / name).read_text() for name in
                ("untouched/results.json", "gradebook.csv", "canvas_import.csv", f"untouched/{REPORT_PAGE}",
                 f"untouched/{REVIEW_PAGE}", SUMMARY_PAGE)}

    before = outputs()
    old_total = results(out, "untouched")["score"]
    (out / "overrides.yaml").write_text(yaml.safe_dump(
        {"untouched": {"notebook_runs": {"score": 2, "comment": "ran fine on my machine", "reviewer": "ta_kim"}}}))
    with redirect_stdout(io.StringIO()) as printed:
        assert main(["report", str(out)]) == 0
    assert "untouched/notebook_runs -> 2 (was 0)" in printed.getvalue()
    after = outputs()
    assert [name for name in before if before[name] == after[name]] == []
    new_total = results(out, "untouched")["score"]
    assert new_total == old_total + 2
    test = next(t for t in results(out, "untouched")["tests"] if t["extra_data"]["id"] == "notebook_runs")
    assert test["extra_data"]["override"]["original_score"] == 0 and test["extra_data"]["override"]["reviewer"] == "ta_kim"
    gradebook = {r["submission_id"]: r for r in csv.DictReader(io.StringIO(after["gradebook.csv"]))}
    assert gradebook["untouched"]["notebook_runs"] == "2" and float(gradebook["untouched"]["total"]) == new_total
    canvas = {r[3]: r[5] for r in csv.reader(io.StringIO(after["canvas_import.csv"]))}
    assert canvas["jdoe"] == f"{new_total:g}"
    # the override is explained on both pages, on its item: the TA sees the change, the student the decision
    card = re.search(r'<div class="item" id="item-notebook_runs">(.*?)\n</div>', after[f"untouched/{REVIEW_PAGE}"], re.S)
    assert "Changed by a TA (ta_kim): 0 &rarr; 2: ran fine on my machine" in card.group(1)
    card = re.search(r'<div class="item" id="item-notebook_runs">(.*?)\n</div>', after[f"untouched/{REPORT_PAGE}"], re.S)
    assert "<pre>Reviewed by a TA (ta_kim): 2 / 2. ran fine on my machine</pre>" in card.group(1)
    assert test["output"] == "Reviewed by a TA (ta_kim): 2 / 2. ran fine on my machine"
    assert total_shown(after[f"untouched/{REPORT_PAGE}"]) != total_shown(before[f"untouched/{REPORT_PAGE}"])
    assert re.search(r"ta_kim</td><td>ran fine on my machine", after[SUMMARY_PAGE].replace("\n", ""))


def assert_items_shown_once(page, path: Path, item_ids: list[str]) -> None:
    """What a person sees: one card per item, in rubric order, and nothing else drawn as one."""
    page.goto(path.as_uri())
    shown = page.eval_on_selector_all("div.item", "cards => cards.map(c => c.id)")
    assert shown == [f"item-{i}" for i in item_ids], (path, shown)


def serious_violations(page, skipped: tuple[str, ...] = ()) -> list[str]:
    """axe-core's serious and critical findings on the loaded page (every rule enabled but the
    ``skipped`` rule ids)."""
    assert AXE.is_file(), f"{AXE} is missing: run `make install` (it installs the pinned axe-core)"
    page.add_script_tag(path=str(AXE))
    options = {"resultTypes": ["violations"], "rules": {rule: {"enabled": False} for rule in skipped}}
    found = page.evaluate("async options => (await axe.run(document, options)).violations"
                          ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
                          " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))", options)
    return [f"{page.url}: {v['id']} ({v['impact']}): {v['help']} at {v['nodes']}"
            for v in found if v["impact"] in ("serious", "critical")]


def assert_folder_pages(page, out: Path) -> list[str]:
    """Every submission's two pages and the summary, as a person sees them: the student page has
    one card per item the folder's release state shows and nothing else, each with the message
    of results.json (what Gradescope shows); the TA page has every item; raising cells are boxes
    of their own class, one per raising cell. Returns axe's serious findings on all of them."""
    shown_visibilities = RELEASES[release_state(out)]
    problems: list[str] = []
    for folder in sorted(p.parent for p in out.glob("*/results.json")):
        expected = results(out, folder.name)
        released = [t for t in expected["tests"] if t["visibility"] in shown_visibilities]
        assert_items_shown_once(page, folder / REPORT_PAGE, [t["extra_data"]["id"] for t in released])
        for test in released:
            if "details" in test["extra_data"] and "criteria" in test["extra_data"]["details"]:
                continue   # a drafted answer shows its criteria table, not the output text
            card = page.locator(f"div.item#item-{test['extra_data']['id']} pre").first.inner_text()
            assert card == test["output"], (folder.name, test["extra_data"]["id"])
        raised = sum(1 for c in cell_problems(folder / EXECUTED_NOTEBOOK))
        assert page.locator("div.cell").count() == raised
        problems += serious_violations(page)
        assert_items_shown_once(page, folder / REVIEW_PAGE, [t["extra_data"]["id"] for t in expected["tests"]])
        assert page.locator("div.cell").count() == raised
        problems += serious_violations(page)
    page.goto((out / SUMMARY_PAGE).as_uri())
    return problems + serious_violations(page)


def test_pages_load_in_headless_chromium_without_console_errors(out, tmp_path):
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: run `make install` (it installs Debian's chromium)"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            for submission_id in ("raises", "untouched"):
                page.goto((out / submission_id / REPORT_PAGE).as_uri())
                expected = results(out, submission_id)
                shown = sum(t["score"] for t in expected["tests"] if t["visibility"] == "visible")
                shown_max = sum(t["max_score"] for t in expected["tests"] if t["visibility"] == "visible")
                total_max = sum(t["max_score"] for t in expected["tests"])
                assert page.inner_text("#total") == f"{shown:g} / {shown_max:g} points released so far, of {total_max:g}"
                page.screenshot(path=str(shots / f"{submission_id}.png"), full_page=True)
            problems += assert_folder_pages(page, out)
            with redirect_stdout(io.StringIO()):
                assert main(["report", str(out), "--release", "published"]) == 0
            problems += assert_folder_pages(page, out)
            page.goto((out / SUMMARY_PAGE).as_uri())
            assert page.locator("#histogram svg").count() == 1 and page.locator("#pass-rates svg").count() == 1
            rows = page.locator("#scores tr").count() - 1
            assert rows == len(list(out.glob("*/results.json")))
            page.screenshot(path=str(shots / "summary.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert all((shots / f"{name}.png").stat().st_size > 10_000 for name in ("raises", "untouched", "summary"))


# Corpus entries whose pages are checked (graded in process: no sandbox run per entry).
PAGE_CORPUS = {"linear_attention": ("correct_einsum", "mutant_decay_s_not_z", "mutant_future_mask",
                                    "mutant_step_caches_history"),
               "linear_attention_hyena": ("correct_cumsum", "mutant_fft_no_padding", "mutant_gate_wrong_axis")}


def _corpus_result(assignment: Assignment, name: str, executed: bytes) -> GradeResult:
    """One corpus entry's result as the pipeline would write it, from the in-process probe."""
    checks = checks_for(assignment.rubric)
    if assignment.name == "linear_attention":
        sources = as_scaffolds(assignment.master, scaffold_cell(assignment.master, (SCAFFOLDS / f"{name}.py").read_text()))
    else:
        sources = scaffold_sources(assignment.master, (HYENA_CORPUS / f"{name}.py").read_text())
    source, _ = submission_module_source(assignment.master, sources)
    probe = probe_in_process(source, checks.probe_cases(assignment.rubric), checks.PROBE_DRIVER)
    verdicts = checks.evaluate(CheckContext(assignment.rubric, assignment.master_path, probe, None, None,
                                            "not executed in this test"))
    submission = load_submission(assignment.master_path, name, assignment.template, 2**26)
    return GradeResult(name, assignment.name, "test", "0" * 64,
                       score_items(assignment.rubric, verdicts, submission), artifacts={EXECUTED_NOTEBOOK: executed})


def test_corpus_pages_show_every_item_once_and_pass_axe_in_chromium(tmp_path):
    """Pages of in-process corpus results, one folder per assignment, each at another release
    state; one entry with no raising cell, one with two."""
    clean = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()
    folders = []
    for (assignment_name, names), release in zip(PAGE_CORPUS.items(), ("due", "published")):
        assignment = Assignment(assignment_name)
        out = tmp_path / assignment_name
        for position, name in enumerate(names):
            write_result(out, _corpus_result(assignment, name, two_raising_cells() if position == 1 else clean))
        release_state(out, release)
        write_pages(out, read_results(out), release)
        folders.append(out)
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            problems = [p for out in folders for p in assert_folder_pages(page, out)]
            page.goto((folders[0] / PAGE_CORPUS["linear_attention"][1] / REPORT_PAGE).as_uri())
            assert page.locator("div.cell").count() == 2
        finally:
            browser.close()
    assert problems == []
