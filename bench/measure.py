"""The bench's pure parts: alternated runs, medians, targets and the bench.json record.

Nothing here starts a process; ``bench/run.py`` does, and hands its timings to these.
"""
from __future__ import annotations

import json
import math
import operator
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, SHORT, NO_DATA = "ok", "short", "no data"
SCHEMA_VERSION = 1
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


def alternate(runs: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call each of ``runs`` in turn, ``repeats`` rounds (A B A B ...), so that a machine whose
    load drifts during the bench weighs on every side alike; each run returns its seconds."""
    if repeats < 1:
        raise ValueError("at least one round")
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(float(run()))
    return samples


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values (a figure that could not be measured)."""
    return float(statistics.median(values)) if values else math.nan


@dataclass(frozen=True)
class Target:
    """What a figure must be: ``value <op> threshold`` (``gate`` False: a goal, printed alike)."""

    op: str
    threshold: float
    gate: bool = True

    def __post_init__(self) -> None:
        if self.op not in _OPERATORS:
            raise ValueError(f"unknown comparison {self.op!r}")

    def status(self, value: float) -> str:
        """``ok`` when met, ``short`` when not, ``no data`` when there is no value."""
        if value is None or math.isnan(value):
            return NO_DATA
        return OK if _OPERATORS[self.op](value, self.threshold) else SHORT


@dataclass
class Figure:
    """One printed line of the bench: a measured value against its target."""

    name: str
    value: float
    unit: str
    target: Target
    means: str                                            # what the figure is, in words
    samples: dict[str, list[float]] = field(default_factory=dict)   # the runs it was computed from
    notes: list[str] = field(default_factory=list)
    why: str = ""   # the measured reason a figure short of its target is short (printed only then)

    @property
    def status(self) -> str:
        return self.target.status(self.value)

    def line(self) -> str:
        value = "n/a" if math.isnan(self.value) else f"{self.value:.3g}"
        goal = "" if self.target.gate else " (a goal)"
        notes = "".join(f"; {n}" for n in self.notes)
        why = f"\n    why: {self.why}" if self.status == SHORT and self.why else ""
        return (f"{self.name}: {value} {self.unit}  target {self.target.op} {self.target.threshold:g} {self.unit}"
                f"{goal}  {self.status}{notes}{why}")

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "value": None if math.isnan(self.value) else self.value, "unit": self.unit,
                "target": asdict(self.target), "status": self.status, "means": self.means,
                "samples": self.samples, "notes": self.notes, "why": self.why if self.status == SHORT else ""}


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """median(numerator) / median(denominator)."""
    bottom = median(denominator)
    return median(numerator) / bottom if bottom else math.nan


def slope_ms(small: Sequence[float], large: Sequence[float], small_n: int, large_n: int) -> float:
    """Milliseconds per submission between two set sizes: (median(large) - median(small)) / (large_n - small_n)."""
    return 1000 * (median(large) - median(small)) / (large_n - small_n)


def stage_medians(runs: Sequence[Sequence[Sequence[Any]]]) -> list[tuple[str, float]]:
    """The median seconds of each stage over ``runs`` (each a results.json ``timings.stages``
    list of [name, seconds]), in the order stages first appear; a stage counts only in the runs
    that have it."""
    seen: dict[str, list[float]] = {}
    for stages in runs:
        for name, seconds in stages:
            seen.setdefault(str(name), []).append(float(seconds))
    return [(name, median(values)) for name, values in seen.items()]


def critical_path(stages: Sequence[tuple[str, float]], grade_s: float) -> str:
    """Where one submission's ``grade_s`` seconds went, from its stage medians (``stage_medians``):
    the notebook run and the probe run side by side, so the longer is the submission's critical
    path; the checks and the rest follow; the command around them (its start, the worker's start,
    the pages, the shutdown) is what is left."""
    seconds = dict(stages)
    notebook = sum(s for name, s in stages if name in ("sandbox_start", "kernel_start") or name.startswith("code cell"))
    probe = seconds.get("probe_start", 0.0) + seconds.get("probe_cases", 0.0)
    after = sum(seconds.get(name, 0.0) for name in ("checks", "written", "report"))
    submission = max(notebook, probe) + after
    longer = (f"the probe {probe:.2f} s (start {seconds.get('probe_start', 0.0):.2f} s, cases "
              f"{seconds.get('probe_cases', 0.0):.2f} s) beside the notebook {notebook:.2f} s"
              if probe > notebook else f"the notebook {notebook:.2f} s beside the probe {probe:.2f} s")
    return (f"the submission {submission:.2f} s: {longer}, then {after:.2f} s of checks and reports; "
            f"the command around it {grade_s - submission:.2f} s (its start, the worker's, pages, shutdown)")


def cores_busy(cpu_s: float, wall_s: float) -> float:
    """How many cores a run kept busy on average: its CPU seconds over its wall seconds."""
    return cpu_s / wall_s if wall_s > 0 else math.nan


REQUIRED = {"schema": int, "quick": bool, "started": str, "wall_s": (int, float), "figures": list,
            "stages": dict, "leftover_processes": list, "problems": list}
FIGURE_FIELDS = {"name": str, "unit": str, "target": dict, "status": str, "means": str, "samples": dict,
                 "notes": list}


def bench_record(figures: Sequence[Figure], *, quick: bool, started: str, wall_s: float,
                 stages: Mapping[str, list[tuple[str, float]]], leftover: Sequence[str],
                 problems: Sequence[str]) -> dict[str, Any]:
    """Everything the bench printed, as bench.json holds it."""
    return {"schema": SCHEMA_VERSION, "quick": quick, "started": started, "wall_s": wall_s,
            "figures": [f.record() for f in figures],
            "stages": {name: [[stage, seconds] for stage, seconds in found] for name, found in stages.items()},
            "leftover_processes": list(leftover), "problems": list(problems)}


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """isinstance, except that a bool is no number (JSON tells them apart)."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def check_record(record: Any) -> list[str]:
    """What is wrong with a bench.json record (empty when it is one)."""
    if not isinstance(record, dict):
        return ["not an object"]
    wrong = [f"{key}: missing or of the wrong type" for key, kind in REQUIRED.items() if not _is(record.get(key), kind)]
    for index, figure in enumerate(record.get("figures") or []):
        if not isinstance(figure, dict):
            wrong.append(f"figures[{index}]: not an object")
            continue
        wrong += [f"figures[{index}].{key}: missing or not {kind.__name__}" for key, kind in FIGURE_FIELDS.items()
                  if not isinstance(figure.get(key), kind)]
        if not (figure.get("value") is None or isinstance(figure.get("value"), (int, float))):
            wrong.append(f"figures[{index}].value: not a number or null")
        if figure.get("status") not in (OK, SHORT, NO_DATA):
            wrong.append(f"figures[{index}].status: {figure.get('status')!r}")
    return wrong


def write_record(record: dict[str, Any], path: Path) -> None:
    """Write bench.json, refusing a record that does not check (a bench bug, not a result)."""
    wrong = check_record(record)
    if wrong:
        raise ValueError(f"bench.json record is malformed: {'; '.join(wrong)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
