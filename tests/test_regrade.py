"""Regrading follows the grader: kept raw outputs, and separate execution and evaluation digests.

One real batch (the reference and a partly wrong example, 2 workers) is graded once for the
module; every later run here must execute nothing unless execution changed, which each test
asserts by making the sandboxed stages and the worker pool fail if they are reached.
"""
from __future__ import annotations

import io
import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from grader import batch as batch_module
from grader.executors import local as local_module
from grader import digests
from grader import pipeline
from grader.batch import grade_batch
from grader.checks import Verdict, checks_for
from grader.cli import main
from grader.execute import CellRun, ExecutionResult
from grader.intake import discover
from grader.pipeline import RAW_OUTPUTS, KeptRun, SubmissionGrader
from grader.probe import CaseOutput, ProbeResult
from grader.report.changes import read_changes
from grader.score import result_from_json

from conftest import ROOT, items_by_id

EXAMPLES = ROOT / "examples" / "submissions" / "linear_attention"
IDS = ("partly_wrong", "reference")


def results(out: Path, submission_id: str) -> dict:
    return json.loads((out / submission_id / "results.json").read_text())


def verdicts(data: dict) -> dict[str, tuple[float, str, str]]:
    return {name: (t["score"], t["extra_data"]["state"], t["output"]) for name, t in items_by_id(data).items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, assignment, sandbox):
    """(submissions, output folder, first results by id) of one real batch."""
    folder = tmp_path_factory.mktemp("regrade-submissions")
    shutil.copy(EXAMPLES / "reference.ipynb", folder / "reference.ipynb")
    shutil.copytree(EXAMPLES / "partly_wrong", folder / "partly_wrong")
    out = tmp_path_factory.mktemp("regrade-out")
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                          progress=io.StringIO())
    assert sorted(r.submission_id for r in outcome.results) == list(IDS) and outcome.reused == 0
    return folder, out, {i: results(out, i) for i in IDS}


@pytest.fixture
def nothing_runs(monkeypatch):
    """Any notebook run, probe or worker pool fails the test (and is counted)."""
    reached: list[str] = []

    def refuse(what):
        def refused(*args, **kwargs):
            reached.append(what)
            raise AssertionError(f"{what} was started")
        return refused
    monkeypatch.setattr(pipeline, "execute_notebook", refuse("execute_notebook"))
    monkeypatch.setattr(pipeline, "run_probe", refuse("run_probe"))
    monkeypatch.setattr(local_module, "ProcessPoolExecutor", refuse("the worker pool"))
    return reached


def test_first_run_keeps_raw_outputs_and_records_both_digests(graded, assignment, sandbox):
    _, out, first = graded
    grader = SubmissionGrader(assignment, sandbox)
    for submission_id, data in first.items():
        assert data["extra_data"]["digests"] == {k: grader.digests[k] for k in ("execution", "evaluation")}
        assert (out / submission_id / pipeline.SCREENING).is_file()
        kept = grader.kept_run(out / submission_id, data["submission_sha256"])
        assert kept is not None and kept.ran and kept.execution is not None and kept.probe is not None
        assert kept.probe.import_status == "ok" and kept.probe.cases
        assert all(c.status in {"ok", "error", "timeout", "not_run"} for c in kept.probe.cases.values())
        # Kept under the execution key: another submission's bytes find nothing.
        assert grader.kept_run(out / submission_id, "0" * 64) is None
    assert verdicts(first["reference"])["equivalence"][1] == "passed"
    assert any(state != "passed" for _, state, _ in verdicts(first["partly_wrong"]).values())


def test_unchanged_rerun_executes_nothing_and_changes_nothing(graded, assignment, sandbox, nothing_runs):
    folder, out, first = graded
    before = {i: (out / i / "results.json").read_text() for i in IDS}
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                          progress=io.StringIO())
    assert (outcome.reused, outcome.regraded) == (2, 0) and not nothing_runs
    assert {i: (out / i / "results.json").read_text() for i in IDS} == before


def test_a_check_edit_regrades_from_kept_outputs_through_grader_grade(graded, assignment, sandbox, monkeypatch,
                                                                     nothing_runs):
    """A check's message and verdict change (and with it the evaluation digest): `grader grade`
    shows the new message, records the score change, and executes nothing."""
    folder, out, first = graded
    checks = checks_for(assignment.rubric)
    real_digest = digests.evaluation_digest
    monkeypatch.setattr(digests, "evaluation_digest", lambda *a, **k: real_digest(*a, **k) + "-edited")
    monkeypatch.setattr(checks, "execution_verdict",
                        lambda context: Verdict("failed", f"EDITED CHECK: {len(context.execution.cells)} code cells seen"))
    executed = {i: (out / i / "executed.ipynb").stat().st_mtime_ns for i in IDS}
    cells = {i: len(SubmissionGrader(assignment, sandbox).kept_run(out / i, first[i]["submission_sha256"]).execution.cells)
             for i in IDS}
    assert main(["grade", str(folder), "--assignment", "linear_attention", "--out", str(out), "--workers", "2"]) == 0
    assert not nothing_runs
    for submission_id in IDS:
        now = verdicts(results(out, submission_id))
        was = verdicts(first[submission_id])
        score, state, output = now["notebook_runs"]
        assert (score, state, output) == (0, "failed", f"EDITED CHECK: {cells[submission_id]} code cells seen")
        # Every other item is recomputed from the kept raw outputs to exactly what the run gave.
        assert {k: v for k, v in now.items() if k != "notebook_runs"} == \
               {k: v for k, v in was.items() if k != "notebook_runs"}
        assert results(out, submission_id)["extra_data"]["digests"]["evaluation"].endswith("-edited")
        assert (out / submission_id / "executed.ipynb").stat().st_mtime_ns == executed[submission_id]
        # The timings of the run it reuses are kept; evaluation's own stages are measured again.
        timed, timed_first = (r["extra_data"]["timings"] for r in (results(out, submission_id), first[submission_id]))
        sandboxed = [s for s in timed_first["stages"] if s[0] not in ("checks", "written", "report")]
        assert [s[0] for s in sandboxed][:2] == ["sandbox_start", "kernel_start"] and sandboxed[-1][0] == "probe_cases"
        assert timed["stages"][:-3] == sandboxed
        assert [s[0] for s in timed["stages"][-3:]] == ["checks", "written", "report"]
        assert timed["peak_memory_mib"] == timed_first["peak_memory_mib"] > 0
    changes = {c["submission_id"]: c for c in read_changes(out)}
    assert set(changes) == set(IDS)
    assert all(not c["notebook_changed"] and [i["id"] for i in c["items"]] == ["notebook_runs"]
               for c in changes.values())

    # Undoing the edit regrades back to the first run's verdicts, still executing nothing.
    monkeypatch.undo()
    monkeypatch.setattr(pipeline, "execute_notebook", None)   # would raise TypeError if called
    monkeypatch.setattr(pipeline, "run_probe", None)
    monkeypatch.setattr(local_module, "ProcessPoolExecutor", None)
    progress = io.StringIO()
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2, progress=progress)
    assert (outcome.reused, outcome.regraded, outcome.internal_errors) == (0, 2, 0)
    assert "2 submissions regraded from their kept runs" in progress.getvalue()
    for submission_id in IDS:
        assert verdicts(results(out, submission_id)) == verdicts(first[submission_id])


def test_a_tolerance_change_regrades_and_an_execution_change_runs_again(graded, assignment, sandbox, monkeypatch):
    folder, out, first = graded
    submitted: list[str] = []

    class RecordingPool(batch_module.WorkerPool):
        """The worker pool with its guard, but no worker started: records what would be
        executed, keeps the old result."""

        def submit(self, todo):
            submitted.extend(submission.submission_id for submission in todo)
            return {submission.submission_id: submission for submission in todo}

        def collect(self, pending, out_dir, graded, bar):
            graded.extend(result_from_json(results(out_dir, submission_id)) for submission_id in pending)
    monkeypatch.setattr(batch_module, "WorkerPool", RecordingPool)
    monkeypatch.setattr(pipeline, "execute_notebook", None)
    monkeypatch.setattr(pipeline, "run_probe", None)

    # A tolerance (evaluation only): regraded from the kept outputs.
    loose = replace(assignment.rubric, tolerances={**assignment.rubric.tolerances,
                                                   "hybrid_gradient_floor": assignment.rubric.tolerances["hybrid_gradient_floor"] * 2})
    meanwhile: list[tuple[bool, Path, bool]] = []

    def ran_meanwhile(scratch: Path) -> None:
        """What the caller asks to be done while submissions run: in a thread, with a folder."""
        meanwhile.append((threading.current_thread() is not threading.main_thread(), scratch, scratch.is_dir()))
    outcome = grade_batch(discover([folder]), assignment, sandbox, loose, out, workers=2, progress=io.StringIO(),
                          meanwhile=ran_meanwhile)
    assert (outcome.reused, outcome.regraded, submitted, meanwhile) == (0, 2, [], [])
    assert results(out, "reference")["extra_data"]["digests"]["evaluation"] == \
        SubmissionGrader(assignment, sandbox, loose).digests["evaluation"]

    # An execution change (here, a limit; a changed probe case or driver works the same way): run again.
    slower = assignment.rubric.with_limits(cell_timeout_s=assignment.rubric.limits.cell_timeout_s + 1)
    outcome = grade_batch(discover([folder]), assignment, sandbox, slower, out, workers=2, progress=io.StringIO(),
                          meanwhile=ran_meanwhile)
    assert (outcome.reused, outcome.regraded) == (0, 0) and sorted(submitted) == list(IDS)
    (in_a_thread, scratch, existed), = meanwhile
    assert in_a_thread and existed and not scratch.exists()   # removed by the pool's guard

    submitted.clear()
    monkeypatch.setattr(digests, "execution_digest", lambda *a, **k: "another execution digest")
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                          progress=io.StringIO())
    assert (outcome.reused, outcome.regraded) == (0, 0) and sorted(submitted) == list(IDS)
    # Put the folder back as the real grader left it, for the tests after this one.
    monkeypatch.undo()
    monkeypatch.setattr(local_module, "ProcessPoolExecutor", None)
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                          progress=io.StringIO())
    assert outcome.regraded == 2
    for submission_id in IDS:
        assert verdicts(results(out, submission_id)) == verdicts(first[submission_id])


def test_damaged_or_foreign_kept_runs_are_run_again(graded, assignment, sandbox, tmp_path):
    _, out, first = graded
    grader = SubmissionGrader(assignment, sandbox)
    sha = first["reference"]["submission_sha256"]
    kept = (out / "reference" / RAW_OUTPUTS).read_bytes()
    folder = tmp_path / "reference"
    folder.mkdir()
    for damaged in (kept[: len(kept) // 2], b"X" + kept[1:], kept[:-3], b""):
        (folder / RAW_OUTPUTS).write_bytes(damaged)
        assert grader.kept_run(folder, sha) is None
    (folder / RAW_OUTPUTS).unlink()
    (folder / RAW_OUTPUTS).symlink_to(out / "reference" / RAW_OUTPUTS)
    assert grader.kept_run(folder, sha) is None   # never follows a link
    assert grader.kept_run(out / "reference", sha) is not None


def test_kept_run_reads_back_what_was_kept():
    arrays = {"y": np.arange(6, dtype=np.float32).reshape(2, 3), "decay": np.array(0.5)}
    probe = ProbeResult("ok", None, {
        "a": CaseOutput("ok", None, {"shape": [2, 3], "nan": float("nan")}, arrays,
                        [[np.ones((1, 2, 2))], [np.zeros(3, dtype=np.float32), np.ones(2)]]),
        "b": CaseOutput("timeout", "stopped at 10 s")}, ["a probe note"])
    execution = ExecutionResult([CellRun(0, "setup", "ok"), CellRun(3, None, "error", "ValueError: x")], "ok", False,
                                {"MEMORY_BILL": {"T": [1, 2]}}, ["memory"], ["a note"])
    run = KeptRun(execution, None, probe, None, ["stage note"], True)
    back = KeptRun.unpack(run.pack("key"), "key")
    assert back is not None and KeptRun.unpack(run.pack("key"), "other key") is None
    assert back.execution == replace(execution, executed_notebook=None) and back.notes == ["stage note"] and back.ran
    assert back.probe.notes == probe.notes and list(back.probe.cases) == ["a", "b"]
    got = back.probe.cases["a"]
    for name, value in arrays.items():
        assert got.arrays[name].dtype == value.dtype and np.array_equal(got.arrays[name], value)
    assert [[a.dtype for a in s] for s in got.states] == [[np.float64], [np.float32, np.float64]]
    assert got.info["shape"] == [2, 3] and np.isnan(got.info["nan"])
    assert back.probe.cases["b"] == CaseOutput("timeout", "stopped at 10 s")
    nothing = KeptRun(None, "not JSON", None, "no scaffold", [], False)
    assert KeptRun.unpack(nothing.pack("k"), "k") == nothing


def _copy_grader(tmp_path: Path) -> Path:
    root = tmp_path / "grader"
    shutil.copytree(digests.GRADER_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_real_digests_follow_the_files(assignment, tmp_path):
    """On a copy of the grader: editing a check changes evaluation only, editing the probe
    driver or the notebook runner changes execution only, a report page neither."""
    rubric = assignment.rubric
    checks = checks_for(rubric)
    root = _copy_grader(tmp_path)

    def both() -> tuple[str, str]:
        return (digests.execution_digest(checks, rubric, assignment.fingerprint, root),
                digests.evaluation_digest(checks, rubric, root))
    original = both()
    assert original == (digests.execution_digest(checks, rubric, assignment.fingerprint),
                        digests.evaluation_digest(checks, rubric))   # paths are relative: a copy digests the same
    edits = {"checks/linear_attention/answers.py": (True, False), "checks/compare.py": (True, False),
             "score.py": (True, False), "written/injection.py": (True, False),
             "checks/linear_attention/probe_driver.py": (False, True), "execute.py": (False, True),
             "harness/run_notebook.py": (False, True), "probe.py": (False, True),
             "report/pages.py": (False, False), "cli.py": (False, False)}
    for relative, (evaluation_changes, execution_changes) in edits.items():
        path = root / relative
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        execution, evaluation = both()
        assert (evaluation != original[1], execution != original[0]) == (evaluation_changes, execution_changes), relative
        path.write_text(text)
    assert both() == original

    # The screening (kept flags) follows the written stage only.
    screening = digests.screening_digest(rubric, root)
    for relative, changes in {"written/injection.py": True, "checks/linear_attention/answers.py": False}.items():
        text = (root / relative).read_text()
        (root / relative).write_text(text + "\n# edited\n")
        assert (digests.screening_digest(rubric, root) != screening) == changes, relative
        (root / relative).write_text(text)
    assert digests.screening_digest(replace(rubric, tolerances={}), root) == screening

    # The rubric: a tolerance is evaluation, a limit both; the probe's cases as data are execution.
    loose = replace(rubric, tolerances={**rubric.tolerances, "hybrid_gradient_floor": 1.0})
    assert digests.evaluation_digest(checks, loose) != original[1]
    assert digests.execution_digest(checks, loose, assignment.fingerprint) == original[0]
    slower = rubric.with_limits(cell_timeout_s=rubric.limits.cell_timeout_s + 1)
    assert digests.execution_digest(checks, slower, assignment.fingerprint) != original[0]
    cases = checks.probe_cases(rubric)
    changed = [replace(cases[0], arrays={k: v + 1 for k, v in cases[0].arrays.items()}), *cases[1:]]
    assert digests.probe_cases_digest(changed) != digests.probe_cases_digest(cases)
    assert digests.probe_cases_digest(list(cases)) == digests.probe_cases_digest(checks.probe_cases(rubric))


@pytest.mark.parametrize("name", ["linear_attention", "linear_attention_hyena"])
def test_every_grader_module_is_execution_evaluation_or_neither(name):
    from grader.assignment import Assignment
    checks = checks_for(Assignment(name).rubric)
    execution = set(digests.execution_files(checks))
    evaluation = set(digests.evaluation_files(checks))
    neither = {p for pattern in digests.NEITHER for p in digests.GRADER_DIR.glob(pattern)}
    every = {p for p in digests.GRADER_DIR.rglob("*.py") if "__pycache__" not in p.parts}
    assert not execution & evaluation and not execution & neither and not evaluation & neither
    assert execution | evaluation | neither == every, sorted(str(p) for p in every - execution - evaluation - neither)
    if checks.PROBE_DRIVER:
        assert checks.PROBE_DRIVER.resolve() in execution
    assert digests.GRADER_DIR / "checks" / name / "items.py" in evaluation
