"""Exercise 1's method: what the student's ``decode_step_sweep`` timed, judged from what the
probe observed (``probe_driver.case_benchmark``), never from the sizes of the times.

The probe hands the sweep layers the grader built, twice: with the notebook's grading-mode
history lengths (the call the notebook's own run makes) and with lengths of its own, and records
from the grader's side of each call what ran inside every call the timer timed. Each path's
item asks, of both sweeps, that every timed call of that path is one step of its layer, with
everything else (the cache and its prefix, the state) built outside it, at every history length
given, and that the times the sweep returns are the medians it measured. The times are never
judged, nor shown in a passing message: these machines are loaded. The byte counts are
``benchmark_memory``'s concern (the notebook's run).

Work done inside a timed call but outside the observed methods (a teacher-forced prefix computed
with raw tensor operations, or through a method's original taken from the wrapper's closure) is
found by time: the grader's clock, bound before any student code ran, times each timed call and
the observed calls inside it, and a call whose median time outside them exceeds
``OUTSIDE_SHARE`` of its median time inside, plus ``OUTSIDE_SLACK_MS``, ran work the grader does
not see as a step. Limits: it is a measurement, so work far smaller than a step (a prefix of a
few tokens) passes; work moved to another thread, or into the observed method itself (the
student's own step doing more), is not charged here; and student code can still reach the
driver's closures in its process and rewrite what was recorded (``__code__`` and defaults are
refused, closure cells and dictionaries are not). Tensor operations were not counted with a
dispatch mode: its per-operation cost (about 2x a decode step's time at these sizes) would make
the observed times unlike the notebook's, which ``observed_timings`` compares.

``observed_timings`` (the ``benchmark_timings`` item, see ``answers``) holds the times the
notebook reports in DECODE_BENCHMARK to the run the grader observed at the same lengths: the
report counts only where it is within ``TIMING_FACTOR`` of the medians the grader's timer
measured, so made-up numbers, or times taken with a replaced ``time.perf_counter``, lose it.
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
# A timed call's median time outside the observed calls may be this share of its median time
# inside them, plus this many ms (the lambda, the wrapper's bookkeeping, a fresh token): a
# prefix of T tokens computed outside costs about a step's time at the shortest T and far more
# beyond, while the honest sweeps of tests/sweeps stay under a tenth of the line.
OUTSIDE_SHARE, OUTSIDE_SLACK_MS = 0.5, 0.05
# The notebook's reported times and the grader's observed ones are taken on the same machine at
# the same sizes, at other moments of its load: only an order of magnitude is a contradiction
# (as the rubric's agreement rule for the two runs says).
TIMING_FACTOR = 10.0


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
    problem = _sweep_problem(info, path, lengths, "")
    notebook_run, notebook_lengths = info.get("notebook_run"), BENCHMARK["notebook_lengths"]
    where = f"in the sweep over the notebook's history lengths ({', '.join(map(str, notebook_lengths))}), "
    if not problem and not notebook_run:
        problem = "the probe kept no record of the sweep over the notebook's history lengths"
    elif not problem and notebook_run.get("error"):
        problem = f"{where}decode_step_sweep raised {notebook_run['error']}"
    elif not problem:
        problem = _sweep_problem(notebook_run, path, notebook_lengths, where)
    if problem:
        return Verdict("failed", problem)
    what = ("with exactly T cached tokens and spare capacity, " if path is FULL else "from a state built outside it, ")
    # The times themselves stay out of the message: they are not judged, and a message is the
    # same in every run of the same code.
    return Verdict("passed", f"each timed call ran one {path.label} {what}at every history length given "
                             f"({', '.join(map(str, lengths))}, and the notebook's "
                             f"{', '.join(map(str, notebook_lengths))}), and the sweep returned the medians it "
                             "measured")


def _sweep_problem(run: dict[str, Any], path: DecodePath, lengths: list[int], where: str) -> str | None:
    """What is wrong with one sweep's timed calls of ``path`` (its measurements and returned
    lists, ``run``), each message led by ``where`` (None: nothing)."""
    measurements = run.get("measurements") or []
    mine = _measurements_of(measurements, path)
    if not mine:
        return where + _nothing_timed(path, measurements)
    for number, measurement in mine:
        said = f"{where}measurement {number} (a time_median_ms call)"
        for index, call in enumerate(measurement["timed_calls"], 1):
            problem = _timed_call_problem(call, path, lengths)
            if problem:
                return (f"{said}, timed call {index} ran {problem}. Each timed call must be one {path.label} "
                        "and nothing else: build the cache, its prefix and the state outside it")
        outside = _outside_problem(measurement, path)
        if outside:
            return f"{said}: {outside}"
        if path is FULL:
            problem = _lengths_problem(measurement, lengths)
            if problem:
                return f"{said}: {problem}"
    medians = _medians(mine, path)
    problem = (_coverage_problem(path, medians, lengths)
               or _reported_problem(path, medians, (run.get("returned") or {}).get(path.times), lengths))
    return where + problem if problem else None


def _measurements_of(measurements: list[dict[str, Any]], path: DecodePath) -> list[tuple[int, dict[str, Any]]]:
    """The measurements (numbered from 1) whose timed calls ran ``path``'s methods."""
    return [(n, m) for n, m in enumerate(measurements, 1) if any(_belongs(call, path) for call in m["timed_calls"])]


def _medians(mine: list[tuple[int, dict[str, Any]]], path: DecodePath) -> list[tuple[int | None, float]]:
    """(history length, or None for the linear path, whose calls do not show it; median) of each."""
    return [(m["timed_calls"][0].get("decode_step", {}).get("length") if path is FULL else None, m["median_ms"])
            for _, m in mine]


def _outside_problem(measurement: dict[str, Any], path: DecodePath) -> str | None:
    """Whether the timed calls spent more time outside the observed calls than the bookkeeping
    around one step takes (see the module's docstring)."""
    calls = [call for call in measurement["timed_calls"] if "ms" in call and "inside_ms" in call]
    if not calls:
        return None
    inside = _median([call["inside_ms"] for call in calls])
    outside = _median([call["ms"] - call["inside_ms"] for call in calls])
    if outside <= OUTSIDE_SHARE * inside + OUTSIDE_SLACK_MS:
        return None
    return (f"its timed calls spent a median {outside:.3f} ms outside every observed method and {inside:.3f} ms in "
            f"{path.label}: work the grader does not see as a step ran inside the timed call (a prefix computed with "
            "tensor operations, or with a method's original taken from elsewhere?). Time the step alone")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def observed_sweep(context: CheckContext) -> tuple[dict[str, dict[int, list[float]]] | None, str]:
    """The grader's observed run of the sweep at the notebook's lengths: per path (its ``times``
    key), the medians the grader's timer measured at each history length; or None and why not."""
    lengths = BENCHMARK["notebook_lengths"]
    out = context.probe.cases.get(BENCHMARK_CASE) if context.probe is not None else None
    run = out.info.get("notebook_run") if out is not None and out.status == "ok" else None
    if not run or run.get("error") or not run.get("measurements"):
        return None, ((run or {}).get("error") or (out.error if out is not None and out.status != "ok" else None)
                      or (context.probe_problem if context.probe is None
                          else "the probe did not time your decode_step_sweep"))
    found = {}
    for path in (FULL, LINEAR):
        medians = _medians(_measurements_of(run["measurements"], path), path)
        if path is LINEAR:   # the linear calls do not show T: the i-th measurement is the i-th length
            medians = list(zip(lengths, (m for _, m in medians))) if len(medians) == len(lengths) else []
        by_length: dict[int, list[float]] = {}
        for length, median in medians:
            by_length.setdefault(length, []).append(median)
        found[path.times] = by_length
    return found, ""


def observed_timings(context: CheckContext, reported: dict[str, Any]) -> Verdict:
    """Whether the times DECODE_BENCHMARK reports (``reported``, checked for shape by
    benchmark_fields) agree, within ``TIMING_FACTOR``, with the medians the grader's timer measured
    in its observed run of the sweep at the notebook's lengths, at every length both measured."""
    lengths = BENCHMARK["notebook_lengths"]
    run, why = observed_sweep(context)
    if run is None:
        return Verdict("failed", "the notebook's timings count only beside the grader's observed run of your "
                                 f"decode_step_sweep at the notebook's history lengths, which gave none: {why}")
    shared = [t for t in reported["history_lengths"] if t in lengths]
    if not shared:
        return Verdict("failed", f"DECODE_BENCHMARK['history_lengths'] = {reported['history_lengths']} shares no "
                                 f"length with the grader's observed run of your sweep ({lengths}): report the run "
                                 "the provided cell makes")
    for path in (FULL, LINEAR):
        for i, (length, value) in enumerate(zip(reported["history_lengths"], reported[path.times])):
            if length not in shared:
                continue
            measured = run[path.times].get(length)
            if not measured:
                return Verdict("failed", f"the grader's observed run of your sweep timed no {path.label} at T = "
                                         f"{length}, so DECODE_BENCHMARK['{path.times}'][{i}] has nothing to "
                                         "agree with")
            low, high = min(measured) / TIMING_FACTOR, max(measured) * TIMING_FACTOR
            if not low <= value <= high:
                return Verdict("failed", f"DECODE_BENCHMARK['{path.times}'][{i}] = {value:.6g} ms at T = {length}, "
                                         f"but the grader's observed run of your decode_step_sweep measured "
                                         f"{min(measured):.4f} ms there, more than {TIMING_FACTOR:g}x apart: report "
                                         "the times your sweep measured")
    return Verdict("passed", f"the times reported at T = {', '.join(map(str, shared))} agree within "
                             f"{TIMING_FACTOR:g}x with the grader's observed run of your sweep")


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
