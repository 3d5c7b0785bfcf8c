"""Hidden checks for the linear_attention assignment.

- ``cases``: the inputs the probe runs (each in float64 and in float32).
- ``probe_driver``: how the probe's harness builds and runs the layer (sent into the sandbox).
- ``model``: the reference computation and its named variants (the module's pitfalls).
- ``items``: the scaffold items, each judging one concern against the variant the student's
  form was found to compute, so that a mistake is charged once.
- ``hybrid``: the student's layer inside the provided language model.
- ``answers``: items decided by the executed notebook's answer variables.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from grader.checks import CheckContext, Verdict, decide, execution_verdict
from grader.checks.linear_attention import cases as inputs
from grader.checks.linear_attention.answers import answer_checks
from grader.checks.linear_attention.hybrid import hybrid_problem
from grader.checks.linear_attention.items import NEEDS, SCAFFOLD_CHECKS, Evidence, needing
from grader.probe import ProbeCase
from grader.rubric import Rubric

SCAFFOLD_ITEMS = ("scaffold_present", *SCAFFOLD_CHECKS, "hybrid_lm")
PROBE_DRIVER = Path(__file__).with_name("probe_driver.py")


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    return inputs.probe_cases()


def check_hybrid(ev: Evidence) -> Verdict:
    """The model runs forward and backward, and its logits, loss and gradients are the trusted model's."""
    floor = ev.context.rubric.tolerances["hybrid_gradient_floor"]

    def problem(run: str, tolerance: float) -> str | None:
        return hybrid_problem(ev.output(run), ev.inputs[run], ev.context.master_path, ev.forward_variant,
                              tolerance, floor)
    verdict = ev.rule.judge(["hybrid_float64"], problem, "HybridTransformerLM with your layer")
    if verdict.status == "passed":
        return Verdict("passed", "forward and backward run, and the logits, the loss and every parameter's gradient "
                                 f"match the trusted model's; {verdict.message}")
    return verdict


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    """A verdict for every autograded item; each is decided on its own."""
    checks = dict(answer_checks(context))
    checks["notebook_runs"] = partial(execution_verdict, context)
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}"
        return {**{name: Verdict("error", reason) for name in SCAFFOLD_ITEMS}, **decide(checks)}
    evidence = Evidence(context, probe_cases(context.rubric))
    checks["scaffold_present"] = lambda: Verdict("passed", "the LinearAttention scaffold imports")
    checks.update({name: partial(check, evidence) for name, check in SCAFFOLD_CHECKS.items()})
    checks["hybrid_lm"] = partial(needing(NEEDS["hybrid_lm"], check_hybrid), evidence)
    return decide(checks)
