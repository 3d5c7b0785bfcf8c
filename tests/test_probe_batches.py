"""Probe cases that share a worker (``ProbeCase.batch``), through the real harness and sandbox:
one worker per run of consecutive cases with the same key, one case at a time, each with its
own CPU limit, its own import of the module and the global state the worker was forked with;
a case that hangs ends its worker and the batch goes on in a new one. Segmented cases of one
batch run a pass per segment, and a supervisor killed in a pass names the case it was in."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import adversarial as adv
from conftest import as_scaffolds
from grader.checks.linear_attention import PROBE_DRIVER
from grader.checks.linear_attention import cases as la
from grader.graft import submission_module_source
from grader.probe import ProbeCase, run_probe
from grader.sandbox import Sandbox
from probe_in_process import InProcessSupervisor, probe_in_process

MODULE = """
import builtins, os, time
import torch

CALLS = 0


def where():
    global CALLS
    CALLS += 1
    builtins.g2c_cases_seen = getattr(builtins, "g2c_cases_seen", 0) + 1
    return torch.tensor([float(os.getpid()), float(CALLS), float(builtins.g2c_cases_seen), torch.rand(1).item(),
                         float(torch.get_default_dtype() == torch.float64)], dtype=torch.float64)


def unsettle():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(99)
    return where()


def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return where()


def spin():
    while True:
        pass
"""
CASE_CPU_SECONDS = 2.0


def _case(name: str, symbol: str, batch: str = "", *args: float) -> ProbeCase:
    call = {"symbol": symbol, "args": [{"value": a} for a in args], "output": "y"}
    return ProbeCase(name, "call", {"calls": [call]}, {}, ("y",), batch=batch)


@pytest.fixture(scope="module")
def probed(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    cases = [_case("a1", "where", "a"), _case("a2", "unsettle", "a"), _case("a3", "where", "a"),
             _case("burn1", "burn", "a", 0.6 * CASE_CPU_SECONDS), _case("burn2", "burn", "a", 0.6 * CASE_CPU_SECONDS),
             _case("spin", "spin", "a"), _case("a5", "where", "a"),
             _case("alone", "where"), _case("a6", "where", "a"), _case("b1", "where", "b")]
    result = run_probe(MODULE, cases, sandbox, tmp_path_factory.mktemp("batches"), CASE_CPU_SECONDS)
    assert result.import_status == "ok", result.import_error
    found = {}
    for name, out in result.cases.items():
        y = out.arrays.get("y")
        found[name] = {"status": out.status, "error": out.error, **(
            dict(zip(("pid", "calls", "seen", "rand", "float64"), y.tolist())) if y is not None else {})}
    return found


def test_consecutive_cases_of_one_batch_share_a_worker_and_nothing_else_does(probed):
    pids = {name: case.get("pid") for name, case in probed.items()}
    assert pids["a1"] == pids["a2"] == pids["a3"] == pids["burn1"] == pids["burn2"]
    # after the hang, a new worker; a case without a key, and the next key, have their own
    assert len({pids["a1"], pids["a5"], pids["alone"], pids["a6"], pids["b1"]}) == 5
    # what code kept in the interpreter does reach the next case of its batch (the reason only
    # cases judged on their own inputs may share one), and no further
    assert [probed[n]["seen"] for n in ("a1", "a2", "a3", "a5", "alone", "a6", "b1")] == [1, 2, 3, 1, 1, 1, 1]


def test_each_case_of_a_batch_imports_the_module_afresh_from_the_state_the_worker_was_forked_with(probed):
    assert all(case["calls"] == 1 for case in probed.values() if "calls" in case)
    # a2 changed the default dtype and reseeded torch; a3, in the same worker, sees neither
    assert probed["a2"]["float64"] == 1.0 and probed["a3"]["float64"] == 0.0
    assert probed["a3"]["rand"] == probed["a1"]["rand"] == probed["alone"]["rand"] != probed["a2"]["rand"]


def test_each_case_of_a_batch_has_its_own_cpu_limit_and_a_hang_costs_only_itself(probed):
    # together the two burns pass one case's limit; each alone is within it
    assert probed["burn1"]["status"] == probed["burn2"]["status"] == "ok"
    assert probed["spin"]["status"] == "timeout"
    assert probed["spin"]["error"] == (f"stopped: the process running your code used more than "
                                       f"{CASE_CPU_SECONDS:g} CPU seconds (endless loop?)")
    assert probed["a5"]["status"] == "ok"


def _steps_batch() -> list[ProbeCase]:
    """linear_attention's step runs of its shapes and decays (float64), one batch run in passes."""
    return [c for c in la.probe_cases() if c.batch == la.STEPS_BATCH and c.name.endswith("_float64")]


def _module(assignment, step_prefix: str = "") -> str:
    """The master's scaffolds as the probe grafts them, with ``step_prefix`` run first in ``step``."""
    master = assignment.master
    return submission_module_source(master, as_scaffolds(master, adv.scaffold(master, step_prefix=step_prefix)))[0]


def test_segmented_cases_of_one_batch_run_a_pass_per_segment_and_measure_what_workers_of_their_own_do(assignment):
    """In process (the harness's own supervisor): every first half in the pass-0 worker, then
    every second half in the pass-1 worker, so no worker sees both halves of a run; the outputs
    and relayed states are those of the same runs each in workers of their own."""
    class Recording(InProcessSupervisor):
        calls: list[tuple[str, str]] = []

        def run_worker(self, header, arrays, batch=""):
            if header is not None:
                Recording.calls.append((header["name"], batch))
            return super().run_worker(header, arrays, batch)

    cases, source = _steps_batch(), _module(assignment)
    passes = probe_in_process(source, cases, PROBE_DRIVER, Recording)
    two_halves = [c.name for c in cases if len(c.segments.bounds) == 2]
    assert len(cases) == 16 and len(two_halves) == 12
    assert Recording.calls == [(c.name, "steps@0") for c in cases] + [(n, "steps@1") for n in two_halves]
    alone = probe_in_process(source, [dataclasses.replace(c, batch="") for c in cases], PROBE_DRIVER)
    for case in cases:
        got, expected = passes.cases[case.name], alone.cases[case.name]
        assert got.status == expected.status == "ok", (case.name, got.error, expected.error)
        assert got.arrays.keys() == expected.arrays.keys() and len(got.states) == len(expected.states)
        for name in got.arrays:
            np.testing.assert_array_equal(got.arrays[name], expected.arrays[name], err_msg=f"{case.name}: {name}")
        for got_state, expected_state in zip(got.states, expected.states):
            for got_array, expected_array in zip(got_state, expected_state):
                np.testing.assert_array_equal(got_array, expected_array, err_msg=f"{case.name}: a relayed state")


def test_a_supervisor_killed_in_a_pass_names_the_case_it_was_running(assignment, sandbox: Sandbox, tmp_path):
    """step kills the supervisor on the first half of the 16-wide runs (shape s2), in the
    sandbox: each death is charged to the case the supervisor said it was running, never to an
    earlier case whose second half was still to come, and after two the group is given up."""
    source = _module(assignment, "if x_t.shape[-1] == 16 and state is None:\n"
                                 "    import os, signal\n"
                                 "    os.kill(os.getppid(), signal.SIGKILL)")
    cases = _steps_batch()
    probe = run_probe(source, cases, sandbox, tmp_path, CASE_CPU_SECONDS, PROBE_DRIVER)
    said = {name: (out.status, out.error or "") for name, out in probe.cases.items()}
    died = {name for name, (_, error) in said.items() if f"probe case {name}" in error}
    assert died == {"steps_s2_none_float64", "steps_s2_mild_float64"}, said
    assert all(said[c.name] == ("ok", "") for c in cases if c.name.startswith("steps_s0_")), said
    given_up = {c.name for c in cases} - died - {c.name for c in cases if c.name.startswith("steps_s0_")}
    assert all(said[name][1] == "not run: 2 earlier steps cases crashed the probe" for name in given_up), said


def _runs(cases: list[ProbeCase]) -> list[str]:
    """The batch key of each run of consecutive cases with one (a run is one worker)."""
    return [c.batch for i, c in enumerate(cases) if c.batch and (i == 0 or cases[i - 1].batch != c.batch)]


def test_the_assignments_batch_only_cases_judged_on_their_own_inputs():
    """linear_attention: its forward cases other than those compared for what differs between
    their inputs (the causality pairs, the alignment pair, the per-head set) and the long
    numerics runs, in one worker, and the step runs of the same shapes and decays in passes;
    linear_attention_hyena: a worker per function under test."""
    from grader.checks.linear_attention_hyena import cases as hyena
    la_cases = la.probe_cases()
    apart = ("causal_", "align_", "heads_", "numerics_", "resume_")
    assert {c.name for c in la_cases if c.batch} == {c.name for c in la_cases if c.kind in ("forward", "steps")
                                                     and not c.name.startswith(apart)}
    # the forward batch, then the step runs in passes, then their float32 twins (run when needed)
    assert _runs(la_cases) == [la.FORWARD_BATCH, la.STEPS_BATCH, la.STEPS_BATCH]
    hyena_cases = hyena.probe_cases()
    assert all(c.batch == c.group for c in hyena_cases)
    assert sorted(_runs(hyena_cases)) == sorted({c.group for c in hyena_cases})
