"""Inline checks (``grader.checks.inline``): test cells of a master notebook decided outside the
student's process.

Most of it runs the probe's own harness apart from this process (``probe_apart``) on the small
assignment of ``inline_assignment``: correct submissions in other styles earn every test, each
mistake loses exactly its own, and each trick that fools a test run in the student's process
gains nothing. One real sandboxed batch shows the same verdicts where only the sandbox proves
them, and ``grader new`` is followed by ``validate`` and ``grade`` in a temporary root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

from grader import cells
from grader.assign import student_notebook
from grader.checks import CheckContext, inline
from grader.graft import submission_module_source

import inline_assignment as demo
from conftest import ROOT
from grader.probe import ProbeResult, harness_request, read_answer
from grader.sandbox import ONE_THREAD_ENV

GRADER = [sys.executable, "-m", "grader.cli"]


@pytest.fixture(scope="module")
def assignment(tmp_path_factory):
    return demo.write_assignment(tmp_path_factory.mktemp("inline"))


@pytest.fixture(scope="module")
def tests_of(assignment):
    return inline.inline_tests(assignment.master)


# Runs each request file's cases with the harness's own supervisor in a child of a fresh
# process, writing the supervisor's stream beside it: the tricks patch numpy, math and sys in the
# process that runs them, and a child forked from this one (torch's threads started) can hang.
RUN_REQUESTS = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from probe_in_process import HARNESS, InProcessSupervisor
for request in sorted(Path(sys.argv[1]).glob("*.request")):
    pid = os.fork()
    if pid == 0:
        try:
            with open(request, "rb") as data:
                plan, store, offsets = HARNESS.read_request(data.fileno())
            supervisor = InProcessSupervisor(plan, store, offsets)
            supervisor.run(ready=time.monotonic())
            request.with_suffix(".stream").write_bytes(bytes(supervisor.stream))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""


def probe_apart(sources: dict[str, str], cases: list) -> dict[str, ProbeResult]:
    """``probe_in_process`` for each grafted module of ``sources``, run apart from this process
    (``RUN_REQUESTS``); the answers are read back here, where the verdicts are decided."""
    with tempfile.TemporaryDirectory() as folder:
        for name, source in sources.items():
            Path(folder, f"{name}.request").write_bytes(harness_request(source, cases, 60.0, False, None))
        subprocess.run([sys.executable, "-c", RUN_REQUESTS, folder, str(Path(__file__).parent)], check=True,
                       env={**os.environ, **ONE_THREAD_ENV}, capture_output=True)
        found = {}
        for name in sources:
            answer = read_answer(Path(folder, f"{name}.stream").read_bytes(), cases)
            assert answer is not None, f"{name}: the harness reported no import"
            found[name] = ProbeResult(answer.import_status, answer.import_error, answer.outputs)
    return found


def verdicts(assignment, tests, scaffolds: dict[str, str]) -> dict[str, dict[str, object]]:
    """Every test cell's verdict on each submission of ``scaffolds`` (id -> its scaffold cell),
    the probe's harness run apart from this process, the verdicts decided here."""
    sources = {name: submission_module_source(assignment.master, {demo.SCAFFOLD_ID: scaffold})[0]
               for name, scaffold in scaffolds.items()}
    runs = inline.master_runs(assignment.master_path, assignment.fingerprint)
    found = {}
    for name, probe in probe_apart(sources, inline.probe_cases(tests)).items():
        context = CheckContext(assignment.rubric, assignment.master_path, probe, None, None, None)
        found[name] = inline.evaluate(tests, context, runs)
    return found


@pytest.fixture(scope="module")
def corpus_verdicts(assignment, tests_of):
    return verdicts(assignment, tests_of, {name: scaffold for name, (scaffold, _) in demo.SUBMISSIONS.items()})


# ----------------------------------------------------------------------------- the corpus, both ways

def test_correct_code_earns_every_test_and_each_mistake_or_trick_loses_exactly_its_own(corpus_verdicts):
    """Measured both ways, with the figures printed: what must pass and what must fail."""
    wrong: list[str] = []
    tally = {}
    for family, corpus in (("correct", demo.CORRECT), ("mistakes", demo.MISTAKES), ("tricks", demo.HOSTILE),
                           ("fourth-round tricks", demo.FOURTH_ROUND)):
        right = 0
        for name, (scaffold, earns) in corpus.items():
            found = corpus_verdicts[name]
            passed = {test for test, verdict in found.items() if verdict.status == "passed"}
            errors = {test: v.message for test, v in found.items() if v.status == "error"}
            if passed == set(earns) and not errors:
                right += 1
            else:
                wrong.append(f"{name}: passed {sorted(passed)}, expected {sorted(earns)}; errors {errors}")
        tally[family] = (right, len(corpus))
    print("\ninline checks: " + "; ".join(f"{family} {right} of {total} as expected"
                                          for family, (right, total) in tally.items()))
    assert not wrong, "\n".join(wrong)


def test_failures_say_what_differed(corpus_verdicts):
    def said(submission: str, test: str) -> str:
        verdict = corpus_verdicts[submission][test]
        assert verdict.status == "failed", (submission, test, verdict)
        return verdict.message
    found = said("naive_softplus", "softplus_values")
    assert "line 4 (its run 3 of 3)" in found and "`softplus(value)` is np.float64(inf)" in found, found
    mean = said("off_by_one_mean", "running_mean_matches")
    assert "Not equal to tolerance" in mean and "(its run 2 of 3)" in mean, mean   # numpy's own report
    assert "`mask.dtype` is torch.float32" in said("float_mask", "causal_mask_torch")
    assert "no exception was raised" in said("no_zero_check", "normalize_rejects_zero")
    assert "holds a collections.Counter" in said("counter", "count_words_examples")
    assert said("raises_to_skip", "causal_mask_torch").startswith("the test did not finish: SkipTest")
    assert said("silenced_traceback", "running_mean_matches").startswith("the test did not finish: SystemExit")
    # read as the int it is: its __eq__ never runs
    assert "`first_negative([1, 2, 3])` is 7" in said("always_equal", "lookups")
    empty = said("empty_results", "empty_never_close")   # np.allclose would broadcast it against 1.0
    assert "`running_mean(np.ones((4, 2)))` has shape (0, 2); with the reference solution it has shape (4, 2)" in empty
    assert "no exception was raised" in said("wraps_the_recorder", "normalize_rejects_zero")   # its wrapper never ran
    patched = said("patched_comparisons", "softplus_values")
    assert "max-abs error 15 at ((0,)): expected 9.35762e-14, got -15" in patched, patched   # numpy's allclose, not the student's


def test_the_sandbox_program_holds_no_expected_value(tests_of):
    """What the student's process runs: the inputs and the calls of the student's code, never
    the values they are compared with, nor the helpers that compute them."""
    programs = {test.name: test.sandbox_program for test in tests_of}
    assert "reference" not in programs["running_mean_matches"] and "expected" not in programs["running_mean_matches"]
    assert "rng.standard_normal((rows, 3))" in programs["running_mean_matches"]   # an input stays
    assert "log1p" not in programs["softplus_values"] and "math.log(2.0)" not in programs["softplus_values"]
    assert "[0.6, 0.8]" not in programs["normalize_rejects_zero"] and "'zero'" not in programs["normalize_rejects_zero"]
    assert "torch.tril" not in programs["causal_mask_torch"]
    assert "'the': 2" not in programs["count_words_examples"] and "pytest" not in programs["normalize_rejects_zero"]
    assert not any(test.in_sandbox for test in tests_of)


def _one_test(source: str, name: str = "t") -> inline.InlineTest:
    master = demo.master_notebook()
    master.cells = [c for c in master.cells if cells.TEST not in cells.tags(c)]
    master.cells.append(nbformat.v4.new_code_cell(source, id="probe-test", metadata={
        "tags": [cells.TEST], "g2c": {"test": {"name": name, "points": 1}}}))
    return inline.inline_tests(master)[0]


def test_what_is_the_students_follows_the_cell_statement_by_statement():
    in_place = _one_test("v = np.array([3.0, 4.0])\nexpected = v / 5\nnormalize(v)\n"
                         "assert np.allclose(v, expected)\n")
    site = in_place.sites[0]
    assert site.tainted == (False, True, False), "v after the student's call is theirs; expected stays the grader's"
    helper = _one_test("def check(value):\n    assert value == softplus(0.0)\n\ncheck(1.0)\n")
    assert helper.sites[0].tainted == (True, True), "a helper's parameter may hold the student's values"
    collected = _one_test("found = []\nfor v in (1.0, 2.0):\n    found.append(softplus(v))\n"
                          "assert found[0] < found[1]\n")
    assert collected.sites[0].tainted == (True, True)
    rebound = _one_test("x = softplus(1.0)\nx = 2.0\nassert x == 2.0\n")
    assert rebound.sites[0].tainted == (False,)   # nothing of the student's: one operand, the grader's


def test_forms_whose_comparison_is_the_students_are_marked_in_the_sandbox():
    assert _one_test("assert first_negative([1, -1]) == 1\n").in_sandbox is False
    assert _one_test("assert first_negative([1, -1])\n").in_sandbox is True
    assert _one_test("assert count_words('a') or count_words('b')\n").in_sandbox is True
    assert _one_test("softplus(1.0)\n").in_sandbox is True   # no check: passes by not raising
    assert _one_test("assert not first_negative([1])\n").in_sandbox is True
    assert _one_test("assert isinstance(count_words('a'), dict)\n").in_sandbox is False


def test_a_pass_decided_in_the_students_process_waits_for_a_ta(tmp_path):
    """Conservative: a truth value the student's code computed never earns points by itself; a
    failure it reports is still a failure. ``validate`` names the line, why, and the fix."""
    master = demo.master_notebook()
    master.cells = [c for c in master.cells if cells.TEST not in cells.tags(c)]
    for name, source in (("self_decided", "assert first_negative([1, -1])\n"),
                         ("compared", "assert first_negative([1, -1]) == 1\n")):
        master.cells.append(nbformat.v4.new_code_cell(source, id=name.replace("_", "-"), metadata={
            "tags": [cells.TEST], "g2c": {"test": {"name": name, "points": 1}}}))
    path = tmp_path / "solutions" / demo.NAME / f"{demo.NAME}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(master, str(path))
    tests = inline.inline_tests(master)
    never = demo.scaffold(first_negative="def first_negative(values):\n    return None\n")
    sources = {name: submission_module_source(master, {demo.SCAFFOLD_ID: scaffold})[0]
               for name, scaffold in (("solution", demo.scaffold()), ("never", never))}
    runs = inline.master_runs(path, "ta")
    found = {name: inline.evaluate(tests, CheckContext(None, path, probe, None, None, None), runs)
             for name, probe in probe_apart(sources, inline.probe_cases(tests)).items()}
    decided = found["solution"]["self_decided"]
    assert decided.status == "error" and "a TA confirms it" in decided.message, decided
    assert "line 1, `assert first_negative([1, -1])`" in decided.internal
    assert found["solution"]["compared"].status == "passed"
    failing = found["never"]["self_decided"]
    assert failing.status == "failed" and "decided inside your code's process" in failing.message, failing
    reasons = {test.name: test.sandbox_reasons for test in tests}
    assert reasons["compared"] == [] and "e.g. `assert f(x) == expected`" in reasons["self_decided"][0]


@pytest.mark.parametrize("source, said", [
    ("with pytest.raises(ValueError) as info:\n    normalize(np.zeros(2))\n", "without `as`"),
    ("with pytest.raises(first_negative([1])):\n    normalize(np.zeros(2))\n", "neither computed"),
    ('"""\n>>> x = softplus(1.0)\n1\n"""\n', "a statement expects output"),
    ("assert softplus(1.0) ==\n", "invalid syntax"),
    ("assert first_negative(list(map(lambda v: -v, [1, 2]))) == 0\n", None),   # the lambda stays in the test
    ("assert vector_length(lambda: 1) == 1\n", None),   # a provided helper: the test's process has its own
    ("assert count_words(text=lambda: 'a') == {}\n", "passes a lambda, a function the test defines"),
    ("def key(v):\n    return v\n\nassert first_negative(key) is None\n", "passes `key`, a function the test"),
])
def test_a_test_cell_the_grader_cannot_use_is_refused_with_its_reason(source, said):
    if said is None:
        _one_test(source)   # read as it is
        return
    with pytest.raises(inline.InlineError, match="test cell 'probe-test'") as raised:
        _one_test(source)
    assert said in str(raised.value)


def test_test_cell_metadata_is_checked():
    master = demo.master_notebook()
    master.cells[-1].metadata["g2c"]["test"]["pionts"] = 1
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['pionts'\]"):
        cells.test_cells(master)
    master.cells[-1].metadata["g2c"]["test"] = {"name": "x y", "points": 1}
    with pytest.raises(ValueError, match="must be an item name"):
        cells.test_cells(master)


def test_values_cross_as_data_only():
    arrays = {"a0": np.array([1.0, 0.0])}
    assert inline.from_data({"array": "a0", "dtype": "bool"}, arrays).dtype == np.bool_
    assert inline.from_data({"tuple": [1, {"float": "nan"}]}, arrays)[1] != inline.from_data({"float": "nan"}, {})
    seen: list[str] = []
    assert inline.from_data({"sub": "collections.Counter", "of": {"dict": [["a", 2]]}}, {}, seen) == {"a": 2}
    assert seen == ["collections.Counter"]
    for junk in ({"refused": "a Foo"}, {"array": "a9", "dtype": "float64"}, {"scalar": 1, "dtype": "object"},
                 [1, 2], {"dict": [[{"list": [1]}, 2]]}, {"pickle": "..."}):
        with pytest.raises(inline.NotData):
            inline.from_data(junk, arrays)


def test_a_test_that_fails_on_the_master_is_a_grader_error_not_the_students(tmp_path):
    master = demo.master_notebook()
    next(c for c in master.cells if c.get("id") == "test-lookups").source = "assert first_negative([1, 2]) == 0\n"
    path = tmp_path / "solutions" / demo.NAME / f"{demo.NAME}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(master, str(path))
    tests = inline.inline_tests(master)
    runs = inline.master_runs(path, "broken")
    assert "the reference solution fails line 1" in runs["lookups"].problem
    source, _ = submission_module_source(master, {demo.SCAFFOLD_ID: demo.scaffold()})
    probe = probe_apart({"solution": source}, inline.probe_cases(tests))["solution"]
    found = inline.evaluate(tests, CheckContext(None, path, probe, None, None, None), runs)
    assert found["lookups"].status == "error" and "not your fault" in found["lookups"].message
    assert found["softplus_values"].status == "passed"


def test_hidden_test_cells_never_reach_the_student_and_no_test_cell_runs_in_the_notebook(assignment):
    student = student_notebook(assignment.master)
    kept = {t.name for t in cells.test_cells(student)}
    assert kept == {"softplus_values", "normalize_rejects_zero"}   # the visible ones
    assert "reference(x)" not in json.dumps(student)
    check_py = (assignment.template_path.parent / "check.py").read_text()
    assert "running_mean_matches" not in check_py and "torch.tril" not in check_py
    from grader.execute import prepare_notebook
    prepared = prepare_notebook(assignment.master, assignment.master, [])
    assert not cells.test_cells(prepared)


# ----------------------------------------------------------------------------- one real sandboxed batch

SANDBOXED = ("torch_style", "naive_softplus", "patched_comparisons", "silenced_traceback",
             "reads_expected_from_frames", "swapped_module_attributes", "frames_table", "scans_own_memory",
             "wraps_the_recorder")


@pytest.fixture(scope="module")
def graded_batch(assignment, tmp_path_factory):
    folder = tmp_path_factory.mktemp("inline-submissions")
    for name in SANDBOXED:
        nbformat.write(demo.submission_notebook(assignment, demo.SUBMISSIONS[name][0]), str(folder / f"{name}.ipynb"))
    out = folder.parent / "inline-out"
    done = subprocess.run([*GRADER, "grade", str(folder), "--assignment", demo.NAME, "--assignment-root",
                           str(assignment.root), "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_sandbox_gives_the_verdicts_the_harness_gives_here(graded_batch, assignment, tests_of):
    for name in SANDBOXED:
        results = json.loads((graded_batch / name / "results.json").read_text())
        by_name = {t["name"]: t for t in results["tests"]}
        passed = {test.name for test in tests_of if by_name[test.cell.title]["status"] == "passed"}
        assert passed == set(demo.SUBMISSIONS[name][1]), (name, {k: v["output"] for k, v in by_name.items()})
        assert by_name["notebook executes headless"]["status"] == "passed", name   # test cells never run there
        hidden = by_name["running_mean_matches"]
        assert hidden["visibility"] == "hidden"
    page = (graded_batch / "naive_softplus" / "report.html").read_text()
    assert "softplus_values" in page and "np.float64(inf)" in page


# ----------------------------------------------------------------------------- grader new, validate, grade

def test_grader_new_then_validate_then_grade(tmp_path):
    root = tmp_path / "course"
    made = subprocess.run([*GRADER, "new", "demo", "--out", str(root)], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert (root / "assignments" / "demo" / "check.py").is_file() and (root / "rubrics" / "demo.yaml").is_file()
    again = subprocess.run([*GRADER, "new", "demo", "--out", str(root)], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 2 and "already exist" in again.stderr
    checked = subprocess.run([*GRADER, "validate", "--assignment", "demo", "--assignment-root", str(root)],
                             cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "validate: OK" in checked.stdout and "test cells: 2, 0 of them (0%) decided in the sandbox" in checked.stdout
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    solved = nbformat.read(str(root / "solutions" / "demo" / "demo.ipynb"), as_version=4)
    nbformat.write(solved, str(submissions / "ada.ipynb"))
    graded = subprocess.run([*GRADER, "grade", str(submissions), "--assignment", "demo", "--assignment-root",
                             str(root), "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True)
    assert graded.returncode == 0, graded.stderr
    results = json.loads((tmp_path / "out" / "ada" / "results.json").read_text())
    assert {t["name"]: t["status"] for t in results["tests"]} == {
        "the notebook runs headless without an error": "passed", "mean_square_small": "passed",
        "mean_square_random": "passed", "Written: q1": "failed"}
    assert (tmp_path / "out" / "summary.html").is_file()
    checked = subprocess.run([*GRADER, "check", str(submissions / "ada.ipynb"), "--assignment-root", str(root)],
                             cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 1 and "NOT CHECKED: the visible test calls your code" in checked.stdout, (
        checked.stdout + checked.stderr)
    checked = subprocess.run([*GRADER, "check", str(submissions / "ada.ipynb"), "--assignment-root", str(root),
                              "--run"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0 and "READY: " in checked.stdout and "the visible test passes" in checked.stdout, (
        checked.stdout + checked.stderr)
    bundle = subprocess.run([*GRADER, "gradescope-bundle", "--assignment", "demo", "--assignment-root", str(root),
                             "--out", str(tmp_path / "autograder.zip")], cwd=tmp_path, capture_output=True, text=True)
    assert bundle.returncode == 0, bundle.stderr
    names = zipfile.ZipFile(tmp_path / "autograder.zip").namelist()
    assert {"rubrics/demo.yaml", "solutions/demo/demo.ipynb", "assignments/demo/check.py"} <= set(names)


def test_grader_assign_writes_beside_the_master_before_any_checks_module_exists(tmp_path):
    root = tmp_path / "course"
    subprocess.run([*GRADER, "new", "demo", "--out", str(root)], cwd=tmp_path, check=True, capture_output=True)
    rubric = root / "rubrics" / "demo.yaml"
    rubric.write_text(rubric.read_text().replace("assignment: demo\n", "assignment: demo\nchecks: demo_checks\n"))
    (root / "assignments").rename(tmp_path / "old")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([*GRADER, "assign", str(root / "solutions" / "demo" / "demo.ipynb")], cwd=elsewhere,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (root / "assignments" / "demo" / "demo.ipynb").is_file() and not any(elsewhere.iterdir())
    refused = subprocess.run([*GRADER, "validate", "--assignment", "demo", "--assignment-root", str(root)],
                             cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode == 2 and "`demo_checks` cannot be imported" in refused.stderr
    assert "drop `checks:`" in refused.stderr


def test_a_result_holding_nan_is_described_as_such():
    """A failed comparison describes each operand; one holding NaN or infinities says so, since
    that, not its shape, is why no closeness check holds (issue 43)."""
    assert inline._summary(np.array([np.nan, np.nan])) == "an array of shape (2,), dtype float64, holding 2 NaN of 2 values"
    assert inline._summary(np.array([1.0, np.inf, np.nan])).endswith("holding 1 NaN and 1 infinite of 3 values")
    assert inline._summary(np.array([1.0, 2.0])) == "an array of shape (2,), dtype float64"
