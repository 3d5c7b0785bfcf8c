"""Where a submission's grading time went: the stages and the peak memory in results.json's
``extra_data.timings``, read with caps from what the sandboxed drivers report, and shown on
the TA's page only."""
from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import numpy as np

from grader import untrusted
from grader.cli import main
from grader.execute import DRIVER_DONE_LINE, execute_notebook
from grader.pipeline import EXECUTED_NOTEBOOK, KeptRun
from grader.probe import CaseCost, ProbeCase, read_answer, run_probe
from grader.score import GradeResult, ItemResult, result_from_json
from grader.report.pages import REPORT_PAGE, REVIEW_PAGE
from grader.sandbox import MemoryShare, SandboxResult

from probe_in_process import HARNESS

EXECUTION_SIDE = ("sandbox_start", "kernel_start")
AFTER_THE_CELLS = ["probe_start", "probe_cases", "checks", "written", "report"]
WALL = 2.0   # the wall time the stand-in sandboxes below report for their run


def timings(out: Path, submission_id: str) -> dict:
    return json.loads((out / submission_id / "results.json").read_text())["extra_data"]["timings"]


def cell_names(executed: Path) -> list[str]:
    """``code cell N (In[n])`` for every code cell of an executed notebook, numbered among code cells."""
    code = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    return [f"code cell {n} (In[{c['execution_count']}])" for n, c in enumerate(code, start=1)]


def test_a_normal_run_records_every_stage_in_order_with_its_peak_memory(batch):
    _, out, _ = batch
    for submission_id in ("warns", "raises"):   # every cell runs in both (one of them raises)
        recorded = timings(out, submission_id)
        names = [name for name, _ in recorded["stages"]]
        assert names == [*EXECUTION_SIDE, *cell_names(out / submission_id / EXECUTED_NOTEBOOK), *AFTER_THE_CELLS]
        assert all(type(value) is float and value >= 0 for _, value in recorded["stages"])
        # the file's own grading time (other tests regrade the shared batch's folder in place)
        written = json.loads((out / submission_id / "results.json").read_text())["execution_time"]
        # one time, rounded to 3 places there and to 2 here (rounding 10.195 again gives 10.2, not 10.19)
        assert written > 0 and abs(recorded["wall_s"] - written) <= 0.0055 + 1e-9
        assert 0 < recorded["peak_memory_mib"] < 4096   # the memory limit is 4 GiB
        # the stages that add up to the sandboxed work cannot take longer than the whole grading
        assert sum(value for name, value in recorded["stages"] if name != "report") <= 2 * recorded["wall_s"]


def test_a_notebook_that_cannot_run_records_only_the_stages_that_happened(batch):
    _, out, _ = batch
    # broken JSON: nothing is executed or probed; the checks, the screening and the report still happen
    assert [name for name, _ in timings(out, "broken_json")["stages"]] == ["checks", "written", "report"]
    assert "peak_memory_mib" not in timings(out, "broken_json")


def test_the_ta_page_shows_one_row_per_stage_and_the_student_page_none(batch, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(batch[1], copy)
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(copy)]) == 0
    recorded = timings(copy, "warns")
    review = (copy / "warns" / REVIEW_PAGE).read_text()
    block = re.search(r'<details class="meta" id="timings">(.*?)</details>', review, re.S).group(1)
    rows = re.findall(r"<tr><td>([^<]*)</td><td class=\"num\">([0-9.]+)</td></tr>", block)
    assert [name for name, _ in rows] == [name for name, _ in recorded["stages"]]
    assert [float(value) for _, value in rows] == [value for _, value in recorded["stages"]]
    assert f"peak memory {recorded['peak_memory_mib']:.0f} MiB" in block
    assert 'id="timings"' not in (copy / "warns" / REPORT_PAGE).read_text()


class ReportingSandbox:
    """Stands in for the sandbox around a driver that reports ``report`` (its results.json,
    vouched by digest) for a run of ``WALL`` seconds: what a driver that went wrong, or was
    subverted, could say. What is tested is how the trusted side reads it."""

    isolation, sandboxed, own_pid_namespace = "bubblewrap", True, True

    def __init__(self, report: bytes):
        self.report = report

    def run(self, argv, *, scratch: Path, timeout, env, share, cpu_limit, idle_limit) -> SandboxResult:
        (scratch / "execute" / "results.json").write_bytes(self.report)
        vouched = f"G2C-FILE {hashlib.sha256(self.report).hexdigest()} results.json\n{DRIVER_DONE_LINE}\n"
        return SandboxResult(0, vouched, "", False, WALL, [], True, started=time.monotonic() - WALL)


def test_hostile_notebook_driver_timings_are_capped_or_dropped(assignment, tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = {i}") for i in range(5)])
    cells = [{"index": i, "status": "ok", "seconds": value}
             for i, value in enumerate([1e308, -4, "3", True, 0.25])]
    for started, sandbox_start in ((10**400, None), ("soon", None), (time.monotonic() + 3600, WALL), (0, 0.0)):
        report = json.dumps({"cells": cells, "kernel": "ok",
                             "timings": {"started": started, "kernel_start": float("inf")}}).encode()
        scratch = tmp_path / f"scratch-{sandbox_start}-{type(started).__name__}"
        scratch.mkdir()
        result = execute_notebook(notebook, ReportingSandbox(report), scratch, assignment.rubric.limits, ())
        expected = [("sandbox_start", sandbox_start)] if sandbox_start is not None else []
        # not vouched for, the executed notebook gives no In[n]: cells go by their number alone
        assert result.stages() == expected + [("code cell 1", WALL), ("code cell 2", 0.0), ("code cell 5", 0.25)]
        assert [c.status for c in result.cells] == ["ok"] * 5   # timings decide nothing


class ProbeSandbox:
    """Stands in for the sandbox around the probe's supervisor, whose import frame says it was
    ready at ``ready``: a run of ``WALL`` seconds, its memory given to the share."""

    isolation, sandboxed, own_pid_namespace = "bubblewrap", True, True

    def __init__(self, ready):
        self.ready = ready

    def run(self, argv, *, scratch, timeout, stdin, read_only, output_bytes, share, cpu_limit, env,
            idle_limit) -> SandboxResult:
        started = time.monotonic() - WALL
        ready = started + self.ready if isinstance(self.ready, float) else self.ready
        frame = HARNESS.frame({"case": "import", "segment": None, "status": "error", "error": "no module",
                               "syscall_filter": True, "ready": ready}, None)
        share.over(1, 300 * 2**20, 2**30)
        return SandboxResult(0, "", "", False, WALL, [], True, frame, started=started)


def test_hostile_probe_timings_are_capped_or_counted_as_start(tmp_path):
    case = ProbeCase("c", "call", {"calls": []}, {"x": np.zeros(2)})
    for ready, start in ((0.5, 0.5), (1e300, WALL), (-1e300, 0.0), ("later", WALL), (None, WALL), (True, WALL)):
        share = MemoryShare()
        result = run_probe("x = 1", [case], ProbeSandbox(ready), tmp_path, 10.0, share=share)
        assert result.import_status == "error"
        assert result.stages() == [("probe_start", start), ("probe_cases", round(WALL - start, 3))]
        assert share.peak_bytes == 300 * 2**20


def test_hostile_case_costs_are_capped_or_counted_as_zero():
    """A record's seconds and forks are timings: anything but a bounded number counts as nothing."""
    case = ProbeCase("c", "call", {"calls": []}, {"x": np.zeros(2)})
    expected = {(0.25, 1): CaseCost(0.25, 1), (1e300, 0): CaseCost(86_400.0, 0), (-5.0, 2): CaseCost(0.0, 0),
                ("later", True): CaseCost(0.0, 0), (None, -1): CaseCost(0.0, 0), (float("nan"), 1.0): CaseCost(0.0, 0)}
    for (seconds, forks), cost in expected.items():
        stream = HARNESS.frame({"case": "import", "segment": None, "status": "error", "error": "no module",
                                "seconds": seconds, "forks": forks}, None)
        assert read_answer(stream, [case]).costs == {"import": cost}, (seconds, forks)


def test_a_memory_share_holds_the_sum_of_its_runs_and_stops_the_largest():
    share = MemoryShare()
    limit = 1000
    assert share.over(1, 600, limit) is None
    assert share.over(2, 300, limit) is None
    # the sum passes the limit: the run holding the most is the one stopped
    assert share.over(2, 450, limit) is None
    assert share.over(1, 600, limit) == 1050
    share.ended(1)
    assert share.over(2, 450, limit) is None and share.peak_bytes == 1050
    alone = MemoryShare()
    assert alone.over(7, 1001, limit) == 1001


def test_kept_stages_are_read_back_with_caps():
    stages = [("sandbox_start", 0.4), ("code cell 1 (In[1])", 1.25), ("probe_cases", 3.0)]
    run = KeptRun(None, None, None, None, [], True, stages=stages, peak_memory_mib=812.5)
    back = KeptRun.unpack(run.pack("k"), "k")
    assert back is not None and back.stages == stages and back.peak_memory_mib == 812.5
    negative = KeptRun(None, None, None, None, [], True, stages=[("x", -1.0), ("y", 1e9)]).pack("k")
    assert KeptRun.unpack(negative, "k").stages == [("x", 0.0), ("y", 86_400.0)]
    for bad in ([("x" * 201, 1.0)], [("x", "1")], [("x", True)], [(1, 1.0)], [("x", 1.0)] * 10_001):
        packed = KeptRun(None, None, None, None, [], True, stages=bad).pack("k")
        assert KeptRun.unpack(packed, "k") is None, bad[:1]
    for peak in ("812", float("nan"), -1.0, True):
        packed = KeptRun(None, None, None, None, [], True, stages=stages, peak_memory_mib=peak).pack("k")
        assert KeptRun.unpack(packed, "k") is None, peak


def test_stages_in_results_json_keep_what_is_well_formed_and_a_kept_run_nothing_less():
    listed = [["sandbox_start", 0.4], ["bad seconds", "1"], [7, 1.0], ["negative", -2], ["x" * 201, 1.0],
              ["code cell 1 (In[1])", 1.25]]
    assert untrusted.stages(listed, strict=False) == [("sandbox_start", 0.4), ("negative", 0.0),
                                                      ("code cell 1 (In[1])", 1.25)]
    assert untrusted.stages(listed, strict=True) is None
    assert untrusted.stages({"not": "a list"}, strict=False) == []
    assert untrusted.stages([["a", 1.0]] * 10_001, strict=False) == []


def test_a_result_read_back_from_results_json_writes_the_same_results_json():
    """Else the first regrade after a grading finds every page's inputs changed and redraws them
    all: the top-level execution_time is rounded to 1/100 s, timings.wall_s to 1/1000 s."""
    fresh = GradeResult("s", "a", "v", "0" * 64, [ItemResult("x", "X", 1.0, 1.0, "passed", "ok", [])],
                        execution_time=3.30549, stages=[("sandbox_start", 0.25)], peak_memory_mib=100.0)
    written = fresh.to_json()
    assert result_from_json(json.loads(json.dumps(written))).to_json() == written


TORCH_UNTIL_EVALUATION = """
import sys
from grader.assignment import Assignment
from grader.cli import main
from grader.pipeline import SubmissionGrader
from grader.sandbox.factory import make_sandbox
assignment = Assignment("linear_attention")
grader = SubmissionGrader(assignment, make_sandbox(assignment.rubric.limits, allow_unsandboxed=True))
grader.probe_cases()
grader.cache_key("0" * 64)
before = "torch" in sys.modules
grader.checks.warm_up()
print(before, "torch" in sys.modules)
"""


def test_torch_waits_for_evaluation_and_its_warm_up():
    """What a worker does before its first submission's sandboxes start (the CLI, the grader,
    the probe cases, the cache key) imports no torch (about 1.5 s); the checks' ``warm_up``,
    which the grading runs beside the sandboxes, does."""
    done = subprocess.run([sys.executable, "-c", TORCH_UNTIL_EVALUATION], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout
