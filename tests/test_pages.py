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

from grader.cli import main
from grader.report.pages import REPORT_PAGE, REVIEW_PAGE, SUMMARY_PAGE

CHROMIUM = Path("/usr/bin/chromium")   # Debian's package, installed by `make install`
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
    assert re.search(r'href="broken_json/review.html#item-[a-z_]+"', summary)


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
    assert "Changed by a TA (ta_kim): 0 &rarr; 2: ran fine on my machine" in after[f"untouched/{REPORT_PAGE}"]
    assert total_shown(after[f"untouched/{REPORT_PAGE}"]) != total_shown(before[f"untouched/{REPORT_PAGE}"])
    assert re.search(r"ta_kim</td><td>ran fine on my machine", after[SUMMARY_PAGE].replace("\n", ""))


def assert_items_shown_once(page, path: Path, item_ids: list[str]) -> None:
    """What a person sees: one card per item, in rubric order, and nothing else drawn as one."""
    page.goto(path.as_uri())
    shown = page.eval_on_selector_all("div.item", "cards => cards.map(c => c.id)")
    assert shown == [f"item-{i}" for i in item_ids], (path, shown)


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
                assert page.inner_text("#total") == f"{shown:g} / {shown_max:g} points"
                page.screenshot(path=str(shots / f"{submission_id}.png"), full_page=True)
            for folder in sorted(p.parent for p in out.glob("*/results.json")):
                expected = results(out, folder.name)
                assert_items_shown_once(page, folder / REPORT_PAGE,
                                        [t["extra_data"]["id"] for t in expected["tests"] if t["visibility"] == "visible"])
                assert_items_shown_once(page, folder / REVIEW_PAGE, [t["extra_data"]["id"] for t in expected["tests"]])
            page.goto((out / SUMMARY_PAGE).as_uri())
            assert page.locator("#histogram svg").count() == 1 and page.locator("#pass-rates svg").count() == 1
            rows = page.locator("#scores tr").count() - 1
            assert rows == len(list(out.glob("*/results.json")))
            page.screenshot(path=str(shots / "summary.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert all((shots / f"{name}.png").stat().st_size > 10_000 for name in ("raises", "untouched", "summary"))
