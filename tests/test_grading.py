"""The whole pipeline: validate, a batch with broken notebooks in it, resume and reports."""
from __future__ import annotations

import csv
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import nbformat
import pytest
import yaml

from grader.batch import grade_batch
from grader.intake import discover
from grader.cli import main
from grader.report.executed import EXECUTED_PAGE, write_executed_page
from grader.report.overrides import APPLIED_FILE
from grader.rubric import RubricError, load_rubric
from grader.validate import validate

from conftest import ROOT, gradescope_valid, items_by_id, write_notebook

STATUSES = {"passed", "failed", "error", "pending_review"}


def results(out: Path, submission_id: str) -> dict:
    return json.loads((out / submission_id / "results.json").read_text())


def items(data: dict) -> dict[str, dict]:
    return items_by_id(data)


def test_validate_solution_full_marks_template_baseline(assignment, sandbox):
    report = validate(assignment, sandbox, assignment.rubric)
    assert report.ok, report.text
    autograded = [i for i in report.solution.items if "written" not in i.tags]
    assert all(i.score == i.max_score for i in autograded)
    assert report.template.score == sum(i.points for i in assignment.rubric.items if i.baseline)


def test_every_submission_gets_a_gradescope_results_file(batch, assignment):
    _, out, outcome = batch
    assert {r.submission_id for r in outcome.results} == {"untouched", "broken_json", "raises", "warns", "two_notebooks"}
    for result in outcome.results:
        data = results(out, result.submission_id)
        assert {"score", "output", "execution_time", "tests", "submission_id", "assignment",
                "grader_version", "submission_sha256"} <= set(data)
        assert len(data["tests"]) == len(assignment.rubric.items) + len(assignment.rubric.questions)
        for test in items(data).values():
            assert test["status"] in STATUSES and set(test["tags"]) <= set(assignment.rubric.tags)
            assert 0 <= test["score"] <= test["max_score"]
        # Gradescope's own schema: status only passed / failed, the state in extra_data.
        assert {t["status"] for t in data["tests"]} <= {"passed", "failed"}
        assert data["extra_data"]["submission_sha256"] == data["submission_sha256"]
    assert gradescope_valid(out) == len(outcome.results)


def test_broken_notebook_scores_zero_with_a_reason(batch):
    _, out, _ = batch
    data = results(out, "broken_json")
    assert data["score"] == 0
    assert "not valid JSON" in data["output"]
    assert all("not valid JSON" in t["output"] for t in data["tests"])


def test_folder_with_two_notebooks_is_a_result(batch):
    _, out, _ = batch
    assert "holds 2 notebooks" in results(out, "two_notebooks")["output"]


def test_exercise_1_is_judged_by_what_its_sweep_timed_in_the_sandbox(batch):
    """The sandboxed probe's observation of the sweep: the master's earns both method items,
    a teacher-forced pass loses both, whatever the loaded machine's times were."""
    _, out, _ = batch
    for name in ("benchmark_full_step", "benchmark_linear_step"):
        master = items(results(out, "raises"))[name]
        assert master["status"] == "passed" and "at every history length given" in master["output"], master
        forced = items(results(out, "warns"))[name]
        assert forced["status"] == "failed" and "teacher forcing" in forced["output"], forced
    # The notebook ran the sweep too: its answer variable is complete either way.
    assert items(results(out, "warns"))["benchmark_fields"]["status"] == "passed"


def test_a_raising_cell_costs_only_the_execution_item(batch):
    _, out, _ = batch
    found = items(results(out, "raises"))
    assert found["notebook_runs"]["status"] == "failed"
    assert "student bug in a cell" in found["notebook_runs"]["output"]
    for name in ("equivalence", "normalization", "causality", "decay_per_head", "state_fixed_size", "hybrid_lm"):
        assert found[name]["status"] == "passed", found[name]["output"]
    # Exercise cells were cut from this notebook, so its answer variables are missing.
    assert "MEMORY_BILL is not defined" in found["bill_mha_kv_cache"]["output"]


def test_warnings_on_stderr_cost_nothing(batch):
    _, out, _ = batch
    assert items(results(out, "warns"))["notebook_runs"]["status"] == "passed"


def test_untouched_template_reports_the_todo(batch):
    _, out, _ = batch
    found = items(results(out, "untouched"))
    assert found["scaffold_present"]["status"] == "passed"
    assert "NotImplementedError: TODO" in found["equivalence"]["output"]
    assert found["written_ex1_crossover"]["name"] == "Written: ex1_crossover"   # the human title
    assert "not submitted" in found["written_ex1_crossover"]["output"]


def test_executed_notebook_is_kept_for_tas(batch):
    _, out, _ = batch
    executed = nbformat.read(str(out / "raises" / "executed.ipynb"), as_version=4)
    assert any(o.get("ename") == "RuntimeError" for c in executed.cells for o in c.get("outputs", []))


def test_the_worker_that_ran_a_notebook_renders_its_page_for_tas(batch):
    """executed.html comes with the result (written before results.json, as its artifacts are),
    rendered by the worker that graded the submission; the pages find it current and keep it."""
    _, out, _ = batch
    for sid in ("raises", "warns", "untouched"):
        page = out / sid / EXECUTED_PAGE
        drawn = page.stat().st_mtime_ns
        assert drawn <= (out / sid / "results.json").stat().st_mtime_ns
        assert write_executed_page(out / sid) == (page, "")
        assert page.stat().st_mtime_ns == drawn
    assert "student bug in a cell" in (out / "raises" / EXECUTED_PAGE).read_text()


def test_gradebook_has_one_row_per_submission_and_a_column_per_item(batch, assignment):
    _, out, outcome = batch
    from grader.report.results import write_gradebook
    rows = list(csv.DictReader(write_gradebook(out, outcome.results).open()))
    assert sorted(r["submission_id"] for r in rows) == ["broken_json", "raises", "two_notebooks", "untouched",
                                                        "warns"]
    expected = {i.name for i in assignment.rubric.items} | {q.item_name for q in assignment.rubric.questions}
    assert expected <= set(rows[0])
    raises = next(r for r in rows if r["submission_id"] == "raises")
    assert float(raises["equivalence"]) == assignment.rubric.item("equivalence").points


def test_rerun_reuses_unchanged_results_and_regrades_changed_ones(batch, assignment, sandbox):
    folder, out, first = batch
    untouched = (out / "untouched" / "results.json").read_text()
    write_notebook(assignment.template, folder / "untouched.ipynb")  # same bytes
    raising = nbformat.read(str(folder / "raises.ipynb"), as_version=4)
    raising.cells[3].source = "raise RuntimeError('a different bug')"
    write_notebook(raising, folder / "raises.ipynb")
    second = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                         progress=io.StringIO())
    assert second.reused == 4  # all but the changed notebook
    assert (out / "untouched" / "results.json").read_text() == untouched
    assert "a different bug" in items(results(out, "raises"))["notebook_runs"]["output"]


def test_report_applies_ta_overrides_with_an_audit(batch):
    _, out, _ = batch
    path = out / "untouched" / "results.json"
    pristine = path.read_text()
    overrides = out / "overrides.yaml"
    try:
        # A wrong entry: nothing is applied, every problem is named, the exit is non-zero.
        overrides.write_text("untouched:\n  written_ex5_memory_bill: 2\n  no_such_item: 1\n"
                             "nobody:\n  notebook_runs: 1\nraises:\n  notebook_runs: 9\n")
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as errors:
            assert main(["report", str(out)]) == 2
        for words in ("untouched/no_such_item: no such item", "nobody: no such submission",
                      "raises/notebook_runs: score 9 is outside [0, 2]"):
            assert words in errors.getvalue()
        assert path.read_text() == pristine and not (out / APPLIED_FILE).exists()

        overrides.write_text(yaml.safe_dump({"untouched": {"written_ex5_memory_bill": {
            "score": 2, "comment": "derivation right", "reviewer": "jdoe"}}}))
        for _ in range(2):   # applying twice changes nothing more
            with redirect_stdout(io.StringIO()) as printed:
                assert main(["report", str(out)]) == 0
        assert "untouched/written_ex5_memory_bill -> 2 (was 0)" in printed.getvalue()
        test = items(results(out, "untouched"))["written_ex5_memory_bill"]
        assert test["score"] == 2 and test["output"] == "Reviewed by a TA (jdoe): 2 / 3. derivation right"
        audit = test["extra_data"]["override"]
        assert audit["original_score"] == 0 and audit["original_state"] == "failed" and audit["reviewer"] == "jdoe"
        assert audit["notebook_sha256"] == results(out, "untouched")["submission_sha256"]
        rows = {r["submission_id"]: r for r in csv.DictReader((out / "gradebook.csv").open())}
        assert rows["untouched"]["written_ex5_memory_bill"] == "2"

        # The notebook changed since the review (a regrade wrote a fresh result): not applied, reported.
        ledger = json.loads((out / APPLIED_FILE).read_text())
        ledger["untouched"]["written_ex5_memory_bill"]["notebook_sha256"] = "f" * 64
        (out / APPLIED_FILE).write_text(json.dumps(ledger))
        path.write_text(pristine)
        with redirect_stdout(io.StringIO()) as printed:
            assert main(["report", str(out)]) == 0
        assert "NOT applied, the notebook changed since the review" in printed.getvalue()
        assert items(results(out, "untouched"))["written_ex5_memory_bill"]["score"] == 0
        assert "written_ex5_memory_bill" in overrides.read_text()   # the TA's file is never edited
    finally:
        overrides.unlink(missing_ok=True)
        (out / APPLIED_FILE).unlink(missing_ok=True)
        path.write_text(pristine)


def test_grade_cli_exit_status_and_missing_path(tmp_path):
    assert main(["grade", str(tmp_path / "nope"), "--assignment", "linear_attention", "--out", str(tmp_path)]) == 2
    assert main(["grade", str(tmp_path), "--assignment", "no_such_assignment", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("change, words", [
    (lambda raw: raw["items"][0].update(tags=["no-such-concern"]), "unknown tags ['no-such-concern']"),
    (lambda raw: raw.pop("tags"), "`tags` must map"),
    (lambda raw: raw["tags"].update(written="the pipeline's"), "`tags` must map"),
])
def test_the_rubric_declares_its_own_tag_vocabulary(tmp_path, change, words):
    raw = yaml.safe_load((ROOT / "rubrics" / "linear_attention.yaml").read_text())
    change(raw)
    (tmp_path / "rubric.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(RubricError, match=re.escape(words)):
        load_rubric(tmp_path / "rubric.yaml")
