"""The bench's pure parts (bench/measure.py): alternation, medians, targets, bench.json.

In process and fast: nothing here starts a process or times anything (`make bench` does).
"""
from __future__ import annotations

import json
import math

import pytest

from bench.measure import (NO_DATA, OK, SHORT, Figure, Target, alternate, bench_record, check_record, cores_busy,
                           critical_path, median, ratio, slope_ms, stage_medians, write_record)


def test_alternate_runs_each_side_in_turn_every_round():
    calls = []

    def run(name, seconds):
        def go():
            calls.append(name)
            return seconds
        return go

    samples = alternate({"A": run("A", 1.0), "B": run("B", 2.0)}, 3)
    assert calls == ["A", "B", "A", "B", "A", "B"]
    assert samples == {"A": [1.0, 1.0, 1.0], "B": [2.0, 2.0, 2.0]}
    with pytest.raises(ValueError):
        alternate({"A": run("A", 1.0)}, 0)


def test_median_ratio_and_slope():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert math.isnan(median([]))
    assert ratio([10.0, 30.0, 20.0], [5.0, 100.0, 10.0]) == 2.0   # medians 20 / 10, not a mean of ratios
    assert math.isnan(ratio([1.0], []))
    # (median at 60 - median at 20) / 40, in milliseconds
    assert slope_ms([1.0, 1.2, 1.1], [1.3, 1.5, 1.4], 20, 60) == pytest.approx(7.5)


def test_targets_say_ok_short_or_no_data():
    assert Target("<=", 1.3).status(1.3) == OK
    assert Target("<=", 1.3).status(1.31) == SHORT
    assert Target("<", 10.0).status(10.0) == SHORT
    assert Target(">=", 1.8).status(1.9) == OK
    assert Target(">=", 3.0, gate=False).status(2.0) == SHORT   # a goal is still judged, and printed so
    assert Target("<=", 8.0).status(float("nan")) == NO_DATA
    with pytest.raises(ValueError):
        Target("~", 1.0)


def test_a_figure_line_names_value_target_and_verdict():
    figure = Figure("floor of x", 9.5, "s", Target("<=", 8.0), "what it is", notes=["median of 3"])
    assert figure.line() == "floor of x: 9.5 s  target <= 8 s  short; median of 3"
    goal = Figure("otter ratio", 4.0, "x", Target(">=", 3.0, gate=False), "")
    assert goal.line() == "otter ratio: 4 x  target >= 3 x (a goal)  ok"
    assert Figure("none", float("nan"), "MiB", Target("<", 2048.0), "").line().startswith("none: n/a MiB")


def test_a_short_figure_says_why_and_a_met_one_does_not():
    short = Figure("one", 2.6, "x", Target("<=", 1.3), "", why="the probe is the critical path")
    assert short.line().endswith("short\n    why: the probe is the critical path")
    assert short.record()["why"] == "the probe is the critical path"
    met = Figure("one", 1.2, "x", Target("<=", 1.3), "", why="the probe is the critical path")
    assert "why" not in met.line() and met.record()["why"] == ""


def test_the_critical_path_is_the_longer_of_notebook_and_probe_and_the_rest_is_the_command():
    stages = [("sandbox_start", 0.2), ("kernel_start", 0.5), ("code cell 1 (In[1])", 1.0), ("code cell 2 (In[2])", 2.0),
              ("probe_start", 2.0), ("probe_cases", 3.5), ("checks", 0.25), ("written", 0.05), ("report", 0.0)]
    why = critical_path(stages, 11.9)
    # the submission: max(3.7, 5.5) + 0.3; the command around it: 11.9 - 5.8
    assert why.startswith("the submission 5.80 s: the probe 5.50 s (start 2.00 s, cases 3.50 s) beside the notebook 3.70 s")
    assert why.endswith("the command around it 6.10 s (its start, the worker's, pages, shutdown)")
    faster_probe = critical_path([("kernel_start", 4.0), ("probe_start", 1.0), ("probe_cases", 1.0)], 5.0)
    assert "the notebook 4.00 s beside the probe 2.00 s" in faster_probe
    assert cores_busy(3.0, 2.0) == 1.5 and math.isnan(cores_busy(1.0, 0.0))


def test_stage_medians_keep_first_seen_order_and_count_only_runs_that_have_a_stage():
    runs = [[["sandbox_start", 0.4], ["kernel_start", 1.0], ["checks", 0.2]],
            [["sandbox_start", 0.6], ["kernel_start", 3.0]],
            [["sandbox_start", 0.5], ["kernel_start", 2.0], ["checks", 0.4], ["report", 0.1]]]
    assert stage_medians(runs) == [("sandbox_start", 0.5), ("kernel_start", 2.0), ("checks", pytest.approx(0.3)),
                                   ("report", 0.1)]


def test_bench_json_round_trips_and_a_malformed_record_is_refused(tmp_path):
    figures = [Figure("floor", 7.0, "s", Target("<=", 8.0), "the floor", {"floor": [7.0]}),
               Figure("memory", float("nan"), "MiB", Target("<", 2048.0), "peak", notes=["no timings recorded"])]
    record = bench_record(figures, quick=True, started="2026-01-01T00:00:00+00:00", wall_s=12.5,
                          stages={"a": [("checks", 0.2)]}, leftover=[], problems=[])
    path = tmp_path / "bench.json"
    write_record(record, path)
    read = json.loads(path.read_text())
    assert check_record(read) == []
    assert [f["status"] for f in read["figures"]] == [OK, NO_DATA]
    assert read["figures"][1]["value"] is None   # NaN is not JSON: no value is null
    assert read["stages"] == {"a": [["checks", 0.2]]}

    for broken, expected in ((dict(read, quick="yes"), "quick"), (dict(read, wall_s=True), "wall_s"),
                             ({k: v for k, v in read.items() if k != "figures"}, "figures"),
                             (dict(read, figures=[dict(read["figures"][0], status="fine")]), "status")):
        problems = check_record(broken)
        assert problems and expected in " ".join(problems)
        with pytest.raises(ValueError):
            write_record(broken, tmp_path / "refused.json")
    assert not (tmp_path / "refused.json").exists()


# ---------------------------------------------------------------------- run.py's fixtures and its process check

def test_the_synthetic_class_has_distinct_bytes_and_the_reference_code(tmp_path):
    import hashlib

    import nbformat

    from bench.run import CLASS_ASSIGNMENT, REPO, _synthetic_class

    folder = _synthetic_class(tmp_path / "class", 3, 10)
    paths = sorted(folder.glob("*.ipynb"))
    assert [p.name for p in paths] == ["student010.ipynb", "student011.ipynb", "student012.ipynb"]
    assert len({hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}) == 3
    master = nbformat.read(REPO / "solutions" / CLASS_ASSIGNMENT / f"{CLASS_ASSIGNMENT}.ipynb", as_version=4)
    first = nbformat.read(paths[0], as_version=4)
    changed = [(a.source, b.source) for a, b in zip(master.cells, first.cells) if a.source != b.source]
    assert len(first.cells) == len(master.cells) and len(changed) == 1
    assert changed[0][1] == changed[0][0] + "\n# bench submission 10"


def test_the_sleeping_submission_sleeps_in_its_function_only():
    """The bench's sleeper is the reference with one function redefined, last in its cell, to
    sleep: every other cell is the reference's."""
    import ast

    import nbformat

    from bench.run import CLASS_ASSIGNMENT, REPO, SLEEPING_FUNCTION, _sleeping_notebook

    master = nbformat.read(REPO / "solutions" / CLASS_ASSIGNMENT / f"{CLASS_ASSIGNMENT}.ipynb", as_version=4)
    asleep = _sleeping_notebook()
    changed = [b.source for a, b in zip(master.cells, asleep.cells) if a.source != b.source]
    assert len(asleep.cells) == len(master.cells) and len(changed) == 1
    last = [node for node in ast.parse(changed[0]).body if isinstance(node, ast.FunctionDef)][-1]
    assert last.name == SLEEPING_FUNCTION
    assert "time.sleep(3600)" in ast.unparse(last)


def test_the_edited_root_changes_one_tolerance_and_so_evaluation_only(tmp_path):
    from bench.run import CLASS_ASSIGNMENT, TOLERANCE_EDIT, _edited_root
    from grader import digests
    from grader.assignment import Assignment
    from grader.checks import checks_for

    root = _edited_root(tmp_path / "root", "0.051")
    project, edited = Assignment(CLASS_ASSIGNMENT), Assignment(CLASS_ASSIGNMENT, root)
    tolerance = TOLERANCE_EDIT[0]
    assert edited.rubric.tolerances[tolerance] == 0.051 != project.rubric.tolerances[tolerance]
    assert {k: v for k, v in edited.rubric.tolerances.items() if k != tolerance} == \
        {k: v for k, v in project.rubric.tolerances.items() if k != tolerance}
    checks = checks_for(project.rubric)
    assert digests.execution_digest(checks, edited.rubric, edited.fingerprint) == \
        digests.execution_digest(checks, project.rubric, project.fingerprint)
    assert digests.evaluation_digest(checks, edited.rubric) != digests.evaluation_digest(checks, project.rubric)


def test_what_the_bench_started_is_found_and_stopped_even_without_its_marker():
    import os
    import subprocess
    import sys

    from bench.run import MARKER, Bench, QUICK, _marked_processes

    bench = Bench(QUICK)
    # a child with the marker whose own child gets a fresh environment, as a sandbox's does; the
    # grandchild is known by the pid it reports, not by its command line (which read empty in CI)
    script = ("import subprocess, sys, time; "
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={}); "
              "print(g.pid, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, MARKER: bench.marker},
                             stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        found = _marked_processes(bench.marker)
        assert child.pid in found
        assert grandchild in found, found
        assert not _marked_processes("another run")
        stopped = bench.leftovers()
        assert len(stopped) == len(found) >= 2
        child.wait(timeout=10)
        assert not _marked_processes(bench.marker)
    finally:
        child.kill()
        child.wait()
