"""Probe cases that share a worker (``ProbeCase.batch``), through the real harness and sandbox:
one worker per run of consecutive cases with the same key, one case at a time, each with its
own CPU limit, its own import of the module and the global state the worker was forked with;
a case that hangs ends its worker and the batch goes on in a new one."""
from __future__ import annotations

import numpy as np
import pytest

from grader.probe import ProbeCase, Segments, run_probe
from grader.sandbox import Sandbox

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


def test_a_segmented_case_never_shares_a_worker():
    with pytest.raises(ValueError, match="a segmented case never shares a worker"):
        ProbeCase("steps", "steps", {}, {"x": np.zeros((1, 4, 2))}, ("y",), Segments("x", ((0, 2), (2, 4))),
                  batch="a")


def _runs(cases: list[ProbeCase]) -> list[str]:
    """The batch key of each run of consecutive cases with one (a run is one worker)."""
    return [c.batch for i, c in enumerate(cases) if c.batch and (i == 0 or cases[i - 1].batch != c.batch)]


def test_the_assignments_batch_only_cases_judged_on_their_own_inputs():
    """linear_attention: its forward cases other than those compared for what differs between
    their inputs (the causality pairs, the alignment pair, the per-head set) and the long
    numerics runs, in one worker; linear_attention_hyena: a worker per function under test."""
    from grader.checks.linear_attention import cases as la
    from grader.checks.linear_attention_hyena import cases as hyena
    la_cases = la.probe_cases()
    apart = ("causal_", "align_", "heads_", "numerics_")
    assert {c.name for c in la_cases if c.batch} == {c.name for c in la_cases if c.kind == "forward"
                                                     and not c.name.startswith(apart)}
    assert _runs(la_cases) == [la.FORWARD_BATCH]
    hyena_cases = hyena.probe_cases()
    assert all(c.batch == c.group for c in hyena_cases)
    assert sorted(_runs(hyena_cases)) == sorted({c.group for c in hyena_cases})
