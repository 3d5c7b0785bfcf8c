"""Grading mode's budget: the floor under every grading run of linear_attention.

The grader runs each notebook with ``G2C_GRADING=1``, and the heavy exercise cells (training in
Exercises 2 and 3) then take the small budget of their ``if GRADING:`` branch. No item needs
more from those cells than "it runs and exports its results", so the budget is cut to what
proves that; what it must still do is checked here, on the master notebook run in process in
grading mode (every code cell in order, in one namespace, as the kernel would):

- every answer variable is defined and plain JSON, the items that read them (the memory bill
  and the decode benchmark) pass, and the variables the written answers are grounded on keep
  their structure (one entry per layer pattern, every recall distance measured, 512 state
  norms per decay, the learned decays of every linear layer);
- the budget still runs every path of the provided helpers: the learning-rate warmup and the
  cosine phase, generation past the model's context (its cropping), every distance bucket;
- the work stays at the floor: the token positions pushed through the language models are
  capped (the 20-step budgets before this cap pushed about 90,000 and kept the notebook over
  8 s on the 2-core reference machine; the cut budget pushes under 10,000);
- the grading branch has the same keys as the module's real budget and is no larger in any of
  them, so a student's code reads the same fields in both modes.

Timings are not asserted (a loaded machine must not fail a test): the floor's wall and CPU time
are measured by running the notebook with nbclient under ``GRADING_ENV``, kernel start included.
"""
from __future__ import annotations

import ast
import json
import math
from typing import Any

import pytest
import torch

from grader import cells
from grader.checks import CheckContext, decide
from grader.checks.linear_attention.answers import answer_checks
from grader.checks.linear_attention.observed import observed_answers
from grader.execute import GRADING_ENV, CellRun, ExecutionResult

from test_observed_runs import grading_run_probe

# Token positions the grading-mode run may push through HybridTransformerLM.forward (training,
# evaluation and generation of Exercises 2 and 3 together).
MAX_GRADING_TOKENS = 16_000
BUDGET_CELLS = {"ex2-data": "EX2_BUDGET", "ex3-run": "RECALL_BUDGET"}


@pytest.fixture(scope="module")
def run(assignment) -> dict[str, Any]:
    """The master's code cells executed in grading mode: the namespace, with the number of
    token positions the language models processed under ``"_tokens"``."""
    mp = pytest.MonkeyPatch()
    for name, value in GRADING_ENV.items():
        mp.setenv(name, value)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    tokens = [0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as OMP_NUM_THREADS=1 does in the kernel
    try:
        for cell in assignment.master.cells:
            if cell.cell_type != "code":
                continue
            exec(compile(cells.source(cell), f"<cell {cell.get('id')}>", "exec"), namespace)
            if cell.get("id") == "hybrid-model":
                _count_tokens(namespace["HybridTransformerLM"], tokens)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    namespace["_tokens"] = tokens[0]
    return namespace


def _count_tokens(model_class: type, tokens: list[int]) -> None:
    forward = model_class.forward

    def counted(self, ids):
        tokens[0] += ids.numel()
        return forward(self, ids)

    model_class.forward = counted


def test_the_run_is_in_grading_mode(run):
    assert run["GRADING"] is True
    assert run["RUN_REPORT"]["grading_mode"] is True


def test_every_answer_variable_is_exported_as_plain_json(run, assignment):
    for name in assignment.rubric.answer_variables:
        value = run.get(name)
        assert value is not None, f"{name} is not defined after the grading-mode run"
        assert json.loads(json.dumps(value, allow_nan=False)) == value, f"{name} is not plain JSON"


def test_the_items_that_read_answer_variables_pass(run, assignment):
    answers = {name: json.loads(json.dumps(run[name])) for name in assignment.rubric.answer_variables}
    execution = ExecutionResult(cells=[CellRun(0, None, "ok")], kernel="ok", timed_out=False, answers=answers)
    context = CheckContext(assignment.rubric, assignment.master_path, None, "not probed in this test",
                           execution, None, answers)
    verdicts = decide(answer_checks(context))
    # The reported timings count only beside the probe's observed sweep, which this test does not run.
    observed = verdicts.pop("benchmark_timings")
    assert observed.status == "failed" and "observed run" in observed.message, observed
    assert {name for name, v in verdicts.items() if v.status != "passed"} == set(), \
        {name: v.message for name, v in verdicts.items() if v.status != "passed"}
    assert len(run["DECODE_BENCHMARK"]["history_lengths"]) >= 4


def test_training_results_have_every_pattern_and_a_generated_sample(run):
    results, budget, prompt = run["TRAINING_RESULTS"], run["EX2_BUDGET"], run["SAMPLE_PROMPT"]
    assert list(results) == list(run["LAYER_PATTERNS"])
    for name, result in results.items():
        assert set(result) == {"parameters", "val_loss", "sample"}, name
        assert isinstance(result["parameters"], int) and result["parameters"] > 0, name
        assert math.isfinite(result["val_loss"]) and result["val_loss"] > 0, name
        assert result["sample"].startswith(prompt) and len(result["sample"]) == len(prompt) + budget["sample_tokens"]


def test_recall_results_measure_every_distance(run):
    distances = list(range(1, run["RECALL_NUM_PAIRS"] + 1))
    assert list(run["RECALL_RESULTS"]) == list(run["LAYER_PATTERNS"])
    for name, result in run["RECALL_RESULTS"].items():
        assert result["distance_buckets"] == distances, name
        assert len(result["accuracy"]) == len(distances), name
        # a NaN would mean a bucket with no query in it
        assert all(0.0 <= a <= 1.0 for a in result["accuracy"] + [result["overall_accuracy"]]), (name, result)


def test_decay_results_keep_every_norm_and_every_learned_decay(run):
    decay = run["DECAY_RESULTS"]
    assert list(decay["state_norms"]) == list(run["DECAY_LOGITS"])
    assert all(len(norms) == run["DECAY_TOKENS"] for norms in decay["state_norms"].values())
    heads = run["STORYLM_1M"]["num_heads"]
    for name, pattern in run["LAYER_PATTERNS"].items():
        layers = decay["learned_decays"][name]
        assert len(layers) == pattern.count("linear"), name
        assert all(len(d) == heads and all(0.0 < g < 1.0 for g in d) for d in layers), name


def test_the_budget_still_runs_every_path_of_the_helpers(run):
    ex2 = run["EX2_BUDGET"]
    warmup = max(1, ex2["steps"] // 20)   # make_optimizer's default warmup
    assert ex2["steps"] > warmup, "the cosine phase of the schedule must run too"
    assert len(run["SAMPLE_PROMPT"]) + ex2["sample_tokens"] > ex2["context"], \
        "generation must pass the context, so HybridTransformerLM.generate crops"
    assert ex2["eval_batches"] >= 1 and run["RECALL_BUDGET"]["steps"] >= 2


def test_the_grading_run_stays_at_the_floor(run):
    assert 0 < run["_tokens"] <= MAX_GRADING_TOKENS, \
        f"the grading-mode run pushed {run['_tokens']:,} token positions through the language models"


@pytest.mark.parametrize("cell_id", sorted(BUDGET_CELLS))
def test_the_grading_budget_has_the_real_budgets_fields_and_is_no_larger(run, assignment, cell_id):
    grading, real = (_branch_budget(assignment, run, cell_id, flag) for flag in (True, False))
    assert set(grading) == set(real)
    larger = {k: (grading[k], real[k]) for k in grading if k != "lr" and grading[k] > real[k]}
    assert larger == {}, f"grading mode's {BUDGET_CELLS[cell_id]} is larger than the module's in {larger}"
    assert grading != real


def _branch_budget(assignment, run: dict[str, Any], cell_id: str, grading: bool) -> dict[str, Any]:
    """The budget one branch of the cell's ``if GRADING:`` sets, without running the cell."""
    (cell,) = [c for c in assignment.master.cells if c.get("id") == cell_id]
    (branch,) = [node for node in ast.parse(cells.source(cell)).body
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "GRADING"]
    namespace = {"GRADING": grading, "STORYLM_1M": run["STORYLM_1M"]}
    exec(compile(ast.Module(body=[branch], type_ignores=[]), f"<{cell_id} budget>", "exec"), namespace)
    return namespace[BUDGET_CELLS[cell_id]]


def test_the_rubric_describes_the_grading_budgets_to_the_written_grader(run, assignment):
    """The LLM is told what the grader's re-run was (written.rerun budgets): those labels must
    quote the grading branch's own steps and batch sizes, or the model is told a run that never was."""
    rerun = assignment.rubric.rerun
    ex2, recall = run["EX2_BUDGET"], run["RECALL_BUDGET"]
    assert f"{ex2['steps']} steps of batch {ex2['batch_size']} at context {ex2['context']}" in \
        rerun["TRAINING_RESULTS"].budget
    assert f"{recall['steps']} steps of batch {recall['batch_size']} and {recall['eval_size']} evaluation" in \
        rerun["RECALL_RESULTS"].budget
    assert f"{ex2['steps']}-step" in rerun["DECAY_RESULTS"].budget


def test_the_grader_observes_the_same_run_as_the_notebooks_cells(run, assignment):
    """The written answers are grounded on the grader's own run of Exercises 2 to 4
    (``probe_driver.case_grading_run``, with ``cases.GRADING_RUN``'s budgets): on the master it
    measures the figures the notebook's run cells export, to their rounding, so the grounding
    says what an honest notebook's run says."""
    observed = observed_answers(CheckContext(assignment.rubric, assignment.master_path,
                                             grading_run_probe(assignment, {}), None, None, "not executed"))
    for name, result in run["TRAINING_RESULTS"].items():
        seen = observed["TRAINING_RESULTS"][name]
        assert seen["parameters"] == result["parameters"]
        assert seen["val_loss"] == pytest.approx(result["val_loss"], abs=2e-3), name
    for name, result in run["RECALL_RESULTS"].items():
        seen = observed["RECALL_RESULTS"][name]
        assert seen["distance_buckets"] == result["distance_buckets"]
        assert seen["accuracy"] == pytest.approx(result["accuracy"], abs=1e-3), name
        assert seen["overall_accuracy"] == pytest.approx(result["overall_accuracy"], abs=1e-3), name
    norms = observed["DECAY_RESULTS"]["state_norms_after_tokens"]
    assert set(norms) == set(run["DECAY_RESULTS"]["state_norms"])
    for label, series in run["DECAY_RESULTS"]["state_norms"].items():
        assert {int(n): v for n, v in norms[label].items()} == pytest.approx(
            {n: series[n - 1] for n in map(int, norms[label])}, rel=1e-3), label
    for name, layers in run["DECAY_RESULTS"]["learned_decays"].items():
        seen = observed["DECAY_RESULTS"]["learned_decays"][name]
        assert [len(layer) for layer in seen] == [len(layer) for layer in layers], name
        assert [g for layer in seen for g in layer] == pytest.approx([g for layer in layers for g in layer], abs=1e-3)
