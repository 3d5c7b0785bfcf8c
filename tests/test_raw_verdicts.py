"""Verdicts rest on raw outputs: what a worker reports about itself can fail an item, never pass it.

The master's own scaffolds run through the probe harness's case code in this process
(``probe_in_process``); their outputs are then edited as student code rewriting its worker's
message could send them (the report in ``info`` forged, the arrays left as the code made them),
and graded by the real checks. See the rule in ``grader.checks``'s docstring.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import pytest

from grader import cells
from grader.assignment import Assignment
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention as la_checks
from grader.checks import linear_attention_hyena as hyena_checks
from grader.checks.linear_attention import cases as la_cases
from grader.checks.linear_attention import hybrid
from grader.checks.linear_attention.hybrid import trusted_run
from grader.checks.linear_attention.model import REFERENCE, Variant
from grader.checks.linear_attention_hyena import cases as hyena_cases
from grader.checks.linear_attention_hyena.items import dtype_problem
from grader.graft import submission_module_source
from grader.probe import ProbeResult

from probe_in_process import probe_in_process

LA, HYENA = Assignment("linear_attention"), Assignment("linear_attention_hyena")
DECAY_LINE = "gamma = self.decay.to(x.dtype)"          # in the master's forward
HYBRID = "hybrid_float64"
# What the probe driver once reported and hybrid_lm once believed: every gradient there and finite.
FORGED_REPORT = {"linear_forward_calls": la_cases.HYBRID["layer_pattern"].count("linear"),
                 "missing_grads": [], "grads_finite": True}


def master_scaffolds(assignment: Assignment) -> dict[str, str]:
    return {c.get("id"): cells.source(c) for c in assignment.master.cells if cells.SCAFFOLD in cells.tags(c)}


def la_probe(detach_decay: bool) -> ProbeResult:
    """The master's LinearAttention through the probe; ``detach_decay``: its forward reads the
    decay through ``.detach()``, so the same numbers, but no gradient reaches gamma_logit."""
    scaffolds = master_scaffolds(LA)
    if detach_decay:
        cell = cells.scaffolds(LA.master)[0].cell_id   # the layer's
        assert scaffolds[cell].count(DECAY_LINE) == 1, "the master's forward no longer reads the decay this way"
        scaffolds[cell] = scaffolds[cell].replace(DECAY_LINE, "gamma = self.decay.detach().to(x.dtype)")
    module, _ = submission_module_source(LA.master, scaffolds)
    return probe_in_process(module, la_checks.probe_cases(LA.rubric), la_checks.PROBE_DRIVER)


def grade(assignment: Assignment, checks, probe: ProbeResult) -> dict[str, Verdict]:
    return checks.evaluate(CheckContext(assignment.rubric, assignment.master_path, probe, None, None,
                                        "not executed in this test"))


def edited(probe: ProbeResult, case: str, info: dict | None = None, **arrays: np.ndarray | None) -> ProbeResult:
    """A copy of ``probe`` whose output of ``case`` has its info updated and its arrays
    replaced (None: removed)."""
    probe = copy.deepcopy(probe)
    out = probe.cases[case]
    out.info.update(info or {})
    for name, value in arrays.items():
        if value is None:
            out.arrays.pop(name, None)
        else:
            out.arrays[name] = value
    return probe


def gradient_index(parameter: str) -> int:
    names = [g.name for g in trusted_run(LA.master_path, la_cases.HYBRID, np.zeros((1, 2)), REFERENCE, "add").gradients]
    return names.index(parameter)


@pytest.fixture(scope="module")
def honest() -> ProbeResult:
    return la_probe(detach_decay=False)


@pytest.fixture(scope="module")
def detached() -> ProbeResult:
    return la_probe(detach_decay=True)


# ----------------------------------------------------------------------------- hybrid_lm

def test_the_honest_reference_passes_hybrid_lm_on_its_exported_arrays(honest):
    out = honest.cases[HYBRID]
    assert {"logits", "loss"} <= set(out.arrays) and set(out.info) == {"linear_forward_calls"}
    verdicts = grade(LA, la_checks, honest)
    assert {n: v.status for n, v in verdicts.items() if n in la_checks.SCAFFOLD_ITEMS} == {
        n: "passed" for n in la_checks.SCAFFOLD_ITEMS}
    assert "every parameter's gradient match the trusted model's" in verdicts["hybrid_lm"].message


def test_a_forged_report_cannot_pass_a_detached_decay(detached):
    """Counts right, every gradient reported present and finite: the arrays still show that no
    gradient reached gamma_logit. Its forward's numbers are right, so only hybrid_lm is lost."""
    gamma = gradient_index("blocks.0.attn.gamma_logit")
    assert la_cases.gradient_output(gamma) not in detached.cases[HYBRID].arrays
    verdicts = grade(LA, la_checks, edited(detached, HYBRID, FORGED_REPORT))
    hybrid = verdicts["hybrid_lm"]
    assert hybrid.status == "failed"
    assert ("no gradient reached blocks.0.attn.gamma_logit, blocks.1.attn.gamma_logit, blocks.2.attn.gamma_logit: "
            "the loss must depend on every parameter") in hybrid.message, hybrid.message
    assert {n for n in la_checks.SCAFFOLD_ITEMS if verdicts[n].status != "passed"} == {"hybrid_lm"}


def test_forged_gradient_arrays_are_compared_with_the_trusted_backward_pass(detached):
    """Arrays can be forged too, but they are judged: zeros for the decay's gradient are not it."""
    zeros = {la_cases.gradient_output(gradient_index(f"blocks.{i}.attn.gamma_logit")): np.zeros(4) for i in range(3)}
    verdict = grade(LA, la_checks, edited(detached, HYBRID, FORGED_REPORT, **zeros))["hybrid_lm"]
    assert verdict.status == "failed"
    assert "the gradient of blocks.0.attn.gamma_logit: max-abs error" in verdict.message and "got 0" in verdict.message


def test_a_missing_gradient_array_counts_as_no_gradient(honest):
    weight = gradient_index("blocks.3.attn.q_proj.weight")
    verdict = grade(LA, la_checks, edited(honest, HYBRID, **{la_cases.gradient_output(weight): None}))["hybrid_lm"]
    assert verdict.status == "failed" and "no gradient reached blocks.3.attn.q_proj.weight:" in verdict.message


def test_a_wrong_gradient_is_named_with_where_it_differs(honest):
    index = gradient_index("token_embedding")
    name = la_cases.gradient_output(index)
    wrong = honest.cases[HYBRID].arrays[name].copy()
    wrong[5, 2] += 1e-3
    verdict = grade(LA, la_checks, edited(honest, HYBRID, **{name: wrong}))["hybrid_lm"]
    assert verdict.status == "failed"
    assert "the gradient of token_embedding: max-abs error 0.001 at (row 5, column 2)" in verdict.message


def test_the_reported_forward_calls_can_fail_the_item(honest):
    verdict = grade(LA, la_checks, edited(honest, HYBRID, {"linear_forward_calls": 2}))["hybrid_lm"]
    assert verdict.status == "failed" and "ran 2 times in a model with 3 linear layers" in verdict.message


def test_which_gradients_are_expected_is_decided_by_the_trusted_model():
    """A forward that ignores gamma (charged by decay_parallel) is judged against a trusted model
    whose layers ignore it too, so gamma_logit is not expected to get a gradient; the reference's is."""
    tokens = np.zeros((1, 4))

    def reached(variant: Variant) -> set[str]:
        return {g.name for g in trusted_run(LA.master_path, la_cases.HYBRID, tokens, variant, "add").gradients
                if g.reached}
    assert reached(REFERENCE) - reached(Variant(decay_s="none", decay_z="none")) == {
        f"blocks.{i}.attn.gamma_logit" for i in range(3)}


# ----------------------------------------------------------------------------- state_fixed_size

def test_a_reported_state_size_cannot_pass_a_state_that_grew(honest):
    """The report (shapes, sizes, no growth) is the honest one; the state exported after 1000
    steps holds the history."""
    name = "state_growth_float64"
    assert grade(LA, la_checks, honest)["state_fixed_size"].status == "passed"
    grown = np.zeros((2, 1000, 16))
    probe = edited(honest, name, **{la_cases.checkpoint_output(1000, 0): grown})
    verdict = grade(LA, la_checks, probe)["state_fixed_size"]
    assert verdict.status == "failed"
    assert "after 1000 steps the state step returned is arrays shaped [[2, 1000, 16], [2, 4, 4]]" in verdict.message


# ----------------------------------------------------------------------------- the hyena checks

@pytest.fixture(scope="module")
def hyena_probe() -> ProbeResult:
    module, _ = submission_module_source(HYENA.master, master_scaffolds(HYENA))
    cases = [c for c in hyena_checks.probe_cases(HYENA.rubric) if c.name.startswith(("la/", "precision/", "retnet/",
                                                                                       "recall/"))]
    return probe_in_process(module, cases, hyena_checks.PROBE_DRIVER)


def test_a_float32_array_reported_as_float64_does_not_pass(hyena_probe):
    """gamma = 0.5: every entry of the mask is a power of two, exact in float32, so only the
    received array's dtype can tell."""
    name = "retnet/L8/gamma0.5"
    assert grade(HYENA, hyena_checks, hyena_probe)["retnet_mask"].status == "passed"
    out = hyena_probe.cases[name]
    assert out.info["y"]["dtype"] == "float64"
    verdict = grade(HYENA, hyena_checks, edited(hyena_probe, name, y=out.arrays["y"].astype(np.float32)))["retnet_mask"]
    assert verdict.status == "failed" and "returned float32, expected float64" in verdict.message


def test_a_float64_array_reported_as_float32_does_not_pass(hyena_probe):
    """With float32 inputs the forms must compute in float32: a float64 result with a report
    that says float32 loses la_precision."""
    name = hyena_cases.precision_name(hyena_cases.LA_FORMS[1], "float32", hyena_cases.PRECISION_SEEDS[0])
    assert grade(HYENA, hyena_checks, hyena_probe)["la_precision"].status == "passed"
    out = hyena_probe.cases[name]
    assert out.info["y"]["dtype"] == "float32"
    verdict = grade(HYENA, hyena_checks, edited(hyena_probe, name, y=out.arrays["y"].astype(np.float64)))["la_precision"]
    assert verdict.status == "failed" and "returned float64, expected float32" in verdict.message


def test_a_scalar_reported_with_the_right_shape_is_measured_on_its_array(hyena_probe):
    name = "recall/s0/K4"
    assert grade(HYENA, hyena_checks, hyena_probe)["recall_error"].status == "passed"
    value = float(hyena_probe.cases[name].arrays["y"])
    probe = edited(hyena_probe, name, {"y": {"type": "Tensor", "dtype": "float64", "shape": []}},
                   y=np.array([value, value]))
    verdict = grade(HYENA, hyena_checks, probe)["recall_error"]
    assert verdict.status == "failed" and "returned a tensor of shape (2,), not a scalar" in verdict.message


def test_a_report_can_only_add_a_reason_to_fail():
    """The harness sends a float16 tensor as a float64 array: only the report says so."""
    got = np.zeros(3)
    assert dtype_problem("f", got, {"type": "Tensor", "dtype": "float64"}, "float64") is None
    assert dtype_problem("f", got, {"type": "float"}, "float64") is None   # a Python number: no dtype reported
    assert dtype_problem("f", got, {"type": "Tensor", "dtype": "float16"}, "float64") == (
        "f returned float16, expected float64 (compute in the inputs' dtype)")
    assert "returned float32" in dtype_problem("f", got.astype(np.float32), {"dtype": "float64"}, "float64")


def test_the_trusted_model_does_not_follow_the_grader_processs_default_dtype():
    """The trusted model is initialised as a fresh probe worker initialises the student's, in
    float32, even after code run in the grader's process set another default dtype (an
    assignment's checks run in process can: a float64 default once failed hybrid_lm for the
    reference in every later test of the session)."""
    tokens = np.arange(6).reshape(1, 6) % la_cases.HYBRID["vocab_size"]
    before = trusted_run(LA.master_path, la_cases.HYBRID, tokens, REFERENCE, "add").logits
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        hybrid._trusted_run.cache_clear()   # computed again, under the float64 default
        after = trusted_run(LA.master_path, la_cases.HYBRID, tokens, REFERENCE, "add").logits
        assert torch.get_default_dtype() == torch.float64   # the check restores what it found
    finally:
        torch.set_default_dtype(previous)
    np.testing.assert_array_equal(after, before)
