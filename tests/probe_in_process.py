"""The probe's own harness code, run in the test process instead of the sandbox.

``probe_in_process`` gives what ``grader.probe.run_probe`` gives for a scaffold, in a small
part of the time: the same request is built (``harness_request``), the harness's own
``Supervisor`` runs every case and segment and relays the states between segments, each
worker is the harness's ``run_case`` (a fresh import of the grafted module per case, as in a
worker), and the answer is read back by the trusted side's ``read_answer``. Only the
processes, the sandbox and the seccomp filter are missing, which is what the sandboxed tests
are for. Use it for scaffolds written here, never for hostile code.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from grader import cells
from grader.checks import CheckContext, checks_for
from grader.graft import submission_module_source
from grader.harness import HARNESS_DIR
from grader.probe import ProbeCase, ProbeResult, harness_request, read_answer


def _load_harness():
    sys.path.insert(0, str(HARNESS_DIR))   # as in the sandbox, where its modules lie beside it
    spec = importlib.util.spec_from_file_location("g2c_probe_harness", HARNESS_DIR / "probe_harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HARNESS = _load_harness()


class InProcessSupervisor(HARNESS.Supervisor):
    """The harness's supervisor whose workers are calls in this process."""

    def __init__(self, plan, store, offsets):
        super().__init__(plan, store, offsets)
        self.stream = bytearray()

    def run_worker(self, header, arrays, batch=""):
        # A sealed input stays in the supervisor's private store, as a worker keeps it (probe_harness.SEALED).
        inputs = {name: view if name.startswith(HARNESS.SEALED) else np.load(io.BytesIO(bytes(view)), allow_pickle=False)
                  for name, view in arrays}
        # A worker is a fresh process: what a case sets process-wide (the provided cells print;
        # a notebook may set torch's default dtype) must not reach the next case or test.
        default_dtype = torch.get_default_dtype()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return HARNESS.run_case(self.plan, self.handlers, header, inputs), None, False
        finally:
            torch.set_default_dtype(default_dtype)

    def report(self, record, message):
        self.stream += HARNESS.frame(record, message)


def probe_in_process(module_source: str, cases: list[ProbeCase], driver: Path | None = None,
                     supervisor_class: type = InProcessSupervisor) -> ProbeResult:
    """Every case of ``cases`` run on ``module_source`` (a grafted submission module), with the
    handlers of ``driver`` (a checks module's ``PROBE_DRIVER``) beside the harness's own, by a
    ``supervisor_class`` (an ``InProcessSupervisor``)."""
    with tempfile.TemporaryFile() as request:
        request.write(harness_request(module_source, cases, 60.0, False,
                                      driver.read_text(encoding="utf-8") if driver else None))
        request.seek(0)
        plan, store, offsets = HARNESS.read_request(request.fileno())
    supervisor = supervisor_class(plan, store, offsets)
    supervisor.run(ready=time.monotonic())
    answer = read_answer(bytes(supervisor.stream), cases)
    assert answer is not None, "the harness reported no import"
    return ProbeResult(answer.import_status, answer.import_error, answer.outputs)


def exercise_probe(assignment, symbol: str, cell: str | None, case_names: tuple[str, ...]) -> ProbeResult:
    """The checks' cases ``case_names`` alone, on the master's scaffold cells with the one that
    defines ``symbol`` replaced by ``cell`` (None: left out, as when no cell defines it)."""
    return scaffold_probe(assignment, {symbol: cell}, case_names)


def scaffold_probe(assignment, replaced: dict[str, str | None], case_names: tuple[str, ...]) -> ProbeResult:
    """The checks' cases ``case_names`` alone, on the master's scaffold cells with the cell that
    defines each symbol of ``replaced`` replaced by its source (None: left out)."""
    found = {c.id: cells.source(c) for c in assignment.master.cells if cells.SCAFFOLD in cells.tags(c)}
    for symbol, cell in replaced.items():
        (cell_id,) = [s.cell_id for s in cells.scaffolds(assignment.master) if symbol in s.symbols]
        if cell is None:
            del found[cell_id]
        else:
            found[cell_id] = cell
    source, _ = submission_module_source(assignment.master, found)
    checks = checks_for(assignment.rubric)
    return probe_in_process(source, [c for c in checks.probe_cases(assignment.rubric) if c.name in case_names],
                            checks.PROBE_DRIVER)


def exercise_verdicts(assignment, probe: ProbeResult, items: tuple[str, ...]) -> dict:
    """The checks' verdicts on ``items`` from ``probe`` alone (the notebook not executed)."""
    verdicts = checks_for(assignment.rubric).evaluate(CheckContext(
        assignment.rubric, assignment.master_path, probe, None, None, "not executed in this test"))
    return {item: verdicts[item] for item in items}


def assert_measured_both_ways(graded: dict, correct: list[str], lost: dict[str, set[str]], what: str) -> None:
    """An exercise corpus measured both ways, with the figures printed: every ``correct`` cell
    passes all its items, every mistaken cell (``lost``: its name -> the items it must lose)
    loses exactly those."""
    assert set(graded) == set(correct) | set(lost), "every file has its entry"
    assert len(correct) >= 3 and len(lost) >= 3
    passed = {name for name in correct if {v.status for v in graded[name].values()} == {"passed"}}
    caught = {name for name, items in lost.items()
              if {i for i, v in graded[name].items() if v.status != "passed"} == set(items)}
    print(f"\ncorrect {what} cells earning every item: {len(passed)} of {len(correct)}; "
          f"mistaken cells losing exactly their items: {len(caught)} of {len(lost)}")
    assert passed == set(correct) and caught == set(lost), {
        name: {i: v.message for i, v in verdicts.items() if v.status != "passed"} for name, verdicts in graded.items()}
