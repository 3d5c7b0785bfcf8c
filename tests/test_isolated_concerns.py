"""Issue 41: one bug, one concern. Each layer item is judged where its concern can be observed
on its own (tests/scaffolds/, graded in process once for both files: conftest's ``scaffold_corpus``):

- alignment by two runs that differ only in token t's key and value (output t must change);
- the state contract by the tensors handed to step, before and after, with no condition on
  what step computes;
- per-head decay by heads with one set of weights that differ only in gamma;
- the recurrent decay, for a step that matches no known computation, from a state the grader
  built (one step from it minus one from the zero state is gamma_h times it);
- forward's normalization and decay, for a forward that matches no known computation, at the
  last position, whose future is empty; hybrid_lm by the layer inside the model.

So a step whose state is wrong, or a forward that leaks later tokens, loses its own items only.
"""
from __future__ import annotations

import pytest

from grader.checks import linear_attention as checks


LAYER = checks.LAYER_ITEMS
# A mutant -> exactly the layer items it fails (none may be an error: every concern is observed).
LOST = {
    "mutant_step_s_decayed_twice": {"decay_recurrent", "equivalence"},
    "mutant_step_z_accumulates_q": {"equivalence"},
    "mutant_step_z_accumulates_phi_v": {"equivalence"},
    "mutant_forward_sees_next_token": {"causality", "equivalence"},
    "mutant_forward_future_unit_weight": {"causality", "equivalence"},
    "mutant_forward_tril_offset_two": {"causality", "equivalence"},
    # Exact in float64, not finite in float32 at the notebook's own sizes: the decay's numerics.
    "mutant_forward_rescaled_powers": {"decay_parallel"},
    "mutant_forward_exp_unclamped_lag": {"decay_parallel"},
    "mutant_forward_cumprod_ratio": {"decay_parallel"},
    # Known mistakes keep their own items under the new judgements.
    "mutant_output_before_update": {"alignment", "equivalence"},
    "mutant_diagonal_masked_out": {"alignment", "equivalence"},
    "mutant_heads_swapped_in_step": {"decay_per_head", "equivalence"},
}
CORRECT = ("correct_einsum", "correct_state_transposed", "correct_forward_via_step", "correct_chunked",
           "correct_float32_only")


@pytest.fixture(scope="module")
def graded(scaffold_corpus) -> dict:
    """The corpus's verdicts (tests/test_hidden_checks.py grades every scaffold once)."""
    return {name: scaffold_corpus[name][0] for name in (*LOST, *CORRECT)}


@pytest.mark.parametrize("name", sorted(LOST))
def test_a_bug_costs_its_own_items_only(graded, name):
    verdicts = {item: graded[name][item] for item in LAYER}
    failed = {item for item, v in verdicts.items() if v.status == "failed"}
    unjudged = {item: v.message for item, v in verdicts.items() if v.status == "error"}
    assert failed == LOST[name], {item: verdicts[item].message for item in failed ^ LOST[name]}
    assert not unjudged, unjudged


@pytest.mark.parametrize("name", CORRECT)
def test_correct_code_passes_every_isolating_case(graded, name):
    lost = {item: graded[name][item].message for item in LAYER if graded[name][item].status != "passed"}
    assert not lost, lost


def test_a_wrong_state_is_judged_from_the_grader_s_state_and_names_the_factor(graded):
    message = graded["mutant_step_s_decayed_twice"]["decay_recurrent"].message
    assert "one step from a state (S, z) the grader built minus one step from the zero state" in message, message
    assert "must be gamma_h times the S handed in" in message and "Measured factor per head" in message, message
    for name in ("mutant_step_s_decayed_twice", "mutant_step_z_accumulates_q"):
        for item in ("alignment", "state_not_mutated", "decay_per_head"):
            assert graded[name][item].status == "passed", (name, item, graded[name][item].message)
            assert "Diagnosis" not in graded[name][item].message, (name, item, graded[name][item].message)
        assert "the state step builds, for heads that differ only in gamma, uses each head's own" in \
            graded[name]["decay_per_head"].message, graded[name]["decay_per_head"].message


def test_a_leaking_forward_is_judged_at_the_last_position(graded):
    verdicts = graded["mutant_forward_sees_next_token"]
    for item in ("normalization", "decay_parallel"):
        assert verdicts[item].status == "passed" and "(at the last position)" in verdicts[item].message, \
            verdicts[item].message
    assert verdicts["hybrid_lm"].status == "passed", verdicts["hybrid_lm"].message
    assert "the mask must be 0 where i > t" in verdicts["causality"].message


def test_a_missing_diagonal_is_said_by_what_changed(graded):
    """alignment says which token's key and value were changed, at which position, and by how much."""
    message = graded["mutant_output_before_update"]["alignment"].message
    assert "changing only the key and value of token 4 (its query and every other token kept)" in message, message
    assert "step's output at position 4 by at most 0 (batch 0)" in message, message
    assert "Diagnosis: step reads the state before the current token is added" in message, message


def test_numerics_at_the_notebook_s_sizes_are_named_on_the_decay_item(graded):
    """A forward exact in float64 that leaves float32's range at 512 tokens and gamma 0.5 (the
    notebook's Exercise 4) loses decay_parallel with where and why, and nothing else."""
    for name in ("mutant_forward_rescaled_powers", "mutant_forward_exp_unclamped_lag", "mutant_forward_cumprod_ratio"):
        message = graded[name]["decay_parallel"].message
        assert "forward in float32 at the notebook's own sizes (T = 512, gamma down to 0.5)" in message, message
        assert "the output is not finite from position" in message and "while the same code in float64 is" in message
        assert "Diagnosis: powers of gamma leave float32's range" in message, message
    message = graded["correct_einsum"]["decay_parallel"].message
    assert "finite and within" in message and "of its float64 run" in message, message
