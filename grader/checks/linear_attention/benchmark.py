"""Exercise 1's method: what the student's ``decode_step_sweep`` timed, judged from what the
probe observed (``probe_driver.case_benchmark``), never from the sizes of the times.

The probe hands the sweep layers the grader built and history lengths of its own, and records
from the grader's side of each call what ran inside every call the timer timed. Each path's
item asks that every timed call of that path is one step of its layer, with everything else
(the cache and its prefix, the state) built outside it, at every history length given, and that
the times the sweep returns are the medians it measured. The times are never judged, nor shown
in a passing message: these machines are loaded. The byte counts are ``benchmark_memory``'s
concern (the notebook's run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grader.checks import CheckContext, Verdict
from grader.checks.linear_attention.cases import BENCHMARK
from grader.checks.linear_attention.items import exercise_run

BENCHMARK_CASE = "benchmark"
METHOD_ITEMS = ("benchmark_full_step", "benchmark_linear_step")
# A returned time may differ from the median measured by rounding only.
REPORTED_RTOL = 1e-3


@dataclass(frozen=True)
class DecodePath:
    """One decode path of the sweep: the item, its step's name, the calls that belong to it."""

    item: str
    step: str                  # the one call a timed call must run
    label: str                 # how messages name that call
    own: dict[str, str]        # its other observed calls, and what running one in a timed call means
    times: str                 # the returned list of its times


FULL = DecodePath("benchmark_full_step", "decode_step", "MultiHeadAttention.decode_step",
            {"full_forward": "a full-attention forward pass over the tokens (teacher forcing, not one decode step)",
             "cache_built": "building the KV cache"},
            "full_ms_per_step")
LINEAR = DecodePath("benchmark_linear_step", "step", "LinearAttention.step",
              {"linear_forward": "a parallel forward pass over the tokens (teacher forcing, not one step)",
               "init_state": "building the state (init_state)"},
              "linear_ms_per_step")


def method_checks(context: CheckContext) -> dict[str, Any]:
    """One check per path, each decided on its own from the same observation."""
    return {path.item: (lambda path=path: judge_path(context, path)) for path in (FULL, LINEAR)}


def judge_path(context: CheckContext, path: DecodePath) -> Verdict:
    lengths = BENCHMARK["history_lengths"]
    info, decided = exercise_run(context, BENCHMARK_CASE, "decode_step_sweep",
                                 f"layers (D = {BENCHMARK['embedding_dim']}, H = {BENCHMARK['num_heads']}) and "
                                 f"history lengths {lengths}", "the sweep stopped when your {raised_in}")
    if decided:
        return decided
    measurements = info.get("measurements") or []
    mine = [(n, m) for n, m in enumerate(measurements, 1)
            if any(_belongs(call, path) for call in m["timed_calls"])]
    if not mine:
        return Verdict("failed", _nothing_timed(path, measurements))
    medians: list[tuple[int | None, float]] = []   # (history length or None, median) of each valid measurement
    for number, measurement in mine:
        for index, call in enumerate(measurement["timed_calls"], 1):
            problem = _timed_call_problem(call, path, lengths)
            if problem:
                where = f"measurement {number} (a time_median_ms call), timed call {index}"
                return Verdict("failed", f"{where} ran {problem}. Each timed call must be one {path.label} "
                                         "and nothing else: build the cache, its prefix and the state outside it")
        length = None
        if path is FULL:
            problem = _lengths_problem(measurement, lengths)
            if problem:
                return Verdict("failed", f"measurement {number} (a time_median_ms call): {problem}")
            length = measurement["timed_calls"][0]["decode_step"]["length"]
        medians.append((length, measurement["median_ms"]))
    coverage = _coverage_problem(path, medians, lengths)
    if coverage:
        return Verdict("failed", coverage)
    reported = _reported_problem(path, medians, info.get("returned", {}).get(path.times), lengths)
    if reported:
        return Verdict("failed", reported)
    what = ("with exactly T cached tokens and spare capacity, " if path is FULL else "from a state built outside it, ")
    # The times themselves stay out of the message: they are not judged, and a message is the
    # same in every run of the same code.
    return Verdict("passed", f"each timed call ran one {path.label} {what}at every history length given "
                             f"({', '.join(map(str, lengths))}), and the sweep returned the medians it measured")


def _belongs(call: dict[str, Any], path: DecodePath) -> bool:
    return any(name.removesuffix("_other") in (path.step, *path.own) for name in call["counts"])


def _nothing_timed(path: DecodePath, measurements: list[dict[str, Any]]) -> str:
    if not measurements:
        return ("nothing was timed with time_median_ms: the exercise times each step with the provided helper, whose "
                "timed calls the grader observes")
    return (f"no call timed with time_median_ms ran {path.label} on the layer the sweep was given (time the layers "
            "you are given)")


def _timed_call_problem(call: dict[str, Any], path: DecodePath, lengths: list[int]) -> str | None:
    """What a timed call of ``path`` ran besides one step of its layer, or what that step saw."""
    counts: dict[str, int] = call["counts"]
    other = (FULL if path is LINEAR else LINEAR)
    seen = call.get(path.step, {})
    from_none = path is LINEAR and seen.get("state") == "none"
    found = [said for name, said in path.own.items() if counts.get(name) and not (from_none and name == "init_state")]
    if counts.get(path.step, 0) > 1:
        found.insert(0, f"{counts[path.step]} calls of {path.label} (a prefix run inside the timed call?)")
    elif not counts.get(path.step):
        found.append(f"no {path.label} on the layer given")
    if any(counts.get(name + "_other") for name in (path.step, *path.own)):
        found.append(f"a {path.label.split('.')[0]} of its own (time the layer you are given)")
    if any(counts.get(name) or counts.get(name + "_other") for name in (other.step, *other.own)):
        found.append(f"{other.label.split('.')[0]} calls too (time each path on its own)")
    if from_none:
        found.insert(0, "one step from None: the state is built inside the timed call, and not carried from call to "
                        "call (build it outside and carry it)")
    if found:
        return "; ".join(found)
    x = seen.get("x")
    if seen.get("unreadable") or not x or len(x) != 2 or x[1] != BENCHMARK["embedding_dim"]:
        return f"one {path.label} on an input of shape {x}, not one token (B, D = {BENCHMARK['embedding_dim']})"
    if path is FULL:
        length, capacity = seen.get("length"), seen.get("capacity")
        if capacity is not None and length is not None and capacity <= length:
            return (f"one decode step on a full cache ({length} of {capacity} slots), so append reallocated it inside "
                    "the timed call: give the cache spare capacity")
    return None


def _lengths_problem(measurement: dict[str, Any], lengths: list[int]) -> str | None:
    """A full-attention measurement's timed calls must all see one of the history lengths given."""
    seen = [call.get("decode_step", {}).get("length") for call in measurement["timed_calls"]]
    if len(set(seen)) > 1:
        return (f"its timed calls saw caches of {', '.join(map(str, seen))} tokens: each call appends, so rewind "
                "cache.length to T in setup and every call sees T")
    if seen[0] not in lengths:
        return (f"it timed a cache of {seen[0]} tokens, which is none of the history lengths the sweep was given "
                f"({', '.join(map(str, lengths))}): sweep the lengths you are given")
    return None


def _coverage_problem(path: DecodePath, medians: list[tuple[int | None, float]], lengths: list[int]) -> str | None:
    if path is FULL:
        missing = [t for t in lengths if t not in {length for length, _ in medians}]
        if missing:
            return (f"no measurement timed the decode step at T = {', '.join(map(str, missing))}; the sweep was given "
                    f"the history lengths {lengths} and must time each of them")
        return None
    if len(medians) < len(lengths):
        return (f"{len(medians)} measurements of the linear step for {len(lengths)} history lengths ({lengths}): "
                "time one for each")
    return None


def _reported_problem(path: DecodePath, medians: list[tuple[int | None, float]], returned: list[float] | None,
                      lengths: list[int]) -> str | None:
    """Whether the returned times are the medians measured: each path's time at T is one of its
    medians there (between the smallest and the largest when it measured T more than once).
    A list that is not one number per length is benchmark_fields' concern, not compared here."""
    if returned is None or len(returned) != len(lengths):
        return None
    for i, (length, value) in enumerate(zip(lengths, returned)):
        if path is FULL:
            candidates = [m for t, m in medians if t == length]
        else:
            candidates = [medians[i][1]] if len(medians) == len(lengths) else [m for _, m in medians]
        low, high = min(candidates), max(candidates)
        if not (math.isfinite(value) and low * (1 - REPORTED_RTOL) <= value <= high * (1 + REPORTED_RTOL)):
            measured = f"{low:.4f}" if low == high else f"{low:.4f} to {high:.4f}"
            return (f"{path.times}[{i}] = {value:.6g} at T = {length}, but the timer measured {measured} ms there: "
                    "return the medians time_median_ms gave, in milliseconds, in the order of the history lengths")
    return None
