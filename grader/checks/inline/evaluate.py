"""Evaluating the skeletons: the master's run of each test in this process (:func:`master_runs`),
and each of the student's runs judged against it (:func:`evaluate`): the student's data and the
master's expected values put in the skeleton, the layout of what a comparison function is given
checked, doctest output and raised exceptions compared."""
from __future__ import annotations

import ast
import contextlib
import doctest
import io
import random
import re
import traceback
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import nbformat
import numpy as np

from grader import cells
from grader.checks import CheckContext, Verdict, decide
from grader.graft import submission_module_source
from grader.checks.inline.data import NotData, from_data
from grader.checks.inline.messages import (SANDBOX_NOTE, SANDBOX_PASS, _as_float_array, _doctest_repr, _operands,
                                          _short, _times)
from grader.checks.inline.read import inline_tests
from grader.checks.inline.sites import CHECK, RAISED, VALUES, InlineTest, Site, _operand_index


SEED = 0                   # the global generators' seed before a test runs, in both runs


@dataclass
class MasterRun:
    """What one test recorded against the master's module: per site, each run's operands."""

    records: dict[int, list[tuple[Any, ...]]]
    problem: str | None      # the test failed on the master (the assignment is wrong)


def seed_generators() -> None:
    """The global generators' state before a test runs, the same in both runs: inputs a test
    draws from them are the same for the master and the student (until student code draws)."""
    random.seed(SEED)
    np.random.seed(SEED)
    try:
        import torch
    except ImportError:   # an assignment without torch
        return
    torch.manual_seed(SEED)


@lru_cache(maxsize=8)
def master_runs(master_path: Path, fingerprint: str) -> dict[str, MasterRun]:
    """Each test of the master at ``master_path`` run against the master's own module, in this
    process (the master is trusted), once per process and master version (``fingerprint``)."""
    master = nbformat.read(str(master_path), as_version=4)
    scaffolds = {s.cell_id: next(cells.source(c) for c in master.cells if c.get("id") == s.cell_id)
                 for s in cells.scaffolds(master)}
    module_source, _ = submission_module_source(master, scaffolds)
    module_code = compile(module_source, f"<master {master_path.name}>", "exec")
    return {test.name: _master_run(test, module_code) for test in inline_tests(master)}


def _master_run(test: InlineTest, module_code: Any) -> MasterRun:
    records: dict[int, list[tuple[Any, ...]]] = {}

    def check(site: int, values: tuple[Any, ...]) -> None:
        records.setdefault(site, []).append(values)

    def raised(site: int, exception: BaseException | None, values: tuple[Any, ...]) -> None:
        records.setdefault(site, []).append((exception, *values))
    namespace: dict[str, Any] = {"__name__": "g2c_master"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(module_code, namespace)
            namespace.update({CHECK: check, RAISED: raised})
            seed_generators()
            exec(compile(test.master_program, f"<test {test.name}>", "exec"), namespace)
    except Exception:  # noqa: BLE001 - a broken test costs its own item
        return MasterRun(records, traceback.format_exc(limit=-3))
    for site in test.sites:
        for values in records.get(site.index, []):
            problem = _judge_master(site, values)
            if problem:
                return MasterRun(records, f"the reference solution fails line {site.line}, `{site.text}`: {problem}")
    return MasterRun(records, None)


def _judge_master(site: Site, values: tuple[Any, ...]) -> str | None:
    """Why the master's own run of ``site`` fails (None when it holds)."""
    if site.kind in ("raises", "doctest_raises"):
        exception = values[0]
        sent = None if exception is None else {
            "types": [f"{c.__module__}.{c.__qualname__}" for c in type(exception).__mro__],
            "message": str(exception) if type(exception).__module__ == "builtins" else ""}
        return _judge_raised(site, sent, values)
    if site.kind == "doctest":
        return _judge_output(site, _doctest_repr(values[0]))
    if site.kind == "print":
        return _judge_printed(site, list(values))
    return _judge_skeleton(site, list(values))


def evaluate(tests: list[InlineTest], context: CheckContext, runs: dict[str, MasterRun]) -> dict[str, Verdict]:
    """A verdict for every test: each decided on its own (``decide``)."""
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = (context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}")
        return {test.name: Verdict("error", reason or "the code was not probed") for test in tests}
    return decide({test.name: partial(_verdict, test, context, runs[test.name]) for test in tests})


def _verdict(test: InlineTest, context: CheckContext, master: MasterRun) -> Verdict:
    if master.problem:
        return Verdict("error", "this test fails on the reference solution (the grader's maintainers will fix it; "
                                "it is not your fault)", master.problem)
    out = context.probe.cases.get(test.case_name) if context.probe else None
    if out is None or out.status != "ok":
        why = (out.error or out.status) if out is not None else "it was not run"
        return _failed(test, f"the test did not finish: {why}")
    records = out.info.get("records")
    if not isinstance(records, list) or not all(isinstance(r, list) and len(r) == 2 for r in records):
        return _failed(test, "the test's results could not be read")
    runs: dict[int, list[Any]] = {}
    for site, values in records:
        if type(site) is not int or not 0 <= site < len(test.sites):
            return _failed(test, "the test's results could not be read")
        runs.setdefault(site, []).append(values)
    for site in test.sites:
        got, expected = runs.get(site.index, []), master.records.get(site.index, [])
        if len(got) != len(expected):
            return _failed(test, f"line {site.line}, `{site.text}`: ran {_times(len(got))}; with the reference "
                                 f"solution it runs {_times(len(expected))}")
        for number, (sent, reference) in enumerate(zip(got, expected), start=1):
            problem = _judge(site, sent, reference, out.arrays)
            if problem:
                nth = f" (its run {number} of {len(got)})" if len(got) > 1 else ""
                return _failed(test, f"line {site.line}{nth}, `{site.text}`: {problem}")
    checked = sum(len(v) for v in runs.values())
    if test.in_sandbox:   # a truth value the student's code reported: never points without a person
        return Verdict("error", SANDBOX_PASS.format(checks=_times(checked, "check")), "; ".join(test.sandbox_reasons))
    return Verdict("passed", f"{_times(checked, 'check')} passed")


def _failed(test: InlineTest, detail: str) -> Verdict:
    said = f"{test.cell.message} ({detail})" if test.cell.message else detail
    return Verdict("failed", said + (f" [{SANDBOX_NOTE}]" if test.in_sandbox else ""))


def _judge(site: Site, sent: Any, reference: tuple[Any, ...], arrays: dict[str, np.ndarray]) -> str | None:
    """Why one run of ``site`` fails (None when it holds), from the student's data ``sent`` and
    the master's operands ``reference``."""
    if site.kind in ("raises", "doctest_raises"):
        return _judge_raised(site, sent, reference)
    if type(sent) is not list or len(sent) != sum(site.tainted):
        return "its values could not be read"
    received = iter(sent)
    values = []
    read_as_builtin: list[str] = []   # the student's values of a subclass of a built-in type, for the message
    for position, tainted in enumerate(site.tainted):
        if not tainted:
            values.append(reference[position])
            continue
        subclasses: list[str] = []
        try:
            values.append(from_data(next(received), arrays, subclasses))
        except NotData as exc:
            return f"`{site.operands[position]}` is {exc}"
        if subclasses and site.kind in ("doctest", "print"):
            return (f"`{site.operands[position]}` holds a {subclasses[0]}: it prints as its class says, which the "
                    "grader does not run (return the built-in type the example shows)")
        read_as_builtin += [f"`{site.operands[position]}` holds a {name}" for name in subclasses]
    for position in _compared(site, reference):
        problem = _layout_problem(values[position], reference[position]) if site.tainted[position] else None
        if problem:
            return f"`{site.operands[position]}` {problem}"
    if site.kind == "doctest":
        return _judge_output(site, _doctest_repr(values[0]))
    if site.kind == "print":
        return _judge_printed(site, values)
    problem = _judge_skeleton(site, values)
    if problem and read_as_builtin:   # say what was caught: such a class's own ==, < or bool would have passed
        problem += (f" ({'; '.join(read_as_builtin)}, compared as the built-in value it holds: its class's "
                    "methods never run)")
    return problem


COMPARISONS = frozenset(("allclose", "isclose", "array_equal", "array_equiv", "equal", "assert_close"))


def _compared(site: Site, reference: tuple[Any, ...]) -> list[int]:
    """The operands a comparison function of ``site`` (``np.allclose``, ``torch.testing.assert_close``,
    ``np.testing.assert_*``...) is given directly, which that function may broadcast or cast."""
    if site.kind not in ("assert", "call"):
        return []
    found = []
    for node in ast.walk(ast.parse(site.skeleton, mode="eval")):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and _is_comparison(reference[_operand_index(node.func)])):
            continue
        found += [_operand_index(a) for a in [*node.args, *(k.value for k in node.keywords)]
                  if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and a.value.id == VALUES]
    return found


def _is_comparison(function: Any) -> bool:
    name, module = getattr(function, "__name__", ""), getattr(function, "__module__", "") or ""
    if not module.split(".")[0] in ("numpy", "torch", "math"):
        return False
    return name in COMPARISONS or (name.startswith("assert_") and ".testing" in module)


def _layout_problem(got: Any, expected: Any) -> str | None:
    """How an array the student's code gave differs in shape or dtype from the reference
    solution's array in its place: a comparison function would broadcast an empty or a
    one-row array against it, or cast it, and call them close."""
    if _as_float_array(got) is None or _as_float_array(expected) is None:
        return None
    got_shape, expected_shape = tuple(got.shape), tuple(expected.shape)
    got_dtype, expected_dtype = (str(v.dtype).replace("torch.", "") for v in (got, expected))
    if got_shape != expected_shape:
        return f"has shape {got_shape}; with the reference solution it has shape {expected_shape}"
    if got_dtype != expected_dtype or isinstance(got, np.ndarray) != isinstance(expected, np.ndarray):
        kinds = ["a tensor" if not isinstance(v, np.ndarray) else "an array" for v in (got, expected)]
        return (f"is {kinds[0]} of dtype {got_dtype}; with the reference solution it is {kinds[1]} of "
                f"dtype {expected_dtype}")
    return None


def _judge_skeleton(site: Site, values: list[Any]) -> str | None:
    code = compile(site.skeleton, "<check>", "eval")
    try:
        with np.errstate(all="ignore"):
            result = eval(code, {"__builtins__": {}}, {VALUES: values})  # noqa: S307 - the grader's own skeleton
            holds = True if site.kind == "call" else bool(result)
    except AssertionError as exc:
        return _short(str(exc).strip() or "the assertion failed") + _operands(site, values)
    except Exception as exc:  # noqa: BLE001 - the comparison fails as Python would have failed it
        return f"{type(exc).__name__}: {_short(str(exc))}" + _operands(site, values)
    if holds:
        return None
    said = f"{site.message}; " if site.message else ""
    return f"{said}it is False" + _operands(site, values)


def _judge_output(site: Site, got: str) -> str | None:
    if doctest.OutputChecker().check_output(site.want, got, site.flags):
        return None
    return f"expected {_short(site.want.rstrip(), 300)!r}, got {_short(got.rstrip(), 300)!r}"


def _judge_printed(site: Site, values: list[Any]) -> str | None:
    roles = ast.literal_eval(site.skeleton)
    options = {role: value for role, value in zip(roles, values) if role}
    sep, end = options.get("sep", " "), options.get("end", "\n")
    if not all(x is None or isinstance(x, str) for x in (sep, end)):
        return "print's sep and end must be strings"
    shown = [str(v) for role, v in zip(roles, values) if role is None]
    return _judge_output(site, (" " if sep is None else sep).join(shown) + ("\n" if end is None else end))


def _judge_raised(site: Site, sent: Any, reference: tuple[Any, ...]) -> str | None:
    if sent is None:
        return "no exception was raised"
    if type(sent) is not dict or type(sent.get("types")) is not list or type(sent.get("message")) is not str:
        return "the exception could not be read"
    names = [n for n in sent["types"] if type(n) is str]
    raised = names[0].removeprefix("builtins.") if names else "an exception"
    if site.kind == "doctest_raises":
        return _judge_output(site, f"{raised}: {sent['message']}\n" if sent["message"] else f"{raised}\n")
    expected, match = reference[1], reference[2]
    classes = expected if isinstance(expected, tuple) else (expected,)
    wanted = [f"{c.__module__}.{c.__qualname__}" for c in classes if isinstance(c, type)]
    if not set(wanted) & set(names):
        return f"raised {raised}, not {' or '.join(w.removeprefix('builtins.') for w in wanted)}"
    if match is not None and not re.search(str(match), sent["message"]):
        return f"raised {raised} whose message {_short(sent['message'], 200)!r} does not match {str(match)!r}"
    return None
