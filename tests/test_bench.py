"""The bench's pure parts (bench/measure.py): alternation, medians, targets, bench.json.

In process and fast: nothing here starts a process or times anything (`make bench` does).
"""
from __future__ import annotations

import json
import math

import pytest

from bench.measure import (NO_DATA, OK, SHORT, Figure, Target, alternate, bench_record, check_record, median, ratio,
                           slope_ms, stage_medians, write_record)


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
