"""Items decided by the executed notebook's answer variables, not by the scaffold: the
memory bill of Exercise 5 and the decode benchmark of Exercise 1 (and that the notebook ran).
Figures the notebook measured (the benchmark's timings) count only beside the grader's observed
run (``benchmark.observed_timings``); figures that follow from sizes (byte counts) are
recomputed here.

A missing answer variable names the cell that raised, as the student sees it: its place among
the code cells, its execution count and its first line. Which cell raised comes from the
driver's per-cell record (``ExecutionResult.cells``); its source and count from the executed
notebook the driver vouched for, never from a value the notebook's code exported.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from grader import cells
from grader.checks import CheckContext, Verdict
from grader.checks.linear_attention.benchmark import observed_timings
from grader.execute import ExecutionResult


def memory_bill_expected(setting: dict[str, Any], *, with_z: bool = True, kv_tensors: int = 2,
                         in_bytes: bool = True) -> dict[str, int]:
    """Exercise 5's byte counts, from the rubric's sizes: integer arithmetic, compared exactly.
    The keywords make the bill of a known mistake (``MEMORY_BILL_MISTAKES``)."""
    tokens, dim, heads = setting["tokens"], setting["embedding_dim"], setting["num_heads"]
    kv_heads, window, layers = setting["kv_heads"], setting["window"], setting["stack_layers"]
    width = setting["bytes_per_element"] if in_bytes else 1
    head_dim = dim // heads
    mha = kv_tensors * tokens * dim * width
    linear = (heads * head_dim * head_dim + (heads * head_dim if with_z else 0)) * width
    return {"mha_kv_cache": mha, "gqa8_kv_cache": kv_tensors * tokens * kv_heads * head_dim * width,
            "sliding_window_kv_cache": kv_tensors * min(window, tokens) * dim * width,
            "linear_state": linear, "stack_all_mha": layers * mha,
            "stack_all_linear": layers * linear, "stack_hybrid_LLLF": (layers - 1) * linear + mha}


# A bill's known mistakes: what the student's number then equals, and the diagnosis (every one
# that gives that number: with 2 bytes an element, keys only and elements only are both half).
# Leaving z out of the linear state is 0.78% off at Exercise 5's sizes, which a relative
# tolerance would hide.
MEMORY_BILL_MISTAKES = (({"with_z": False}, "the normalizer z is left out of the linear state (S alone)"),
                        ({"kv_tensors": 1}, "the cache counts keys or values, not both"),
                        ({"in_bytes": False}, "it counts elements, not bytes (bytes_per_element left out)"))


GROWS_WITH_T = {"mha_kv_cache", "gqa8_kv_cache", "stack_all_mha", "stack_hybrid_LLLF"}


def answer_checks(context: CheckContext) -> dict[str, Callable[[], Verdict]]:
    """One check per memory-bill and benchmark item, each decided on its own."""
    checks: dict[str, Callable[[], Verdict]] = {
        f"bill_{key}": (lambda key=key: _bill_item(context, key))
        for key in memory_bill_expected(context.rubric.settings["memory_bill"])}
    checks["bill_grows_with_T"] = lambda: _bill_grows_with_t(context)
    checks.update({name: (lambda name=name: _benchmark_verdicts(context)[name]) for name in BENCHMARK_ITEMS})
    return checks


def _bill_item(context: CheckContext, key: str) -> Verdict:
    bill = context.answers.get("MEMORY_BILL")
    missing = _missing_answer(context, "MEMORY_BILL", bill)
    if missing:
        return Verdict("failed", missing)
    setting = context.rubric.settings["memory_bill"]
    value = memory_bill_expected(setting)[key]
    got = bill.get(key)
    if not _is_number(got):
        return Verdict("failed", f"MEMORY_BILL[{key!r}] should be a number of bytes, got {got!r}")
    if got != value:
        mistakes = [said for mistake, said in MEMORY_BILL_MISTAKES
                    if memory_bill_expected(setting, **mistake)[key] == got != value]
        return Verdict("failed", f"MEMORY_BILL[{key!r}] = {got:,.0f} bytes; expected {value:,} bytes at Exercise 5's "
                                 f"sizes, exactly (off by {got - value:+,.0f}, {abs(got - value) / value:.2%})"
                                 + (f". Diagnosis: {', or '.join(mistakes)}" if mistakes else ""))
    return Verdict("passed", f"MEMORY_BILL[{key!r}] = {got:,.0f} bytes")


def _bill_grows_with_t(context: CheckContext) -> Verdict:
    bill = context.answers.get("MEMORY_BILL")
    missing = _missing_answer(context, "MEMORY_BILL", bill)
    if missing:
        return Verdict("failed", missing)
    grows = bill.get("grows_with_T")
    if not isinstance(grows, list) or set(map(str, grows)) != GROWS_WITH_T:
        return Verdict("failed", f"MEMORY_BILL['grows_with_T'] = {grows!r}: list exactly the keys whose size "
                                 "grows with T")
    return Verdict("passed", "the growing states are named correctly")


def _missing_answer(context: CheckContext, name: str, value: Any) -> str | None:
    if context.execution is None:
        return f"{name} was not read: the notebook was not executed ({context.execution_problem})"
    if value is None:
        return f"{name} is not defined after running the notebook: {_why_undefined(context.execution, name)}"
    if not isinstance(value, dict):
        return f"{name} should be a dict, got {type(value).__name__}"
    return None


def _why_undefined(execution: ExecutionResult, name: str) -> str:
    """The cell that raised, preferring one that assigns ``name``; or that none raised."""
    def assigns(source: str) -> bool:
        return bool(cells.assigned_names(source, (name,)))

    raised = [run for run in sorted(execution.cells, key=lambda run: run.index) if run.status in ("error", "timeout")]
    if not raised:
        kept = [execution.cell_source(run) for run in execution.cells]
        if any(kept) and not any(assigns(source) for source in kept):
            return f"no cell raised, and no code cell assigns {name} (is its exercise still to do?)"
        return "no cell raised (is the name spelled as the exercise asks?)"
    cell = next((run for run in raised if assigns(execution.cell_source(run))), raised[0])
    return f"{execution.cell_label(cell)} raised {cell.error or cell.status}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


BENCHMARK_FIELDS = ("history_lengths", "full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes",
                    "linear_state_bytes", "embedding_dim", "num_heads", "batch_size", "bytes_per_element")


BENCHMARK_ITEMS = ("benchmark_fields", "benchmark_lengths", "benchmark_timings", "benchmark_memory")


def _benchmark_verdicts(context: CheckContext) -> dict[str, Verdict]:
    bench = context.answers.get("DECODE_BENCHMARK")
    names = BENCHMARK_ITEMS
    missing = _missing_answer(context, "DECODE_BENCHMARK", bench)
    if missing:
        return {n: Verdict("failed", missing) for n in names}
    absent = [f for f in BENCHMARK_FIELDS if f not in bench]
    lists = ("history_lengths", "full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes",
             "linear_state_bytes")
    lengths = bench.get("history_lengths")
    bad_lists = [f for f in lists if f in bench and (not isinstance(bench[f], list) or not isinstance(
        lengths, list) or len(bench[f]) != len(lengths) or not all(_is_number(v) for v in bench[f]))]
    verdicts = {}
    if absent or bad_lists:
        reason = (f"missing fields {absent}" if absent else "") + (
            f"{'; ' if absent else ''}fields {bad_lists} must be lists of numbers, one per history length"
            if bad_lists else "")
        verdicts["benchmark_fields"] = Verdict("failed", f"DECODE_BENCHMARK: {reason}")
        return {**{n: Verdict("failed", "DECODE_BENCHMARK is incomplete (see benchmark_fields)") for n in names},
                **verdicts}
    verdicts["benchmark_fields"] = Verdict("passed", "all required fields are present")
    if len(lengths) >= 4 and min(lengths) > 0 and max(lengths) >= 16 * min(lengths):
        verdicts["benchmark_lengths"] = Verdict("passed", f"{len(lengths)} lengths from {min(lengths)} to "
                                                          f"{max(lengths)}")
    else:
        verdicts["benchmark_lengths"] = Verdict("failed", f"history_lengths {lengths}: use at least 4 lengths "
                                                          "spanning at least 16x (e.g. 64 to 1024)")
    # The timings are a measurement of the notebook's run, which the grader does not observe:
    # they count only where they agree with the run of the same sweep the probe observed.
    verdicts["benchmark_timings"] = observed_timings(context, bench)
    verdicts["benchmark_memory"] = _benchmark_memory(bench)
    return verdicts


def _benchmark_memory(bench: dict[str, Any]) -> Verdict:
    """The bytes of the KV cache and of (S, z) at each length, from the benchmark's own sizes:
    integer arithmetic, compared exactly."""
    sizes = [bench[f] for f in ("embedding_dim", "num_heads", "batch_size", "bytes_per_element")]
    if not all(isinstance(s, int) and s > 0 for s in sizes) or sizes[0] % sizes[1]:
        return Verdict("failed", "embedding_dim, num_heads, batch_size and bytes_per_element must be "
                                 "positive integers with num_heads dividing embedding_dim")
    dim, heads, batch, width = sizes
    head_dim = dim // heads
    s_bytes, z_bytes = batch * heads * head_dim * head_dim * width, batch * heads * head_dim * width
    state = s_bytes + z_bytes
    for length, kv, lin in zip(bench["history_lengths"], bench["kv_cache_bytes"], bench["linear_state_bytes"]):
        kv_expected = 2 * batch * length * dim * width
        if kv != kv_expected:
            return Verdict("failed", f"at history length {length}, kv_cache_bytes = {kv:,.0f}; keys and values of "
                                     f"one layer take {kv_expected:,} bytes at these sizes"
                                     + (". Diagnosis: the cache counts keys or values, not both"
                                        if 2 * kv == kv_expected else ""))
        if lin != state:
            return Verdict("failed", f"at history length {length}, linear_state_bytes = {lin:,.0f}; (S, z) take "
                                     f"{state:,} bytes at these sizes, whatever the length"
                                     + (". Diagnosis: the normalizer z is left out of the state (S alone)"
                                        if lin == s_bytes else ""))
    return Verdict("passed", "KV-cache and (S, z) bytes are right for every length")
