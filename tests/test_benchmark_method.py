"""Exercise 1's method judged from what the probe saw the sweep time (grader/checks/linear_attention/benchmark.py).

The corpus of tests/sweeps/ (see its README) runs through the probe harness's own case code in
this process with the master's LinearAttention: every ``correct_*`` sweep earns both method
items, every ``mistake_*`` sweep loses exactly the items listed here, with a message that says
what its timed calls ran. The verdicts are decided from what ran, never from the times, which
the last tests change on recorded observations.
"""
from __future__ import annotations

import copy

import pytest

from grader import cells
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention as checks
from grader.checks.linear_attention.benchmark import BENCHMARK_CASE, METHOD_ITEMS
from grader.probe import ProbeResult

from conftest import SWEEPS
from probe_in_process import exercise_probe

FULL, LINEAR = METHOD_ITEMS
TEACHER_FORCING = "teacher forcing"
# A mistake -> the items it loses, each with words its message must hold.
MISTAKES = {
    "mistake_teacher_forced": {FULL: TEACHER_FORCING, LINEAR: TEACHER_FORCING},
    "mistake_prefix_inside_timing": {FULL: "a prefix run inside the timed call?); building the KV cache"},
    # 3 warmup calls, then the notebook's 15 timed calls, each appending one token to 24
    "mistake_cache_not_rewound": {FULL: "saw caches of 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41 "
                                        "tokens: each call appends, so rewind"},
    "mistake_no_spare_capacity": {FULL: "a full cache (24 of 24 slots), so append reallocated it"},
    "mistake_state_rebuilt_each_call": {LINEAR: "one step from None: the state is built inside the timed call"},
    "mistake_notebook_lengths": {FULL: "a cache of 64 tokens, which is none of the history lengths the sweep was given",
                                 # the sweep at the notebook's five lengths times three
                                 LINEAR: "3 measurements of the linear step for 5 history lengths"},
    "mistake_times_in_seconds": {FULL: "the timer measured", LINEAR: "the timer measured"},
    "mistake_own_layers_one_timing": {FULL: "a MultiHeadAttention of its own", LINEAR: "MultiHeadAttention calls too"},
}
CORRECT = sorted(p.stem for p in SWEEPS.glob("correct_*.py"))


def sweep_probe(assignment, sweep: str | None) -> ProbeResult:
    """The benchmark case alone, with ``sweep`` as Exercise 1's cell (None: no such cell)."""
    return exercise_probe(assignment, "decode_step_sweep", sweep, (BENCHMARK_CASE,))


def method_verdicts(assignment, probe: ProbeResult) -> dict[str, Verdict]:
    verdicts = checks.evaluate(CheckContext(assignment.rubric, assignment.master_path, probe, None, None,
                                            "not executed in this test"))
    return {item: verdicts[item] for item in METHOD_ITEMS}


@pytest.fixture(scope="module")
def observed(assignment) -> dict[str, ProbeResult]:
    return {path.stem: sweep_probe(assignment, path.read_text()) for path in sorted(SWEEPS.glob("*.py"))}


def test_the_corpus_is_measured_both_ways(assignment, observed):
    assert set(observed) == set(CORRECT) | set(MISTAKES), "every sweep file has its entry"
    assert len(CORRECT) >= 3 and len(MISTAKES) >= 3
    passed = {name for name in CORRECT
              if {v.status for v in method_verdicts(assignment, observed[name]).values()} == {"passed"}}
    caught = {name for name, lost in MISTAKES.items()
              if {i for i, v in method_verdicts(assignment, observed[name]).items() if v.status != "passed"} == set(lost)}
    print(f"\ncorrect sweeps earning both method items: {len(passed)} of {len(CORRECT)}; "
          f"mistaken sweeps losing exactly their items: {len(caught)} of {len(MISTAKES)}")
    assert passed == set(CORRECT) and caught == set(MISTAKES)


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_sweep_earns_both_items(assignment, observed, name):
    verdicts = method_verdicts(assignment, observed[name])
    assert {i: v.status for i, v in verdicts.items()} == dict.fromkeys(METHOD_ITEMS, "passed"), verdicts
    assert "at every history length given (24, 96, 384, and the notebook's 64, 128, 256, 512, 1024)" in \
        verdicts[FULL].message
    assert " ms" not in verdicts[FULL].message + verdicts[LINEAR].message   # the same words in every run


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistaken_sweep_loses_its_items_with_what_its_timed_calls_ran(assignment, observed, name):
    verdicts = method_verdicts(assignment, observed[name])
    lost = {i: v for i, v in verdicts.items() if v.status != "passed"}
    assert set(lost) == set(MISTAKES[name]), {i: v.message for i, v in verdicts.items()}
    for item, words in MISTAKES[name].items():
        assert lost[item].status == "failed" and words in lost[item].message, lost[item].message


def test_a_sweep_that_is_missing_or_raises_fails_with_the_reason(assignment):
    missing = method_verdicts(assignment, sweep_probe(assignment, None))
    assert {v.status for v in missing.values()} == {"failed"}
    assert all("decode_step_sweep is not defined" in v.message for v in missing.values())
    todo = next(cells.source(c) for c in assignment.template.cells if c.id == "ex1-benchmark")
    raised = method_verdicts(assignment, sweep_probe(assignment, todo))
    assert {v.status for v in raised.values()} == {"failed"}
    assert all("decode_step_sweep raised NotImplementedError: TODO: time one cached full-attention step" in v.message
               for v in raised.values()), raised


def _retimed(probe: ProbeResult, factor: float) -> ProbeResult:
    """The observation with every time measured and returned multiplied by ``factor``."""
    probe = copy.deepcopy(probe)
    info = probe.cases[BENCHMARK_CASE].info
    for measurement in info["measurements"]:
        measurement["median_ms"] *= factor
    for key in ("full_ms_per_step", "linear_ms_per_step"):
        info["returned"][key] = [t * factor for t in info["returned"][key]]
    return probe


def _reversed_paths(probe: ProbeResult) -> ProbeResult:
    """The observation with the full path's times made to fall with T and sit below the linear path's."""
    probe = copy.deepcopy(probe)
    info = probe.cases[BENCHMARK_CASE].info
    for measurement in info["measurements"]:
        full = "decode_step" in measurement["timed_calls"][0]["counts"]
        length = measurement["timed_calls"][0].get("decode_step", {}).get("length", 1)
        measurement["median_ms"] = 1.0 / length if full else 50.0
    returned = info["returned"]
    returned["full_ms_per_step"] = [1.0 / t for t in (24, 96, 384)]
    returned["linear_ms_per_step"] = [50.0] * 3
    return probe


@pytest.mark.parametrize("name", ["correct_prefill_by_decoding", "mistake_cache_not_rewound",
                                  "mistake_state_rebuilt_each_call"])
def test_verdicts_never_depend_on_the_sizes_of_the_times(assignment, observed, name):
    """Times a loaded machine could give (far slower, far faster, a full step that falls with
    T and beats the linear one) change no verdict: what ran in each timed call decides."""
    statuses = {i: v.status for i, v in method_verdicts(assignment, observed[name]).items()}
    for changed in (_retimed(observed[name], 1000.0), _retimed(observed[name], 1e-3), _reversed_paths(observed[name])):
        assert {i: v.status for i, v in method_verdicts(assignment, changed).items()} == statuses
