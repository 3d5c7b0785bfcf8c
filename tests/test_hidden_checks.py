"""The hidden checks on a corpus of student-style scaffolds (tests/scaffolds/, see its README).

Every ``correct_*`` scaffold must earn every scaffold item; every ``mutant_*`` must lose
points, and a mutant with a named mistake must lose exactly the items of that mistake's
concern (plus ``equivalence`` where its two forms disagree), with a message that names it.
Every mutant has an entry in ``MISTAKES``, and any item it loses outside its mistake's
concerns must be listed there with the reason (error carried forward, as a property).

The corpus runs through the probe harness's own case code in this process
(``probe_in_process``) and the real checks, a second or two per scaffold. A few scaffolds go
through the real sandboxed probe as well, and must be graded exactly as in process.
"""
from __future__ import annotations

import math
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import nbformat
import pytest

from grader.assignment import Assignment
from grader.checks import CheckContext, Verdict, decide
from grader.checks import linear_attention as checks
from grader.checks.compare import Mismatch, scaled
from grader.checks.linear_attention import cases as inputs
from grader.checks.linear_attention import items, model
from grader.checks.linear_attention.answers import (BENCHMARK_ITEMS, GROWS_WITH_T, MEMORY_BILL_MISTAKES,
                                                    answer_checks, memory_bill_expected)
from grader.execute import CellRun, ExecutionResult
from grader.graft import submission_module_source
from grader.probe import ProbeResult, run_probe

from conftest import SCAFFOLDS, as_scaffolds, scaffold_cell
from probe_in_process import probe_in_process

CORRECT = sorted(p.stem for p in SCAFFOLDS.glob("correct_*.py"))
MUTANTS = sorted(p.stem for p in SCAFFOLDS.glob("mutant_*.py"))
CHEATS = ("cheat_tampers_with_parameters",)

MUTATED = "step writes in place into the state it is given"
# A named mistake -> (exactly the items it loses, the item whose message names it, words naming it).
NAMED = {
    "mutant_normalizer_dropped": ({"normalization"}, "normalization", "the normalizer is missing"),
    "mutant_output_before_update": ({"alignment", "equivalence"}, "alignment", "before the current token is added"),
    "mutant_diagonal_masked_out": ({"alignment", "equivalence"}, "alignment", "forward's mask hides the diagonal"),
    "mutant_decay_only_in_step": ({"decay_parallel", "equivalence"}, "decay_parallel", "forward ignores gamma"),
    "mutant_decay_only_in_forward": ({"decay_recurrent", "equivalence"}, "decay_recurrent", "step ignores gamma"),
    "mutant_decay_s_not_z": ({"decay_recurrent", "equivalence"}, "decay_recurrent", "decay the normalizer z too"),
    "mutant_decay_z_not_s": ({"decay_recurrent", "equivalence"}, "decay_recurrent", "decay the state S too"),
    "mutant_decay_squared": ({"decay_parallel", "decay_recurrent"}, "decay_parallel", "applies gamma twice"),
    "mutant_one_minus_decay": ({"decay_parallel", "decay_recurrent"}, "decay_recurrent", "uses 1 - gamma"),
    "mutant_future_mask": ({"causality", "equivalence"}, "causality", "must be 0 where i > t"),
    "mutant_heads_mixed": ({"decay_per_head"}, "decay_per_head", "heads are mixed up"),
    "mutant_heads_swapped_in_step": ({"decay_per_head", "equivalence"}, "decay_per_head", "heads are mixed up"),
    "mutant_phi_on_q_only": ({"normalization"}, "normalization", "to q but not to k"),
    "mutant_phi_on_v": ({"normalization"}, "normalization", "to v as well"),
    "mutant_readout_transposed": ({"equivalence"}, "equivalence", "reads the state out transposed"),
    # A denominator over the whole row really does let the future in.
    "mutant_denominator_unmasked_row": ({"normalization", "causality", "equivalence"}, "normalization",
                                        "the whole row"),
    "mutant_step_caches_history": ({"state_fixed_size", "state_resume", "equivalence"}, "state_resume",
                                   "not from history kept elsewhere"),
    # Its history is gone in the next worker, where step crashes.
    "mutant_history_in_class_attribute": ({"state_fixed_size", "state_resume", "equivalence"}, "state_resume",
                                          "has no attribute"),
    "mutant_feature_map_not_positive": ({"normalization"}, "normalization", "feature map is not positive"),
    # Reshaping (B, H, T, d_h) as is puts later positions into earlier rows: the future really leaks.
    "mutant_heads_merged_without_transpose": ({"equivalence", "causality"}, "equivalence",
                                              "merges the heads without the transpose"),
    # Its decay above 1 overflows at gamma_logit = 50 after ~180 tokens: those positions are not compared.
    "mutant_raw_logit_decay": ({"decay_parallel", "decay_recurrent"}, "decay_parallel",
                               "uses the raw gamma_logit as the decay"),
    "mutant_step_returns_given_state": ({"decay_recurrent", "equivalence"}, "decay_recurrent",
                                        "returns the state it was given"),
    # Column sums take in later queries: the future really leaks, as with a whole-row denominator.
    "mutant_normalizer_wrong_axis": ({"normalization", "causality", "equivalence"}, "normalization",
                                     "sums the weights over the wrong axis"),
    # Outputs are the recurrence's (gamma cancels) and resuming works: only the state's decay is wrong.
    "mutant_state_decayed_twice": ({"decay_recurrent"}, "decay_recurrent", "decays the state once more"),
    # Writing into the caller's state: every output and relayed state is right, only kept states change.
    "mutant_inplace_step": ({"state_not_mutated"}, "state_not_mutated", MUTATED),
    "mutant_inplace_returns_clone": ({"state_not_mutated"}, "state_not_mutated", MUTATED),
    "mutant_inplace_z_only": ({"state_not_mutated"}, "state_not_mutated", MUTATED),
    "mutant_state_buffer_on_self": ({"state_not_mutated"}, "state_not_mutated", MUTATED),
    # Decay bugs found by what they compute (named, or a factor measured per logit): the decay items only.
    "mutant_decay_exp_neg_logit": ({"decay_parallel", "decay_recurrent"}, "decay_parallel",
                                   "uses exp(-gamma_logit) as the decay"),
    "mutant_decay_heads_averaged": ({"decay_per_head"}, "decay_per_head", "the mean of the heads' decays"),
    "mutant_decay_clamped": ({"decay_parallel", "decay_recurrent"}, "decay_parallel",
                             "0.99 for gamma_logit = 50 (sigmoid gives 1)"),
    # Sequences of a batch that mix see what they must not: causality charges it in forward.
    "mutant_batch_keys_summed": ({"causality", "equivalence"}, "causality", "the keys of every sequence in the batch"),
    "mutant_batch_state_shared": ({"equivalence"}, "equivalence", "step mixes the sequences of a batch"),
    # Issue 41: a step whose state is wrong keeps alignment, state_not_mutated and decay_per_head (each
    # observed on its own); its decay is judged from a state the grader built, where what step adds cancels.
    "mutant_step_s_decayed_twice": ({"decay_recurrent", "equivalence"}, "decay_recurrent",
                                    "must be gamma_h times the S handed in"),
    "mutant_step_z_accumulates_q": ({"equivalence"}, "equivalence", "forward matches the reference and step does not"),
    "mutant_step_z_accumulates_phi_v": ({"equivalence"}, "equivalence",
                                        "forward matches the reference and step does not"),
    # Issue 41: a forward that leaks later tokens loses causality (and equivalence) only: normalization and the
    # decay items are judged at the last position, alignment and per-head decay by properties, hybrid_lm by
    # the layer inside the model.
    "mutant_forward_sees_next_token": ({"causality", "equivalence"}, "causality", "the mask must be 0 where i > t"),
    "mutant_forward_future_unit_weight": ({"causality", "equivalence"}, "causality", "the mask must be 0 where i > t"),
    "mutant_forward_tril_offset_two": ({"causality", "equivalence"}, "causality", "the mask must be 0 where i > t"),
    # Issue 41: exact in float64, not finite in float32 at the notebook's own sizes (512 tokens, gamma 0.5):
    # decay_parallel owns the decay's numerics.
    "mutant_forward_rescaled_powers": ({"decay_parallel"}, "decay_parallel", "powers of gamma leave float32's range"),
    "mutant_forward_exp_unclamped_lag": ({"decay_parallel"}, "decay_parallel", "powers of gamma leave float32's range"),
    "mutant_forward_cumprod_ratio": ({"decay_parallel"}, "decay_parallel", "powers of gamma leave float32's range"),
}
# Further items whose message must carry the named mistake's diagnosis: (item, words).
ALSO_DIAGNOSED = {
    "mutant_heads_merged_without_transpose": [("causality", "merges the heads without the transpose")],
    "mutant_normalizer_wrong_axis": [("causality", "sums the weights over the wrong axis"),
                                     ("equivalence", "sums the weights over the wrong axis")],
    "mutant_raw_logit_decay": [("decay_recurrent", "uses the raw gamma_logit as the decay")],
    "mutant_step_returns_given_state": [("equivalence", "returns the state it was given")],
}
# A form that raises everywhere: (the form, exactly the items that need it).
RAISING = {
    "mutant_step_not_implemented": ("step", {"equivalence", "alignment", "decay_recurrent", "decay_per_head",
                                             "state_fixed_size", "state_resume", "state_not_mutated"}),
    "mutant_forward_not_implemented": ("forward", {"equivalence", "normalization", "alignment", "causality",
                                                   "decay_parallel", "decay_per_head", "hybrid_lm"}),
}




@dataclass(frozen=True)
class Mistake:
    """A mutant's mistake: the rubric concerns (the items' tags) it belongs to and the forms
    that make it; ``because``: each item of another concern it costs, and why."""

    concerns: tuple[str, ...]
    forms: tuple[str, ...]
    because: dict[str, str] = field(default_factory=dict)


BOTH, FORWARD, STEP = ("forward", "step"), ("forward",), ("step",)
LEAKS = "the mistake really lets later tokens reach earlier outputs"


def _unusable(why: str, *items: str) -> dict[str, str]:
    return dict.fromkeys(items, f"{why}: no item that reads them can pass")


def _raising(name: str) -> Mistake:
    form, needing = RAISING[name]
    return Mistake((), (form,), {**dict.fromkeys(needing - {"equivalence"}, f"{form} raised on every input: every item "
                                                                             "that needs it is 0, said once plainly"),
                                 **(STEP_STOPS if form == "step" else FORWARD_STOPS)})


# Exercises 1 and 4 (the master's cells, in this corpus) run the layer's step, and Exercise 3's
# training its forward: a step or a forward that raises stops them.
STOPPED = ("the exercise's function stops where the layer raises: its method is not judged (error, with the reason), "
           "never charged as a failure")
STEP_STOPS = dict.fromkeys(("benchmark_full_step", "benchmark_linear_step", "decay_state_norms"), STOPPED)
FORWARD_STOPS = dict.fromkeys(("recall_batches", "recall_query_loss"), STOPPED)


# Error carried forward, as a property of the corpus: every mutant has an entry here, and every
# item it loses carries one of its mistake's concerns, is equivalence for a mistake in one form
# (its forms then disagree), or is listed with the reason it is lost too.
MISTAKES = {
    "mutant_batch_keys_summed": Mistake(("causality",), FORWARD),
    "mutant_batch_state_shared": Mistake(("causality",), STEP),
    "mutant_decay_clamped": Mistake(("decay",), BOTH),
    "mutant_decay_exp_neg_logit": Mistake(("decay",), BOTH),
    "mutant_decay_heads_averaged": Mistake(("decay",), BOTH),
    "mutant_decay_only_in_forward": Mistake(("decay",), STEP),
    "mutant_decay_only_in_step": Mistake(("decay",), FORWARD),
    "mutant_decay_s_not_z": Mistake(("decay",), STEP),
    "mutant_decay_squared": Mistake(("decay",), BOTH),
    "mutant_decay_z_not_s": Mistake(("decay",), STEP),
    "mutant_denominator_unmasked_row": Mistake(("normalization",), FORWARD, {"causality": LEAKS}),
    "mutant_diagonal_masked_out": Mistake(("alignment",), FORWARD),
    "mutant_empty_output": Mistake((), BOTH, {**_unusable(
        "its outputs are empty", "equivalence", "normalization", "alignment", "causality", "decay_parallel", "decay_per_head",
        "hybrid_lm", "state_fixed_size", "state_resume"), **FORWARD_STOPS}),
    "mutant_feature_map_not_positive": Mistake(("normalization",), BOTH),
    "mutant_forward_cumprod_ratio": Mistake(("decay",), FORWARD),
    "mutant_forward_exp_unclamped_lag": Mistake(("decay",), FORWARD),
    "mutant_forward_future_unit_weight": Mistake(("causality",), FORWARD),
    "mutant_forward_rescaled_powers": Mistake(("decay",), FORWARD),
    "mutant_forward_sees_next_token": Mistake(("causality",), FORWARD),
    "mutant_forward_tril_offset_two": Mistake(("causality",), FORWARD),
    "mutant_forward_not_implemented": _raising("mutant_forward_not_implemented"),
    "mutant_future_mask": Mistake(("causality",), FORWARD),
    "mutant_heads_merged_without_transpose": Mistake(("equivalence",), FORWARD, {"causality": LEAKS}),
    "mutant_heads_mixed": Mistake(("decay",), BOTH),
    "mutant_heads_swapped_in_step": Mistake(("decay",), STEP),
    # Its step crashes given a state it did not make (Exercise 1 warms one up with init_state);
    # from None, as Exercise 4 starts, it runs.
    "mutant_history_in_class_attribute": Mistake(("state",), STEP, {item: STEP_STOPS[item] for item in (
        "benchmark_full_step", "benchmark_linear_step")}),
    "mutant_inplace_returns_clone": Mistake(("state",), STEP),
    "mutant_inplace_step": Mistake(("state",), STEP),
    "mutant_inplace_z_only": Mistake(("state",), STEP),
    "mutant_nan_output": Mistake(("normalization",), STEP, _unusable(
        "step's outputs are not finite (NaN never equals NaN)", "alignment", "state_fixed_size", "state_resume")),
    "mutant_normalizer_dropped": Mistake(("normalization",), BOTH),
    "mutant_normalizer_wrong_axis": Mistake(("normalization",), FORWARD, {"causality": LEAKS}),
    "mutant_one_minus_decay": Mistake(("decay",), BOTH),
    "mutant_output_before_update": Mistake(("alignment",), STEP),
    "mutant_phi_on_q_only": Mistake(("normalization",), BOTH),
    "mutant_phi_on_v": Mistake(("normalization",), BOTH),
    "mutant_raw_logit_decay": Mistake(("decay",), BOTH),
    "mutant_readout_transposed": Mistake(("equivalence",), STEP),
    # Softmax attention is no computation the checks know: hybrid_lm judges the layer inside the model (it runs
    # forward and backward, every parameter gets a gradient), not its numbers, which the forward items charge.
    "mutant_softmax_in_forward": Mistake(("normalization", "decay"), FORWARD),
    "mutant_state_buffer_on_self": Mistake(("state",), STEP),
    "mutant_state_decayed_twice": Mistake(("decay",), STEP),
    "mutant_step_caches_history": Mistake(("state",), STEP),
    "mutant_step_not_implemented": _raising("mutant_step_not_implemented"),
    "mutant_step_returns_given_state": Mistake(("decay",), STEP),
    "mutant_step_s_decayed_twice": Mistake(("decay",), STEP),
    # z's content is the normalizer's (no item judges step's normalizer alone: equivalence charges it).
    "mutant_step_z_accumulates_phi_v": Mistake(("normalization",), STEP),
    "mutant_step_z_accumulates_q": Mistake(("normalization",), STEP),
    "mutant_wrong_output_shape": Mistake((), FORWARD, {**_unusable(
        "its outputs are (B, H, T, d_h), not (B, T, D)", "normalization", "alignment", "causality", "decay_parallel",
        "decay_per_head", "hybrid_lm"), **FORWARD_STOPS}),
}


# The items the in-process corpus decides: all the probe's but Exercise 2's (see grade_in_process).
CORPUS_ITEMS = tuple(item for item in checks.SCAFFOLD_ITEMS if item not in checks.TRAINING_ITEMS)


def _context(assignment: Assignment, probe) -> CheckContext:
    return CheckContext(assignment.rubric, assignment.master_path, probe, None, None, "not executed in this test")


@cache
def linear_attention() -> Assignment:
    """The assignment, read once in each process that grades scaffolds (the session fixture
    ``assignment`` does not reach the pool's workers): its rubric and master are only read."""
    return Assignment("linear_attention")


def grade_in_process(name: str) -> tuple[dict[str, Verdict], dict[str, float]]:
    """One scaffold through the harness's case code (in this process) and the real checks: its
    verdicts, and how far its outputs are from the reference (``deviation``)."""
    assignment = linear_attention()
    source, _ = submission_module_source(assignment.master, as_scaffolds(assignment.master, scaffold_cell(
        assignment.master, (SCAFFOLDS / f"{name}.py").read_text())))
    # Exercise 2's case trains three models: tests/test_training_method.py runs it with mutants.
    cases = [c for c in checks.probe_cases(assignment.rubric) if c.name != "training"]
    probe = probe_in_process(source, cases, checks.PROBE_DRIVER)
    verdicts = checks.evaluate(_context(assignment, probe))
    return {item: verdicts[item] for item in CORPUS_ITEMS}, deviation(items.Evidence(_context(assignment, probe),
                                                                                              cases))


def deviation(evidence: items.Evidence) -> dict[str, float]:
    """Per dtype, the largest scaled error of the forward and step-loop outputs from the
    reference (under the closer EPS convention) over every shape and decay, as the checks
    compute it; inf where a run failed or its output has another shape or is not finite. A
    float32 step run that was not needed (its float64 run ran) is left out."""
    worst = {"float64": 0.0, "float32": 0.0}
    for name in inputs.names("forward") + inputs.names("steps"):
        for dtype, run in (("float64", name), ("float32", inputs.twin_name(name))):
            if evidence.output(run).status == "not_run":
                continue
            got = evidence.y(run)
            if isinstance(got, str):
                worst[dtype] = math.inf
                continue
            result, expected = evidence.output_mismatch(run, got, model.REFERENCE, None)
            worst[dtype] = max(worst[dtype], result.max_abs / scaled(1.0, expected) if isinstance(result, Mismatch)
                               else math.inf)
    return worst


def _one_thread() -> None:
    import torch
    torch.set_num_threads(1)


def grade_corpus() -> dict[str, tuple[dict[str, Verdict], dict[str, float]]]:
    """Every scaffold through ``grade_in_process``, two at a time: conftest's session fixture
    ``scaffold_corpus``, which tests/test_isolated_concerns.py reads too."""
    names = CORRECT + MUTANTS + list(CHEATS)
    with ProcessPoolExecutor(max_workers=2, initializer=_one_thread) as pool:
        return dict(zip(names, pool.map(grade_in_process, names)))


@pytest.fixture(scope="module")
def graded(scaffold_corpus) -> dict[str, tuple[dict[str, Verdict], dict[str, float]]]:
    return scaffold_corpus


@pytest.fixture(scope="module")
def corpus(graded) -> dict[str, dict[str, Verdict]]:
    return {name: verdicts for name, (verdicts, _) in graded.items()}


@pytest.fixture(scope="module")
def points(assignment) -> dict[str, float]:
    return {item.name: item.points for item in assignment.rubric.items if item.name in CORPUS_ITEMS}


def test_the_corpus_is_large_and_varied():
    assert len(CORRECT) >= 25 and len(MUTANTS) >= 20
    assert set(NAMED) <= set(MUTANTS)


@pytest.mark.parametrize("name", CORRECT)
def test_correct_code_earns_every_scaffold_point(corpus, name):
    lost = {item: v.message for item, v in corpus[name].items() if v.status != "passed"}
    assert not lost, f"{name} lost points: {lost}"


@pytest.mark.parametrize("name", MUTANTS)
def test_every_mutant_loses_points_and_no_check_crashes(corpus, points, name):
    verdicts = corpus[name]
    assert sum(points[i] for i, v in verdicts.items() if v.status == "passed") < sum(points.values())
    assert verdicts["scaffold_present"].status == "passed"
    crashed = {i: v.message for i, v in verdicts.items() if v.status == "error" and not v.message.startswith("not judged: ")}
    assert not crashed, crashed
    assert all(v.internal is None for v in verdicts.values())


def test_every_item_a_mutant_loses_is_its_mistakes_concern_or_said_why(assignment, corpus):
    """Error carried forward as a property of the whole corpus (see MISTAKES), with the figures."""
    tags = {item.name: set(item.tags) for item in assignment.rubric.items}
    assert set(MISTAKES) == set(MUTANTS), f"corpus entries missing or stale: {set(MISTAKES) ^ set(MUTANTS)}"
    own = carried = 0
    unexplained, stale = {}, {}
    for name, mistake in MISTAKES.items():
        lost = {item for item, verdict in corpus[name].items() if verdict.status != "passed"}
        for item in sorted(lost):
            if tags[item] & set(mistake.concerns) or (item == "equivalence" and len(mistake.forms) == 1):
                own += 1
            elif item in mistake.because:
                carried += 1
            else:
                unexplained.setdefault(name, {})[item] = corpus[name][item].message
        if set(mistake.because) - lost:
            stale[name] = sorted(set(mistake.because) - lost)
    print(f"\n{len(MISTAKES)} mutants lose {own + carried} items: {own} of their mistake's concern, {carried} of another "
          f"with the reason listed, {sum(map(len, unexplained.values()))} unexplained")
    assert not unexplained, unexplained
    assert not stale, f"reasons listed for items the mutant no longer loses: {stale}"


# Correct code whose float64 run is right at float32 precision only (float32 arithmetic inside,
# no float64 run at all, or EPS placed elsewhere): the float32 tolerance decides it, with a note.
FLOAT32_PRECISION = {"correct_float32_only", "correct_float_cast", "correct_forward_float32_only",
                     "correct_eps_in_numerator_too", "correct_eps_in_feature_map"}
NO_FLOAT64_RUN = {"correct_float_cast", "correct_forward_float32_only"}   # a form that cannot run in float64
MARGIN = 10   # each tolerance at least this far from what it must accept and from what it must catch
# Its outputs are the recurrence's but for where EPS sits (gamma cancels): its mistake is the state's.
OUTPUTS_RIGHT = {"mutant_state_decayed_twice"}


def test_each_tolerance_sits_between_honest_variation_and_the_smallest_mistake(assignment, graded):
    """The rubric's float64_abs and float32_abs against the corpus: the largest scaled error of a
    correct implementation's outputs from the reference (float64 runs of float64 code; float32
    runs of all), and the smallest of a mutant whose outputs differ, each at least MARGIN away."""
    tolerances = assignment.rubric.tolerances
    deviations = {name: figures for name, (_, figures) in graded.items()}
    honest64 = max((deviations[n]["float64"], n) for n in CORRECT if n not in FLOAT32_PRECISION)
    honest32 = max(max((deviations[n]["float32"], n) for n in CORRECT),
                   max((deviations[n]["float64"], n) for n in FLOAT32_PRECISION - NO_FLOAT64_RUN))
    precision32 = min((deviations[n]["float64"], n) for n in FLOAT32_PRECISION - NO_FLOAT64_RUN)
    mistakes = sorted((deviations[n]["float64"], n) for n in set(MUTANTS) - OUTPUTS_RIGHT
                      if deviations[n]["float64"] > tolerances["float64_abs"])
    print(f"\nfloat64_abs {tolerances['float64_abs']:g}: honest float64 code at most {honest64[0]:.2g} ({honest64[1]}), "
          f"float64 code at float32 precision at least {precision32[0]:.2g} ({precision32[1]}); "
          f"float32_abs {tolerances['float32_abs']:g}: honest float32 precision at most {honest32[0]:.2g} ({honest32[1]}), "
          f"the smallest mistake in the outputs {mistakes[0][0]:.2g} ({mistakes[0][1]}), then {mistakes[1][0]:.2g} "
          f"({mistakes[1][1]})")
    assert honest64[0] * MARGIN <= tolerances["float64_abs"] <= precision32[0] / MARGIN, (honest64, precision32)
    assert honest32[0] * MARGIN <= tolerances["float32_abs"] <= mistakes[0][0] / MARGIN, (honest32, mistakes[:3])


def test_an_item_that_cannot_be_judged_is_an_error_with_its_reason(corpus):
    """Never a silent failure: the item is `error` (0 points, in the TA's review list) and says why."""
    # A forward that matches no known computation is judged in the model by what hybrid_lm is about (issue 41).
    assert corpus["mutant_softmax_in_forward"]["hybrid_lm"].status == "passed"
    verdict = corpus["mutant_nan_output"]["state_fixed_size"]
    assert verdict.status == "error" and verdict.message.startswith(
        "not judged: step does not go on from the state it returned"), verdict.message


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_named_mistake_costs_exactly_its_own_concern(corpus, name):
    lost, item, words = NAMED[name]
    failed = {i for i, v in corpus[name].items() if v.status == "failed"}
    assert failed == lost, {i: corpus[name][i].message for i in failed ^ lost}
    unjudged = {i for i, v in corpus[name].items() if v.status == "error"}
    assert unjudged <= set(MISTAKES[name].because), {i: corpus[name][i].message for i in unjudged}
    assert words in corpus[name][item].message, f"{item}'s message does not name the mistake: {corpus[name][item].message}"


def _static_texts() -> list[str]:
    """Every sentence the checks can say about a named mistake, for either form."""
    texts = {items.MUTATED_STATE}
    for said in model._SAYS.values():
        for text in (said.values() if isinstance(said, dict) else [said]):
            texts.update(text.format(form=form) for form in ("forward", "step"))
    return sorted(texts, key=len, reverse=True)


def _diagnosis(message: str) -> str:
    """The diagnosis line of a message: after "Diagnosis: ", up to the case it was seen on."""
    assert "Diagnosis: " in message, message
    return message.split("Diagnosis: ", 1)[1].split(" (case ", 1)[0]


# Their diagnoses are not one of the checks' sentences: history kept elsewhere is said by what
# resuming showed; a fitted decay by the factors measured for the logits the case labels show.
MEASURED_DIAGNOSES = {"mutant_step_caches_history", "mutant_history_in_class_attribute", "mutant_decay_clamped",
                      "mutant_step_s_decayed_twice", "mutant_forward_rescaled_powers", "mutant_forward_exp_unclamped_lag",
                      "mutant_forward_cumprod_ratio"}
# A form that matches no known computation has no named mistake to say: its message says what was measured.
UNNAMED = {"mutant_step_z_accumulates_q", "mutant_step_z_accumulates_phi_v", "mutant_forward_sees_next_token",
           "mutant_forward_future_unit_weight", "mutant_forward_tril_offset_two"}


@pytest.mark.parametrize("name", sorted(set(NAMED) - MEASURED_DIAGNOSES - UNNAMED))
def test_the_diagnosis_line_names_the_mistake_and_no_hidden_input(corpus, name):
    """The line is the checks' own sentence about the mistake (no value of a hidden input can
    be in it), in the item of its concern and in every other item it costs that names it."""
    _, item, words = NAMED[name]
    for where, said in [(item, words)] + ALSO_DIAGNOSED.get(name, []):
        line = _diagnosis(corpus[name][where].message)
        assert said in line, (where, line)
        for text in _static_texts():
            line = line.replace(text, "")
        assert not line.strip("; ."), f"{where}: the diagnosis holds more than the named mistakes: {line!r}"


@pytest.mark.parametrize("name", sorted(RAISING))
def test_a_raising_form_is_said_plainly_on_every_item_that_needs_it(corpus, name):
    form, needing = RAISING[name]
    failed = {i: v.message for i, v in corpus[name].items() if v.status == "failed"}
    assert set(failed) == needing, failed
    stopped = {i: v.message for i, v in corpus[name].items() if v.status == "error"}
    assert set(stopped) == set(STEP_STOPS if form == "step" else FORWARD_STOPS), stopped
    said = "stopped when your LinearAttention.step raised" if form == "step" else "stopped when a model's forward raised"
    assert all(said in m for m in stopped.values()), stopped
    todo = ("implement one recurrent step carrying the fixed-size (S, z) state" if form == "step"
            else "implement the parallel form with an explicit decayed T x T mask")
    for item, message in failed.items():
        assert message == (f"{form} raised NotImplementedError: {todo}, at `raise NotImplementedError('{todo}')`; "
                           f"every item that needs {form} is 0 for that reason"), (item, message)


def test_float32_only_code_is_told_why_and_keeps_its_points(corpus):
    for name in ("correct_float32_only", "correct_float_cast", "correct_forward_float32_only"):
        message = corpus[name]["equivalence"].message
        assert "float32" in message and "float64" in message and corpus[name]["equivalence"].status == "passed"
    assert "x.float()" in corpus["correct_float_cast"]["causality"].message
    assert "in float64 it could not run" in corpus["correct_float_cast"]["causality"].message


@pytest.mark.parametrize("name", ["correct_eps_in_numerator_too", "correct_eps_in_feature_map"])
def test_a_note_on_float64_code_says_what_was_measured(corpus, name):
    """Code whose float64 run returns float64 arrays off by ~1e-7 (EPS placed elsewhere, or
    float32 arithmetic inside: the same from outside) is not told that it computes in float32."""
    notes = [v.message for v in corpus[name].values() if "correct at float32 tolerance" in v.message]
    assert notes, f"{name} was expected to be right at float32 tolerance only somewhere"
    for message in notes:
        assert "the arrays your float64 run returned are float64" in message, message
        assert "computes in float32" not in message and "seems to" not in message, message


def test_wrong_shapes_fail_with_both_shapes_never_a_crash(corpus):
    empty = corpus["mutant_empty_output"]
    assert "expected output shape (1, 1, 8), got (1, 1, 0)" in empty["normalization"].message
    # Its state is right, so the state's decay is too, and step leaves it unchanged (error carried
    # forward), Exercises 1 and 4 read no output (Exercise 4 the states) and Exercise 3's scoring runs
    # no layer of the student's; Exercise 3's training stops where the model adds the empty output.
    assert {i for i, v in empty.items() if v.status == "passed"} == {
        "scaffold_present", "decay_recurrent", "state_not_mutated",
        *(item for item in checks.EXERCISE_ITEMS if item in CORPUS_ITEMS and item not in FORWARD_STOPS)}, empty
    assert "got (1, 2, 1, 4)" in corpus["mutant_wrong_output_shape"]["normalization"].message


def test_a_mistake_in_one_form_is_blamed_on_that_form(corpus):
    message = corpus["mutant_decay_only_in_forward"]["equivalence"].message
    assert "forward matches the reference and step does not" in message and "step ignores gamma" in message


LABELED = re.compile(r"case (?P<label>.*?): max-abs error \S+ at \(batch (?P<b>\d+), position (?P<t>\d+), "
                     r"channel (?P<c>\d+)\): forward (?P<forward>\S+), step loop (?P<step>\S+?)\.(?:\s|$)")


@pytest.mark.parametrize("name, right", [("mutant_decay_only_in_forward", "forward"),
                                         ("mutant_decay_only_in_step", "step")])
def test_equivalence_labels_the_two_forms_never_expected_and_got(assignment, corpus, name, right):
    """No trusted value in forward vs step: each number is named by its form, and the one of the
    form that matches the reference is the reference's (it used to be called "got" for a step bug)."""
    message = corpus[name]["equivalence"].message
    found = LABELED.search(message)
    assert found and "expected" not in message and " got " not in message, message
    cases = checks.probe_cases(assignment.rubric)
    evidence = items.Evidence(_context(assignment, None), cases)
    (case,) = [c for c in cases if c.kind == "forward" and c.name.endswith("float64")
               and evidence.label(c.name) == found["label"]]
    reference = model.attention(model.parameters(case.arrays), model.torch.as_tensor(case.arrays["x"]),
                                case.config["num_heads"]).numpy()
    value = reference[int(found["b"]), int(found["t"]), int(found["c"])]
    assert abs(float(found[right]) - value) < 1e-5 * max(1.0, abs(value)), (message, value)
    wrong = "step" if right == "forward" else "forward"
    assert abs(float(found[wrong]) - value) > 1e-3


def test_forms_apart_only_by_where_eps_sits_agree_in_float64(corpus):
    """A state decayed once more divides gamma N by gamma D + EPS: the forms agree, and no note
    calls that float32 code."""
    verdict = corpus["mutant_state_decayed_twice"]["equivalence"]
    assert verdict.status == "passed" and "float32" not in verdict.message, verdict.message


def test_resuming_labels_the_two_runs_never_expected_and_got(corpus):
    message = corpus["mutant_step_caches_history"]["state_resume"].message
    assert "uninterrupted " in message and ", resumed " in message and "expected" not in message, message


def test_tampering_with_parameters_earns_nothing_from_the_hybrid_model(corpus):
    """A forward that zeroes its own out_proj computes nothing the checks know: the hybrid model
    is judged on the layer inside it, where the zeroed weights leave the loss without a gradient
    for the layers' parameters, whatever the student's process reports."""
    verdict = corpus["cheat_tampers_with_parameters"]["hybrid_lm"]
    assert verdict.status == "failed" and "no finite, non-zero gradient" in verdict.message, verdict.message
    assert "blocks.0.attn.q_proj.weight" in verdict.message, verdict.message


def test_a_changed_state_is_named_by_part_position_and_both_values(corpus):
    """The kept state is compared with the copy taken when step returned it: the message names
    the state, the part (S or z), where it differs and both values, and what the change cost."""
    message = corpus["mutant_inplace_z_only"]["state_not_mutated"].message
    found = re.search(r"the state step returned after token 0, kept and passed to step again, changed after later "
                      r"steps: z differs from its copy taken when step returned it, max-abs error (?P<err>\S+) at "
                      r"\(batch \d+, head \d+, channel \d+\): when returned (?P<then>\S+), later (?P<now>\S+?);", message)
    assert found and float(found["err"]) > 1 and "expected" not in message, message
    # The error is said to 3 significant digits.
    assert abs(float(found["now"]) - float(found["then"]) - float(found["err"])) < 1e-2 * float(found["err"]), message
    assert "so stepping token 3 twice from the state kept after token 2, the output: max-abs error" in message
    assert "first call" in message and "second call" in message


def test_a_step_that_ignores_its_state_keeps_the_mutation_item_with_a_note(corpus):
    """Stepping twice from one saved state gives two answers when step reads its own history,
    but that state did not change: state_resume charges it, this item only says it."""
    for name in ("mutant_step_caches_history", "mutant_history_in_class_attribute"):
        verdict = corpus[name]["state_not_mutated"]
        assert verdict.status == "passed" and "(see state_resume)" in verdict.message, (name, verdict.message)
        assert "stepping token 3 twice from the state kept after token 2" in verdict.message


def test_resume_item_is_about_the_state_not_the_arithmetic(corpus):
    """A step with the wrong arithmetic but an honest (S, z) still resumes like itself."""
    assert corpus["mutant_decay_s_not_z"]["state_resume"].status == "passed"


# ----------------------------------------------------------------------------- answer variables

def _executed(cells: list[tuple[str, str, int | None]]) -> bytes:
    """An executed notebook of (cell type, source, execution count) cells, as the driver writes it."""
    notebook = nbformat.v4.new_notebook()
    for kind, source, count in cells:
        if kind == "code":
            notebook.cells.append(nbformat.v4.new_code_cell(source, execution_count=count))
        else:
            notebook.cells.append(nbformat.v4.new_markdown_cell(source))
    return nbformat.writes(notebook).encode()


def _answer_verdicts(assignment, runs: list[CellRun], notebook: bytes | None) -> dict[str, Verdict]:
    execution = ExecutionResult(cells=runs, kernel="ok", timed_out=False, answers={}, executed_notebook=notebook)
    context = CheckContext(assignment.rubric, assignment.master_path, None, "not probed in this test",
                           execution, None, {})
    return decide(answer_checks(context))


def test_a_missing_answer_names_the_cell_that_raised(assignment):
    """Which cell raised is the driver's record; the student finds it by its place among the
    code cells, its In[n] and its first line. The cell that assigns the variable is named,
    not an earlier one that raised too."""
    notebook = _executed([("code", "import torch", 1), ("markdown", "# Exercise 1", None),
                          ("code", "x = helper()  # a helper that raised", 2),
                          ("markdown", "# Exercise 5", None),
                          ("code", "# Exercise 5: the memory bill\nMEMORY_BILL = memory_bill(4096)", 3)])
    runs = [CellRun(0, "a", "ok"), CellRun(2, "b", "error", "NameError: name 'helper' is not defined"),
            CellRun(4, "c", "error", "ValueError: tokens must be positive")]
    verdicts = _answer_verdicts(assignment, runs, notebook)
    bill = {name: v for name, v in verdicts.items() if name.startswith("bill_")}
    assert len(bill) == 8 and {v.status for v in bill.values()} == {"failed"}
    for verdict in bill.values():
        assert verdict.message == ("MEMORY_BILL is not defined after running the notebook: code cell 3 (In[3], "
                                   "`# Exercise 5: the memory bill`) raised ValueError: tokens must be positive")
    # No cell assigns DECODE_BENCHMARK here: the first cell that raised is named.
    assert verdicts["benchmark_fields"].message == (
        "DECODE_BENCHMARK is not defined after running the notebook: code cell 2 (In[2], "
        "`x = helper()  # a helper that raised`) raised NameError: name 'helper' is not defined")
    # Without the executed notebook the cell is still named by its place.
    verdicts = _answer_verdicts(assignment, runs, None)
    assert verdicts["bill_linear_state"].message.endswith(
        ": code cell 2 raised NameError: name 'helper' is not defined")


def test_a_missing_answer_with_no_raising_cell_says_so(assignment):
    notebook = _executed([("code", "import torch", 1), ("code", "bill = {}", 2)])
    verdicts = _answer_verdicts(assignment, [CellRun(0, "a", "ok"), CellRun(1, "b", "ok")], notebook)
    assert verdicts["bill_mha_kv_cache"].message == (
        "MEMORY_BILL is not defined after running the notebook: no cell raised, and no code cell assigns "
        "MEMORY_BILL (is its exercise still to do?)")


def _verdicts_on(assignment, answers: dict) -> dict[str, Verdict]:
    """The answer items on ``answers`` as a notebook that ran cleanly exported them."""
    execution = ExecutionResult(cells=[CellRun(0, "a", "ok")], kernel="ok", timed_out=False, answers=answers)
    context = CheckContext(assignment.rubric, assignment.master_path, None, "not probed in this test",
                           execution, None, answers)
    return decide(answer_checks(context))


def test_byte_counts_are_exact_and_a_known_omission_is_named(assignment):
    """Exercise 5's bill and Exercise 1's bytes are integer arithmetic: the exact figures pass
    (as floats too), and leaving z out of the linear state (0.78% off) fails with its diagnosis,
    as does a cache of keys only or a count of elements; the other entries keep their points."""
    setting = assignment.rubric.settings["memory_bill"]
    exact = memory_bill_expected(setting)
    grows = sorted(GROWS_WITH_T)
    right = _verdicts_on(assignment, {"MEMORY_BILL": {**{k: float(v) for k, v in exact.items()}, "grows_with_T": grows}})
    assert {v.status for name, v in right.items() if name.startswith("bill_")} == {"passed"}
    no_z = memory_bill_expected(setting, with_z=False)
    assert 0.007 < 1 - no_z["linear_state"] / exact["linear_state"] < 0.008   # the issue's 0.78%
    for mistake, said in MEMORY_BILL_MISTAKES:
        wrong = memory_bill_expected(setting, **mistake)
        verdicts = _verdicts_on(assignment, {"MEMORY_BILL": {**wrong, "grows_with_T": grows}})
        lost = {name for name, v in verdicts.items() if name.startswith("bill_") and v.status != "passed"}
        assert lost == {f"bill_{key}" for key in exact if wrong[key] != exact[key]}, (said, lost)
        for name in lost:
            key, message = name[len("bill_"):], verdicts[name].message
            # Every mistake that gives this number is named (keys only and elements only are both half).
            alike = ", or ".join(other for change, other in MEMORY_BILL_MISTAKES
                                 if memory_bill_expected(setting, **change)[key] == wrong[key])
            assert message.endswith(f"exactly (off by {wrong[key] - exact[key]:+,}, "
                                    f"{abs(wrong[key] - exact[key]) / exact[key]:.2%}). Diagnosis: {alike}"), message
            assert said in alike
    bench = {"history_lengths": [64, 256, 1024, 4096], "full_ms_per_step": [1.0] * 4, "linear_ms_per_step": [1.0] * 4,
             "embedding_dim": 64, "num_heads": 4, "batch_size": 2, "bytes_per_element": 4}
    kv = [2 * 2 * n * 64 * 4 for n in bench["history_lengths"]]
    s_bytes, z_bytes = 2 * 4 * 16 * 16 * 4, 2 * 4 * 16 * 4
    assert _verdicts_on(assignment, {"DECODE_BENCHMARK": {**bench, "kv_cache_bytes": kv,
                                                          "linear_state_bytes": [s_bytes + z_bytes] * 4}}
                        )["benchmark_memory"].status == "passed"
    no_z = _verdicts_on(assignment, {"DECODE_BENCHMARK": {**bench, "kv_cache_bytes": kv,
                                                          "linear_state_bytes": [s_bytes] * 4}})["benchmark_memory"]
    assert no_z.status == "failed" and no_z.message.endswith("Diagnosis: the normalizer z is left out of the state "
                                                             "(S alone)"), no_z.message
    keys_only = _verdicts_on(assignment, {"DECODE_BENCHMARK": {**bench, "kv_cache_bytes": [b // 2 for b in kv],
                                                               "linear_state_bytes": [s_bytes + z_bytes] * 4}})
    assert keys_only["benchmark_memory"].message.endswith("Diagnosis: the cache counts keys or values, not both")


# ----------------------------------------------------------------------------- one check crashing

def test_a_crashing_check_errors_its_own_item_only(assignment, monkeypatch):
    """Every other item is still decided; the traceback stays out of the student's message. (The
    probe runs the resume cases only: the other items are decided on what is missing.)"""
    def broken(evidence):
        raise ValueError("attempt to get argmax of an empty sequence")
    monkeypatch.setitem(items.SCAFFOLD_CHECKS, "state_resume", broken)
    source, _ = submission_module_source(assignment.master, as_scaffolds(assignment.master, scaffold_cell(
        assignment.master, (SCAFFOLDS / "correct_einsum.py").read_text())))
    cases = [c for c in checks.probe_cases(assignment.rubric) if c.name.startswith("resume_")]
    verdicts = checks.evaluate(_context(assignment, probe_in_process(source, cases, checks.PROBE_DRIVER)))
    crashed = verdicts["state_resume"]
    assert crashed.status == "error" and "grader error in check state_resume" in crashed.message
    assert "argmax" not in crashed.message and "ValueError: attempt to get argmax" in crashed.internal
    assert not any("grader error" in verdicts[n].message for n in checks.SCAFFOLD_ITEMS if n != "state_resume")
    # Not executed in this test, so the answer items fail, each for that reason, decided all the same.
    assert {v.status for n, v in verdicts.items() if n.startswith("bill_") or n in BENCHMARK_ITEMS} == {"failed"}
    assert all(v.internal is None for name, v in verdicts.items() if name != "state_resume")


# ----------------------------------------------------------------------------- the reference itself

def test_reference_matches_the_recurrence_loop(assignment):
    """The checks' parallel reference equals their token-by-token recurrence."""
    case = next(c for c in checks.probe_cases(assignment.rubric) if c.name == "forward_s3_per_head_float64")
    params = model.parameters(case.arrays)
    x = model.torch.as_tensor(case.arrays["x"])
    heads = case.config["num_heads"]
    assert (model.attention(params, x, heads) - model.recurrence(params, x, heads)).abs().max() < 1e-12


def test_probe_inputs_keep_eps_negligible(assignment):
    """phi(q).z >> EPS on every probe input, so no EPS convention changes a verdict."""
    for case in checks.probe_cases(assignment.rubric):
        if case.kind == "forward" and case.name.endswith("float64"):
            params = model.parameters(case.arrays)
            x = model.torch.as_tensor(case.arrays["x"])
            with_eps = model.attention(params, x, case.config["num_heads"], eps="add")
            without = model.attention(params, x, case.config["num_heads"], eps="none")
            assert (with_eps - without).abs().max() < 1e-4, case.name


# ----------------------------------------------------------------------------- through the sandbox

SANDBOXED = ("mutant_step_caches_history", "correct_float_cast", "mutant_empty_output")


def _probe_sandboxed(assignment, sandbox, source: str):
    with tempfile.TemporaryDirectory() as scratch:
        cases = [c for c in checks.probe_cases(assignment.rubric) if c.name != "training"]   # as in process
        return run_probe(source, cases, sandbox, Path(scratch), assignment.rubric.limits.probe_case_timeout_s,
                         checks.PROBE_DRIVER)


@pytest.fixture(scope="module")
def sandboxed_probes(assignment, sandbox) -> dict[str, ProbeResult]:
    # Only the sandboxed runs go in threads: CPython 3.11's parser and compiler are not
    # thread-safe ("AST constructor recursion depth mismatch").
    sources = [submission_module_source(assignment.master, as_scaffolds(assignment.master, scaffold_cell(
        assignment.master, (SCAFFOLDS / f"{name}.py").read_text())))[0] for name in SANDBOXED]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SANDBOXED, pool.map(lambda s: _probe_sandboxed(assignment, sandbox, s), sources)))


@pytest.fixture(scope="module")
def sandboxed(assignment, sandboxed_probes) -> dict[str, dict[str, Verdict]]:
    graded = {}
    for name, probe in sandboxed_probes.items():
        verdicts = checks.evaluate(_context(assignment, probe))
        graded[name] = {item: verdicts[item] for item in CORPUS_ITEMS}
    return graded


@pytest.mark.parametrize("name", SANDBOXED)
def test_the_probe_times_each_case_and_counts_the_workers_it_forked(assignment, sandboxed_probes, name):
    """The supervisor's timings (what ``make bench`` prints of the probe): a worker per segment
    of a case of its own, fewer workers than cases in each batch (the forward batch, the step
    runs' passes), one for the import, and each case's wall seconds within the probe's."""
    probe = sandboxed_probes[name]
    ran = [c for c in checks.probe_cases(assignment.rubric) if c.name != "training" and probe.cases[c.name].status
           != "not_run" and not (probe.cases[c.name].error or "").startswith("not run")]
    costs = probe.costs
    assert costs["import"].forks == 1 and costs["import"].seconds > 0, costs["import"]
    for case in ran:
        cost = costs.get(case.name)
        assert cost is not None and cost.seconds > 0, (case.name, cost)
        if case.segments and not case.batch and probe.cases[case.name].status == "ok":
            assert cost.forks == len(case.segments.bounds), (case.name, cost, len(case.segments.bounds))
        elif not case.batch:
            assert cost.forks == 1, (case.name, cost)
    batches = {c.batch for c in ran if c.batch}
    assert batches == {inputs.FORWARD_BATCH, inputs.STEPS_BATCH}, batches
    for batch in batches:
        batched = [c.name for c in ran if c.batch == batch]
        assert 1 <= sum(costs[n].forks for n in batched) < len(batched), {n: costs[n].forks for n in batched}
    spent = sum(cost.seconds for cost in costs.values())
    assert spent <= probe.cases_seconds + 0.05, (spent, probe.cases_seconds)
    by_kind = probe.costs_by_kind(ran)
    assert sum(count for count, _ in by_kind.values()) == len(ran)
    print(f"\n{name}: {sum(c.forks for c in costs.values())} workers forked, {spent:.2f} s of "
          f"{probe.cases_seconds:.2f} s in cases; " +
          "; ".join(f"{kind} {n} cases {cost.seconds:.2f} s {cost.forks} forks" for kind, (n, cost) in by_kind.items()))


@pytest.mark.parametrize("name", SANDBOXED)
def test_the_sandboxed_probe_grades_as_the_in_process_one(corpus, sandboxed, name):
    assert {i: v.status for i, v in sandboxed[name].items()} == {i: v.status for i, v in corpus[name].items()}


def test_the_graft_keeps_class_attributes_bound_together(assignment):
    """``_keys, _values = [], []`` in the student's class survives the graft (it used to be
    dropped silently); one that rebinds a provided member is still dropped."""
    student = ("class LinearAttention(Module):\n"
               "    _keys, _values = [], []\n"
               "    decay, _mine = 0.5, 1\n"
               "    def forward(self, x):\n"
               "        return x\n")
    source, _ = submission_module_source(assignment.master, as_scaffolds(assignment.master, student))
    assert "_keys, _values = ([], [])" in source and "decay, _mine" not in source
