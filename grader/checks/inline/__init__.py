"""Inline checks: the master notebook's ``test`` cells, decided outside the student's process.

An instructor writes a test cell as plain Python (``cells.TEST`` says how it is declared), the
way otter-grader's or nbgrader's tests are written: ``assert`` of a comparison or of a call
(``np.isclose``, ``np.allclose``, ``math.isclose``, ``torch.allclose`` ...), ``assert cond,
"message"``, ``np.testing.assert_*`` and ``torch.testing.assert_close`` calls, ``with
pytest.raises(E, match=...)`` blocks, or doctest examples (a cell that starts with ``>>>``, or
holds one string literal of them),
with loops and helper definitions around them. Those tools would run the test in the
student's process, where student code can redefine ``np.isclose``, return an object whose
``__eq__`` is always true or whose ``repr`` prints the expected text, silence the traceback or
raise to skip the rest. Here the cell is split instead:

- **Operands.** Each check site's expression is cut into *operands*: the parts that depend on
  the student's code (a name the notebook defines, other than an import of its provided cells,
  or a name the test binds from one: ``tainted``, ``_Taint``) and the parts that do not (the expected values, the
  comparison functions). The comparison itself (the operators, the call of ``np.allclose``)
  is the *skeleton* that joins them.
- **Two runs.** The probe runs the cell with every check site rewritten to send its tainted
  operands back *as data* (numbers, strings, arrays, tensors, containers of them, by exact
  type, never pickle; ``probe_harness.case_inline``): in a process of the grader's that runs
  no student code, while the student's module lives in a second process that answers the
  test's calls with data or handles, so no value of the test (its tables, a helper's
  parameters, its loop variables, the recording functions) is reachable from student code.
  The statements that compute only expected values are removed from that program as well.
  The grader runs the whole cell, once per process, against the master's own module
  (``master_run``) and keeps every operand's value.
- **Layout.** An array the student's code gives a comparison function (``np.allclose``,
  ``torch.testing.assert_close``...) must have the shape and dtype of the master's array in
  its place: those functions broadcast and cast.
- **Verdict.** For each time a site ran, the skeleton is evaluated here on the student's
  data and the master's expected values. The test passes when the student's run finished,
  every site ran as many times as in the master's run and every evaluation holds.

A site whose comparison is itself student code (``assert is_sorted(out)`` with the student's
``is_sorted``, an ``or``, a cell with no check site at all) is decided from what the student's
process computed: such tests are *in the sandbox*. A failure there fails the test; a pass is an
``error`` item a TA confirms (never points by itself), and ``grader validate`` names each such
cell with the line, why, and the author's fix (``InlineTest.sandbox_reasons``).

The package, one concern a module, each importing only those listed before it:

- ``sites``: what a test cell becomes (``Site``, ``InlineTest``), and a doctest cell read as Python;
- ``taint``: which names of a cell may hold the student's values (``_Taint``);
- ``rewrite``: each check site rewritten to record its operands, its skeleton kept;
- ``slicing``: the sandbox's program without what computes only expected values;
- ``read``: the master's test cells read into tests (``inline_tests``) and probe cases;
- ``data``: the student's values rebuilt from what the harness sent (``from_data``);
- ``messages``: what the student reads: the sandbox notes, the operands' summaries;
- ``evaluate``: the master's run (``master_runs``) and the verdicts (``evaluate``).
"""
from __future__ import annotations

from grader.checks.inline.data import NotData, from_data
from grader.checks.inline.evaluate import MasterRun, evaluate, master_runs, seed_generators
from grader.checks.inline.messages import _summary
from grader.checks.inline.read import inline_tests, probe_cases
from grader.checks.inline.sites import (CHECK, KEPT_ARRAYS, MAX_ARRAYS, PROGRAM, RAISED, VALUES, InlineError, InlineTest,
                                       Site, doctest_examples)

__all__ = ["CHECK", "KEPT_ARRAYS", "MAX_ARRAYS", "PROGRAM", "RAISED", "VALUES", "InlineError", "InlineTest", "MasterRun",
           "NotData", "Site", "_summary", "doctest_examples", "evaluate", "from_data", "inline_tests", "master_runs",
           "probe_cases", "seed_generators"]
