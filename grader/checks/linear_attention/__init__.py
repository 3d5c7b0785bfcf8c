"""Hidden checks for the linear_attention assignment.

- ``cases``: the inputs the probe runs (each in float64 and in float32).
- ``probe_driver``: how the probe's harness builds and runs the layer (sent into the sandbox).
- ``model``: the reference computation and its named variants (the module's pitfalls).
- ``items``: the scaffold items, each judging one concern against the variant the student's
  form was found to compute, so that a mistake is charged once.
- ``hybrid``: the student's layer inside the provided language model.
- ``answers``: items decided by the executed notebook's answer variables.
- ``benchmark``: Exercise 1's method, from what the probe saw its sweep time.
- ``decay_inspection``: Exercise 4's functions, on the grader's layer, tokens and models.
- ``training``: Exercise 2's function, on the grader's token streams, sizes and budget.
- ``recall``: Exercise 3's functions, on the grader's seed and budget, and its own model and queries.
- ``observed``: the figures the written answers are grounded on, from the runs the grader observed.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from grader.checks import CheckContext, Verdict, decide, execution_verdict, import_torch
from grader.checks.linear_attention import cases as inputs
from grader.checks.linear_attention.answers import answer_checks
from grader.checks.linear_attention.benchmark import METHOD_ITEMS, method_checks
from grader.checks.linear_attention.decay_inspection import DECAY_ITEMS, decay_checks
from grader.checks.linear_attention.observed import observed_answers  # noqa: F401 - the written answers' grounding
from grader.checks.linear_attention.recall import RECALL_ITEMS, recall_checks
from grader.checks.linear_attention.training import TRAINING_ITEMS, training_checks
from grader.checks.linear_attention.hybrid import hybrid_integration_problem, hybrid_problem
from grader.checks.linear_attention.items import NEEDS, SCAFFOLD_CHECKS, Evidence, needing
from grader.probe import ProbeCase
from grader.rubric import Rubric

LAYER_ITEMS = ("scaffold_present", *SCAFFOLD_CHECKS, "hybrid_lm")
EXERCISE_ITEMS = (*METHOD_ITEMS, *TRAINING_ITEMS, *RECALL_ITEMS, *DECAY_ITEMS)   # exercises the probe calls as functions
SCAFFOLD_ITEMS = (*LAYER_ITEMS, *EXERCISE_ITEMS)   # every item the probe decides
PROBE_DRIVER = Path(__file__).with_name("probe_driver.py")
warm_up = import_torch   # evaluation computes with torch; the probe cases need numpy only


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    return inputs.probe_cases()


def check_hybrid(ev: Evidence) -> Verdict:
    """The model runs forward and backward, and its logits, loss and gradients are the trusted
    model's, whose layers compute what the student's forward was found to compute. A forward
    that matches no known computation leaves no trusted model to compare with: the item then
    judges what it is about, the layer inside the model (``hybrid_integration_problem``), and
    leaves the layer's numbers to the other forward items."""
    floor = ev.context.rubric.tolerances["hybrid_gradient_floor"]
    variant = ev.forward_variant
    if variant is None:
        run = ev.ran("hybrid_float64")
        failure = hybrid_integration_problem(ev.output(run), ev.inputs[run], ev.context.master_path)
        if failure:
            return Verdict("failed", f"HybridTransformerLM with your layer: {failure}")
        return Verdict("passed", "HybridTransformerLM runs your layer forward and backward: logits and loss of the "
                                 "right shapes and finite, and a finite, non-zero gradient for every parameter the "
                                 "reference's backward reaches (your forward matches no known computation, so its "
                                 "numbers are judged by the other forward items, not here)")

    def problem(run: str, tolerance: float) -> str | None:
        return hybrid_problem(ev.output(run), ev.inputs[run], ev.context.master_path, variant, tolerance, floor)
    verdict = ev.rule.judge(["hybrid_float64"], problem, "HybridTransformerLM with your layer")
    if verdict.status == "passed":
        gradients = ("every parameter's gradient but gamma_logit's (your decay's own function of it was measured "
                     "at the probe's values only; the decay items judge it)" if variant.measured_decay
                     else "every parameter's gradient")
        return Verdict("passed", f"forward and backward run, and the logits, the loss and {gradients} "
                                 f"match the trusted model's; {verdict.message}")
    return verdict


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    """A verdict for every autograded item; each is decided on its own."""
    checks = dict(answer_checks(context))
    checks["notebook_runs"] = partial(execution_verdict, context)
    probe = context.probe
    layer_problem = context.ungraded.get("LinearAttention")   # the sweep's cell may still be graded
    if probe is None or probe.import_status != "ok" or layer_problem:
        reason = layer_problem or (context.probe_problem if probe is None
                                   else f"importing your code failed: {probe.import_error}")
        return {**{name: Verdict("error", reason) for name in SCAFFOLD_ITEMS}, **decide(checks)}
    evidence = Evidence(context, probe_cases(context.rubric))
    checks["scaffold_present"] = lambda: Verdict("passed", "the LinearAttention scaffold imports")
    checks.update({name: partial(check, evidence) for name, check in SCAFFOLD_CHECKS.items()})
    checks["hybrid_lm"] = partial(needing(NEEDS["hybrid_lm"], check_hybrid), evidence)
    checks.update(method_checks(context))
    checks.update(training_checks(context))
    checks.update(recall_checks(context))
    checks.update(decay_checks(context))
    return decide(checks)
