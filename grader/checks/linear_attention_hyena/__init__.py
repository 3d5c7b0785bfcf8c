"""Hidden checks for the linear_attention_hyena assignment.

- ``cases``: the probe's inputs, as data: calls of the 14 scaffold functions by name through
  the harness's generic ``call`` handler (no driver file), grouped by function.
- ``reference``: the trusted NumPy references (recurrences and masked forms, gate products,
  masks, the causal and cyclic convolutions, the recall errors).
- ``items``: one check per scaffold item, each judging its own concern; where an item builds on
  another, a mistake already charged there is carried forward (see its docstring).

``notebook_runs`` is decided by the executed notebook (``grader.checks.execution_verdict``).
"""
from __future__ import annotations

from functools import partial

from grader.checks import CheckContext, Verdict, decide, execution_verdict
from grader.checks.linear_attention_hyena import cases as inputs
from grader.checks.linear_attention_hyena.items import ITEMS, Evidence, check_scaffold_present
from grader.probe import ProbeCase
from grader.rubric import Rubric

SCAFFOLD_ITEMS = ("scaffold_present", *ITEMS)
PROBE_DRIVER = None   # every case uses the harness's own ``call`` handler


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    return inputs.probe_cases()


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    """A verdict for every autograded item; each is decided on its own."""
    checks = {"notebook_runs": partial(execution_verdict, context)}
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}"
        return {**{name: Verdict("error", reason) for name in SCAFFOLD_ITEMS}, **decide(checks)}
    evidence = Evidence(context)
    checks["scaffold_present"] = partial(check_scaffold_present, evidence)
    checks.update({name: partial(check, evidence) for name, check in ITEMS.items()})
    return decide(checks)
