"""``make bench``: what grading costs against the floor, otter-grader, scale and memory.

    python bench/run.py [--quick]

Every figure is measured side by side in this one run: the runs it compares alternate
(A B A B ...), and it is the median of ``--repeats`` rounds (3; ``--quick``: 1 round on smaller
sets, a few minutes, for development). Each line prints the figure, its target and ``ok`` or
``short``; all of it goes to ``out/bench/bench.json`` (``bench.measure``). What is timed is the
wall time of whole commands, interpreter start, imports and pages included:

- the floor: ``bench/floor.py`` (nbclient executing the notebook, kernel start included) under
  the grader's grading environment (``grader.execute.GRADING_ENV``), no sandbox, no probe;
- ``grader grade`` (through ``bench/coordinator.py``, which is the ``grader`` entry point plus
  the coordinator's peak RSS), sandbox on, ``--llm off``, into a fresh output folder unless the
  figure is a regrade;
- ``otter run`` of otter-grader 7.0.0, from its own venv (``out/bench/otter-venv``, made on the
  first run: the one step that needs the package registry; never a dependency of the grader).

Nothing it starts outlives it: at the end it lists every process that carries its run marker in
its environment, or descends from one, stops those by pid and reports them (none is expected).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # run as a script: this checkout's grader and bench, not an installed copy

from bench.coordinator import PEAK_LINE  # noqa: E402
from bench.measure import (Figure, Target, alternate, bench_record, cores_busy, critical_path,  # noqa: E402
                           median, ratio, slope_ms, stage_medians, write_record)
from grader.assignment import Assignment  # noqa: E402
from grader.execute import GRADING_ENV  # noqa: E402
from grader.load import load_submission  # noqa: E402
from grader.pipeline import SubmissionGrader  # noqa: E402
from grader.sandbox.factory import make_sandbox  # noqa: E402
from grader.sandbox.limits import MemoryShare  # noqa: E402
from grader.harness.cpu_time import AFTER_HUNG_S  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402

OUT = REPO / "out" / "bench"
WORK = OUT / "work"
RECORD = OUT / "bench.json"
OTTER_VENV = OUT / "otter-venv"
OTTER_VERSION = "7.0.0"
BENCH_ROOT = REPO / "bench"               # the small assignment's root (--assignment-root)
SMALL = "small_questions"
OTTER_MASTER = BENCH_ROOT / "otter" / f"{SMALL}.ipynb"
MARKER = "G2C_BENCH_RUN"                  # in the environment of everything the bench starts
# Per assignment: how its grading is held against its floor ("ratio": grade / floor; "over":
# grade - floor, in seconds) and the target.
PER_SUBMISSION = {"linear_attention": ("ratio", 1.3), "linear_attention_hyena": ("over", 3.0)}
CLASS_ASSIGNMENT = "linear_attention_hyena"   # the cheap one: the class and the regrade sets
SIMILARITY_CLASS = 200
TOLERANCE_EDIT = ("isotropy_mean", ("0.051", "0.052"))   # a check-only change: verdicts stay the same
# The sleeping submission: the class's reference with this function asleep (no CPU) when called.
SLEEPING_FUNCTION = "retnet_decay_mask"
UNCHANGED = re.compile(r"(\d+) of (\d+) submissions already graded \(unchanged\)")
REGRADED = re.compile(r"(\d+) submissions regraded from their kept runs")


@dataclass(frozen=True)
class Sizes:
    repeats: int
    class_size: int   # the synthetic class, and the small regrade set
    large_set: int    # the large regrade set


FULL, QUICK = Sizes(3, 20, 60), Sizes(1, 4, 12)


class BenchError(Exception):
    """A command the bench runs failed: its figure has no data, the bench goes on."""


@dataclass
class Graded:
    seconds: float
    stderr: str
    out: Path
    peak_kib: int | None
    cpu: float   # the machine's busy CPU seconds while the command ran (_busy_cpu)


@dataclass
class Bench:
    sizes: Sizes
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    figures: list[Figure] = field(default_factory=list)
    stages: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)   # every grading output folder, for the memory figure
    _fresh: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)

    # ------------------------------------------------------------------ running things

    @property
    def env(self) -> dict[str, str]:
        """This checkout's grader first on the path, and the run marker."""
        path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        return {**os.environ, "PYTHONPATH": path, MARKER: self.marker}

    def timed(self, command: Sequence[str | Path], env: dict[str, str], what: str,
              cwd: Path | None = None) -> tuple[float, str, float]:
        """Run ``command`` to its end; its wall seconds, stderr and CPU seconds (``_busy_cpu``:
        the machine's while it ran; ``floors`` runs several at once and reads their sum).
        Raises BenchError when it fails."""
        cpu_before = _busy_cpu()
        started = time.perf_counter()
        done = subprocess.run([str(c) for c in command], env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=cwd)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            tail = " | ".join([line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-3:])
            raise BenchError(f"{what} exited with {done.returncode}: {tail}")
        return seconds, done.stderr, _busy_cpu() - cpu_before

    def floor(self, notebook: Path) -> float:
        env = {**self.env, **GRADING_ENV}
        return self.timed([sys.executable, BENCH_ROOT / "floor.py", notebook], env, f"the floor of {notebook.name}")[0]

    def floors(self, notebooks: Sequence[Path], at_a_time: int, cpu: list[float] | None = None) -> float:
        """Wall seconds of the floor of every notebook, ``at_a_time`` running at once (their CPU
        seconds together appended to ``cpu``)."""
        cpu_before = _busy_cpu()
        started = time.perf_counter()
        with ThreadPoolExecutor(at_a_time) as pool:
            list(pool.map(self.floor, notebooks))
        if cpu is not None:
            cpu.append(_busy_cpu() - cpu_before)
        return time.perf_counter() - started

    def grade(self, paths: Sequence[Path], assignment: str, workers: int, out: Path | None = None,
              root: Path | None = None) -> Graded:
        """``grader grade`` into ``out`` as it is (a regrade), or into a fresh folder."""
        if out is None:
            out = WORK / "graded" / f"{assignment}-{self._fresh()}"
            shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, BENCH_ROOT / "coordinator.py", "grade", *paths, "--assignment", assignment,
                   "--out", out, "--llm", "off", "--workers", str(workers),
                   *(["--assignment-root", root] if root else [])]
        seconds, stderr, cpu = self.timed(command, self.env, f"grader grade of {assignment} ({len(paths)} paths)")
        found = re.findall(rf"^{re.escape(PEAK_LINE)} (\d+)$", stderr, re.MULTILINE)
        if out not in self.outputs:
            self.outputs.append(out)
        return Graded(seconds, stderr, out, int(found[-1]) if found else None, cpu)

    def figure(self, figure: Figure) -> None:
        self.figures.append(figure)
        print(figure.line(), flush=True)

    def section(self, title: str, run: Callable[[], None]) -> None:
        """One part of the bench; a failed command costs its figures only."""
        print(f"\n== {title}", flush=True)
        try:
            run()
        except BenchError as exc:
            self.problems.append(f"{title}: {exc}")
            print(f"{title}: could not be measured: {exc}", flush=True)

    # ------------------------------------------------------------------ the figures

    def per_submission(self) -> None:
        """Each reference notebook: its floor, and one sandboxed ``grader grade`` against it."""
        for name, (kind, target) in PER_SUBMISSION.items():
            folder = WORK / "one" / name
            folder.mkdir(parents=True, exist_ok=True)
            notebook = folder / "reference.ipynb"
            shutil.copy(REPO / "solutions" / name / f"{name}.ipynb", notebook)
            runs: list[Graded] = []

            def graded() -> float:
                runs.append(self.grade([folder], name, workers=1))
                return runs[-1].seconds

            samples = alternate({"floor": lambda: self.floor(notebook), "grade": graded}, self.sizes.repeats)
            self.figure(Figure(f"floor of {name}", median(samples["floor"]), "s", Target("<=", 8.0),
                               "nbclient executing the reference notebook in grading mode, kernel start included",
                               {"floor": samples["floor"]}))
            notes = [f"grade {median(samples['grade']):.3g} s, floor {median(samples['floor']):.3g} s"]
            if kind == "ratio":
                value, unit, means = ratio(samples["grade"], samples["floor"]), "x", "grader grade / the floor"
            else:
                value = median(samples["grade"]) - median(samples["floor"])
                unit, means = "s", "grader grade - the floor, seconds"
                notes.append(f"{ratio(samples['grade'], samples['floor']):.3g}x")
            self.print_stages(name, [r.out / "reference" for r in runs])
            why = critical_path(self.stages[name], median(samples["grade"])) if name in self.stages else ""
            self.figure(Figure(f"{name}: one submission vs the floor", value, unit, Target("<=", target),
                               f"{means} (one-notebook folder, sandbox on, --llm off, 1 worker)", samples, notes,
                               why))

    def print_stages(self, name: str, folders: Sequence[Path]) -> None:
        """Where one submission's time goes: the median of each stage of its results' timings."""
        recorded = [t["stages"] for t in map(_timings, folders) if t and isinstance(t.get("stages"), list)]
        if not recorded:
            print(f"{name}: where the time goes: no timings recorded (results.json has no extra_data.timings)")
            return
        self.stages[name] = stage_medians(recorded)
        print(f"{name}: where the time goes (median over {len(recorded)} runs, results.json extra_data.timings):")
        for stage, seconds in self.stages[name]:
            print(f"    {seconds:7.2f} s  {stage}")

    def probe_costs(self) -> None:
        """Where the probe's time goes, for each reference: per kind of case, how many ran, the
        supervisor's wall seconds for them and the workers it forked (``ProbeResult.costs``)."""
        for name in PER_SUBMISSION:
            assignment = Assignment(name)
            notebook = REPO / "solutions" / name / f"{name}.ipynb"
            submission = load_submission(notebook, "reference", assignment.template, 50 * 2**20)
            grader = SubmissionGrader(assignment, make_sandbox(assignment.rubric.limits, allow_unsandboxed=False))
            notes: list[str] = []
            probe, problem = grader.probe(submission, MemoryShare(), notes)
            if probe is None:
                raise BenchError(f"{name}: the probe could not run: {problem}")
            kinds = probe.costs_by_kind(grader.probe_cases())
            forks = sum(cost.forks for cost in probe.costs.values())
            found = [(f"{kind}: {count} cases, {cost.forks} workers", round(cost.seconds, 3))
                     for kind, (count, cost) in sorted(kinds.items(), key=lambda k: -k[1][1].seconds)]
            self.stages[f"{name} probe"] = [("probe_start", round(probe.start_seconds, 3)),
                                            ("import", probe.costs["import"].seconds), *found]
            print(f"{name}: the probe, {probe.start_seconds:.2f} s to start and {probe.cases_seconds:.2f} s of "
                  f"cases, {forks} workers forked ({1000 * probe.cases_seconds / max(forks, 1):.0f} ms each on "
                  f"average){'; ' + '; '.join(notes) if notes else ''}")
            for stage, seconds in self.stages[f"{name} probe"]:
                print(f"    {seconds:7.2f} s  {stage}")

    def against_otter(self) -> None:
        """The small assignment graded by ``otter run`` and by ``grader grade``, alternated."""
        otter = _otter_venv()
        dist = WORK / "otter" / "dist"
        shutil.rmtree(dist.parent, ignore_errors=True)
        dist.parent.mkdir(parents=True)
        otter_env = {k: v for k, v in self.env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        otter_env["PATH"] = os.pathsep.join([str(otter.parent), otter_env.get("PATH", "")])
        self.timed([otter, "assign", OTTER_MASTER, dist], otter_env, "otter assign", cwd=dist.parent)
        autograder = next((dist / "autograder").glob("*.zip"))
        submission = dist / "autograder" / f"{SMALL}.ipynb"   # otter's solution notebook, tests stripped
        folder = WORK / "small"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(BENCH_ROOT / "solutions" / SMALL / f"{SMALL}.ipynb", folder / f"{SMALL}.ipynb")
        otter_scores: list[float] = []
        otter_cpu: list[float] = []
        ours: list[Graded] = []

        def otter_run() -> float:
            results = WORK / "otter" / f"run-{self._fresh()}"
            results.mkdir(parents=True)
            seconds, _, cpu = self.timed([otter, "run", "--no-logo", "-a", autograder, "-o", results, submission],
                                         otter_env, "otter run")
            otter_cpu.append(cpu)
            tests = json.loads((results / "results.json").read_text())["tests"]
            otter_scores.append(sum(t.get("score") or 0 for t in tests))
            return seconds

        def grader_run() -> float:
            ours.append(self.grade([folder], SMALL, workers=1, root=BENCH_ROOT))
            return ours[-1].seconds

        samples = alternate({"otter run": otter_run, "grader grade": grader_run}, self.sizes.repeats)
        scores = [_score(g.out / SMALL) for g in ours]
        notes = [f"otter run {median(samples['otter run']):.3g} s, grader grade {median(samples['grader grade']):.3g} s",
                 f"scores: otter {sorted(set(otter_scores))} of 6, grader {sorted(set(scores))} of 7"]
        if set(otter_scores) != {6} or set(scores) != {7}:
            self.problems.append(f"the small notebook did not get full marks: {notes[-1]}")
        self.figure(Figure("small notebook: otter run / grader grade", ratio(samples["otter run"], samples["grader grade"]),
                           "x", Target(">=", 3.0, gate=False),
                           "how many times faster grader grade (sandbox on) grades the same three questions than otter run",
                           samples, notes,
                           f"CPU seconds: grader grade {median([g.cpu for g in ours]):.2f} (the notebook and the probe of "
                           f"its tests, each in a sandbox), otter run {median(otter_cpu):.2f} (the notebook and its tests "
                           "in one process)"))

    def sleeping_submission(self) -> None:
        """The class's reference and the same notebook with one function that sleeps, each graded
        alone on 1 worker, one round each (what the sleeper costs is its idle limits): the
        difference is bounded by the idle limit, not by the wall-clock backstops."""
        idle = load_rubric(REPO / "rubrics" / f"{CLASS_ASSIGNMENT}.yaml").limits.idle_timeout_s
        normal_folder, asleep_folder = WORK / "sleeping" / "normal", WORK / "sleeping" / "asleep"
        for folder in (normal_folder, asleep_folder):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        shutil.copy(REPO / "solutions" / CLASS_ASSIGNMENT / f"{CLASS_ASSIGNMENT}.ipynb", normal_folder / "normal.ipynb")
        nbformat.write(_sleeping_notebook(), str(asleep_folder / "asleep.ipynb"))
        normal = self.grade([normal_folder], CLASS_ASSIGNMENT, workers=1)
        asleep = self.grade([asleep_folder], CLASS_ASSIGNMENT, workers=1)
        retried = "graded again once" in (asleep.out / "asleep" / "results.json").read_text()
        if retried:
            self.problems.append("the sleeping submission was graded again after a backstop")
        # The first cell and the first probe case that call it wait out the idle limit (the two
        # stages run side by side), every later one cpu_time.AFTER_HUNG_S: issue 48's bound is
        # twice a normal submission's time plus one idle limit.
        self.figure(Figure(f"{CLASS_ASSIGNMENT}: a submission that sleeps, past twice a normal one",
                           asleep.seconds - 2 * normal.seconds, "s", Target("<=", idle),
                           f"grader grade of the reference with {SLEEPING_FUNCTION} asleep, minus twice the "
                           f"reference's (1 worker each; idle limit {idle:g} s, then {AFTER_HUNG_S:g} s)",
                           {"normal": [normal.seconds], "asleep": [asleep.seconds]},
                           [f"sleeping {asleep.seconds:.3g} s, normal {normal.seconds:.3g} s",
                            "graded again" if retried else "not graded again"]))

    def throughput(self) -> None:
        """A synthetic class on 1 and 2 workers against its floor two at a time; then the
        regrades (unchanged, and after a check-only change) at two set sizes; then memory."""
        size, large = self.sizes.class_size, self.sizes.large_set
        small_subs = _synthetic_class(WORK / "sets" / "small-submissions", size, 0)
        large_subs = _synthetic_class(WORK / "sets" / "large-submissions", large, size)
        small_out, large_out = WORK / "sets" / "small", WORK / "sets" / "large"
        two_worker: list[Graded] = []
        one_worker: list[Graded] = []
        floor_cpu: list[float] = []

        def two_workers() -> float:
            shutil.rmtree(small_out, ignore_errors=True)
            two_worker.append(self.grade([small_subs], CLASS_ASSIGNMENT, workers=2, out=small_out))
            return two_worker[-1].seconds

        def one() -> float:
            one_worker.append(self.grade([small_subs], CLASS_ASSIGNMENT, workers=1))
            return one_worker[-1].seconds

        notebooks = sorted(small_subs.glob("*.ipynb"))
        samples = alternate({"floor, 2 at a time": lambda: self.floors(notebooks, 2, floor_cpu),
                             "grade, 1 worker": one, "grade, 2 workers": two_workers}, self.sizes.repeats)
        cores = os.cpu_count() or 1
        busy_one = median([cores_busy(g.cpu, g.seconds) for g in one_worker])
        busy_two = median([cores_busy(g.cpu, g.seconds) for g in two_worker])
        grade_cpu = median([g.cpu for g in two_worker]) / size
        self.figure(Figure(f"class of {size} on 2 workers / its floor 2 at a time",
                           ratio(samples["grade, 2 workers"], samples["floor, 2 at a time"]), "x", Target("<=", 1.3),
                           f"{CLASS_ASSIGNMENT}: {size} distinct submissions graded with --workers 2, against the "
                           "floor of the same notebooks run two at a time", samples,
                           [f"grade {median(samples['grade, 2 workers']):.3g} s, "
                            f"floor {median(samples['floor, 2 at a time']):.3g} s"],
                           f"CPU seconds per submission: grading {grade_cpu:.2f}, the floor {median(floor_cpu) / size:.2f}"
                           f"; 2 workers kept {busy_two:.2f} of {cores} cores busy"))
        self.figure(Figure("2 workers vs 1 (speed-up)", ratio(samples["grade, 1 worker"], samples["grade, 2 workers"]),
                           "x", Target(">=", 1.8), "wall with --workers 1 / wall with --workers 2, same class",
                           samples, [f"1 worker {median(samples['grade, 1 worker']):.3g} s"],
                           f"1 worker already kept {busy_one:.2f} of {cores} cores busy (each submission's notebook and "
                           f"probe run side by side), so a second can add at most {cores / busy_one:.2f}x; "
                           f"2 workers kept {busy_two:.2f} busy"))

        shutil.rmtree(large_out, ignore_errors=True)
        graded_large = self.grade([large_subs], CLASS_ASSIGNMENT, workers=2, out=large_out)
        sets = {"small": (small_subs, small_out, size), "large": (large_subs, large_out, large)}
        self.unchanged_regrade(sets)
        self.check_only_regrade(sets)
        self.memory(two_worker[-1], graded_large)

    def unchanged_regrade(self, sets: dict[str, tuple[Path, Path, int]]) -> None:
        def regrade(which: str) -> float:
            subs, out, n = sets[which]
            graded = self.grade([subs], CLASS_ASSIGNMENT, workers=2, out=out)
            found = UNCHANGED.search(graded.stderr)
            if not found or int(found.group(1)) != n:
                self.problems.append(f"the unchanged regrade of {n} did not reuse all {n}: "
                                     f"{found.group(0) if found else 'no reuse line'}")
            return graded.seconds

        # A second each: 3 rounds even in --quick, where one pair of runs was mostly noise.
        samples = alternate({"small": lambda: regrade("small"), "large": lambda: regrade("large")},
                            max(self.sizes.repeats, 3))
        small_n, large_n = sets["small"][2], sets["large"][2]
        self.figure(Figure(f"unchanged regrade, per submission ({small_n} -> {large_n})",
                           slope_ms(samples["small"], samples["large"], small_n, large_n), "ms", Target("<", 10.0),
                           "(wall at the large set - wall at the small set) / their difference; everything cached",
                           samples, [f"wall {median(samples['small']):.3g} s at {small_n}, "
                                     f"{median(samples['large']):.3g} s at {large_n}"]))

    def check_only_regrade(self, sets: dict[str, tuple[Path, Path, int]]) -> None:
        """Regrades under copies of the assignment whose rubric differs by one tolerance (two
        copies, used in turn, so that every round is a change): verdicts recomputed from the kept
        raw outputs, nothing executed."""
        roots = [_edited_root(WORK / "roots" / f"tolerance-{value}", value) for value in TOLERANCE_EDIT[1]]
        order = itertools.cycle(roots)
        current: list[Path] = []
        executed: list[int] = []

        def regrade(which: str) -> float:
            if which == "small":
                current[:] = [next(order)]
            subs, out, n = sets[which]
            before = {p.parent.name: _digests(p.parent) for p in out.glob("*/results.json")}
            graded = self.grade([subs], CLASS_ASSIGNMENT, workers=2, out=out, root=current[0])
            found = REGRADED.search(graded.stderr)
            after = {name: _digests(out / name) for name in before}
            ran = sum(1 for name in before if after[name].get("execution") != before[name].get("execution"))
            kept = int(found.group(1)) if found else 0
            executed.append(max(ran, n - kept))
            return graded.seconds

        samples = alternate({"small": lambda: regrade("small"), "large": lambda: regrade("large")}, self.sizes.repeats)
        small_n, large_n = sets["small"][2], sets["large"][2]
        self.figure(Figure(f"regrade after a check-only change, per submission ({small_n} -> {large_n})",
                           slope_ms(samples["small"], samples["large"], small_n, large_n), "ms", Target("<", 100.0),
                           f"the rubric's {TOLERANCE_EDIT[0]} tolerance changed in a copy of the assignment "
                           "(--assignment-root): verdicts recomputed from kept raw outputs", samples,
                           [f"wall {median(samples['small']):.3g} s at {small_n}, "
                            f"{median(samples['large']):.3g} s at {large_n}"]))
        self.figure(Figure("submissions executed by the check-only regrades", float(sum(executed)), "submissions",
                           Target("<=", 0), "not regraded from their kept runs ('regraded from their kept runs' "
                           "line), or whose execution digest changed", {"executed": [float(e) for e in executed]}))

    def memory(self, at_small: Graded, at_large: Graded) -> None:
        peaks = [float(t["peak_memory_mib"]) for t in (_timings(p.parent) for out in self.outputs
                                                        for p in out.glob("*/results.json"))
                 if t and isinstance(t.get("peak_memory_mib"), (int, float))]
        self.figure(Figure("peak memory of one submission (largest seen)", max(peaks) if peaks else float("nan"),
                           "MiB", Target("<", 2048.0),
                           "PSS summed over a submission's processes plus its tmpfs (results.json extra_data.timings)",
                           {"peak_memory_mib": peaks}, [] if peaks else ["no timings recorded"]))
        small_n, large_n = self.sizes.class_size, self.sizes.large_set
        values = [g.peak_kib / 1024 if g.peak_kib is not None else float("nan") for g in (at_small, at_large)]
        self.figure(Figure(f"coordinator peak RSS at {large_n} - at {small_n}", values[1] - values[0], "MiB",
                           Target("<=", 50.0), "ru_maxrss of the grading process alone, 2 workers",
                           {"at_small": [values[0]], "at_large": [values[1]]},
                           [f"{values[0]:.0f} MiB at {small_n}, {values[1]:.0f} MiB at {large_n}"]))

    def similarity(self) -> None:
        """The similarity stage on a synthetic class of ``SIMILARITY_CLASS`` (in process: it reads no sandbox)."""
        from grader import similarity
        from grader.assignment import Assignment

        sources = similarity_class(SIMILARITY_CLASS)
        boilerplate = similarity.Boilerplate.of(Assignment("linear_attention"))
        samples, cpu = [], []
        for _ in range(self.sizes.repeats):
            started, used = time.perf_counter(), time.process_time()
            pairs = similarity.compare(sources, boilerplate)
            samples.append(time.perf_counter() - started)
            cpu.append(time.process_time() - used)
        self.figure(Figure(f"similarity across a class of {SIMILARITY_CLASS}", median(samples), "s", Target("<=", 5.0),
                           "similarity.compare on the synthetic class: code and written answers, every pair",
                           {"compare": samples, "cpu": cpu},
                           [f"{median(cpu):.1f} s of CPU", f"{len(pairs)} pairs reported, {sum(p.flagged for p in pairs)} flagged"]))

    # ------------------------------------------------------------------ the end

    def leftovers(self) -> list[str]:
        """Processes still running that the bench started (its marker, or a descendant of one):
        stopped by pid, and listed."""
        found = _marked_processes(self.marker)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return [f"{pid} {command}" for pid, command in found.items()]


# ---------------------------------------------------------------------- helpers

def _busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy since it started (/proc/stat: user, nice,
    system, irq, softirq, steal). A command's processes in a sandbox's PID namespace are not
    all reaped by an ancestor (their rusage can be lost), so a command's CPU is read as the
    machine's over its run: the bench runs one command at a time on a quiet machine."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _, _, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _timings(folder: Path) -> dict | None:
    """``extra_data.timings`` of the result in ``folder``, if it has one."""
    try:
        timings = json.loads((folder / "results.json").read_text()).get("extra_data", {}).get("timings")
    except (OSError, ValueError):
        return None
    return timings if isinstance(timings, dict) else None


def _digests(folder: Path) -> dict:
    try:
        return json.loads((folder / "results.json").read_text()).get("extra_data", {}).get("digests") or {}
    except (OSError, ValueError):
        return {}


def _score(folder: Path) -> float:
    try:
        return float(json.loads((folder / "results.json").read_text())["score"])
    except (OSError, ValueError, KeyError):
        return float("nan")


def _synthetic_class(folder: Path, size: int, first: int) -> Path:
    """``size`` submissions of the class's reference notebook, each with its own bytes: a comment
    naming it at the end of its last code cell (harmless: every item scores as the reference's)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    master = nbformat.read(REPO / "solutions" / CLASS_ASSIGNMENT / f"{CLASS_ASSIGNMENT}.ipynb", as_version=4)
    last = max(i for i, c in enumerate(master.cells) if c.cell_type == "code")
    for k in range(first, first + size):
        notebook = nbformat.from_dict(json.loads(json.dumps(master)))
        notebook.cells[last].source += f"\n# bench submission {k}"
        nbformat.write(notebook, str(folder / f"student{k:03d}.ipynb"))
    return folder


def similarity_class(size: int) -> list:
    """``size`` submissions as the similarity stage reads them: each one of tests/scaffolds' correct
    styles of linear_attention's scaffold (so a few share each, as copies would), and for every
    question four sentences drawn (seeded) from all the master's answers, so that some overlap."""
    from grader import similarity
    from grader.assignment import Assignment

    styles = [p.read_text() for p in sorted((REPO / "tests" / "scaffolds").glob("correct_*.py"))]
    questions = Assignment("linear_attention").reference_answers
    said = [s for a in questions.values() for s in re.split(r"(?<=\.) ", a.answer)]
    draw = random.Random(45)
    return [similarity.Source(f"student{k:03d}", styles[k % len(styles)],
                              {q: " ".join(draw.sample(said, 4)) for q in questions}) for k in range(size)]


def _sleeping_notebook() -> nbformat.NotebookNode:
    """The class's reference whose ``SLEEPING_FUNCTION`` sleeps for an hour when called."""
    master = nbformat.read(REPO / "solutions" / CLASS_ASSIGNMENT / f"{CLASS_ASSIGNMENT}.ipynb", as_version=4)
    cell = next(c for c in master.cells if f"def {SLEEPING_FUNCTION}(" in c.source)
    cell.source += f"\n\n\ndef {SLEEPING_FUNCTION}(*args, **kwargs):\n    import time\n    time.sleep(3600)\n"
    return master


def _edited_root(root: Path, value: str) -> Path:
    """A copy of the class assignment (master, template, rubric) whose rubric sets the
    ``TOLERANCE_EDIT`` tolerance to ``value``: what runs is unchanged, so only evaluation is."""
    shutil.rmtree(root, ignore_errors=True)
    for part in ("solutions", "assignments"):
        shutil.copytree(REPO / part / CLASS_ASSIGNMENT, root / part / CLASS_ASSIGNMENT)
    rubric = (REPO / "rubrics" / f"{CLASS_ASSIGNMENT}.yaml").read_text()
    edited, count = re.subn(rf"^(\s*{TOLERANCE_EDIT[0]}:\s*)[0-9.e+-]+", rf"\g<1>{value}", rubric, flags=re.MULTILINE)
    if count != 1:
        raise BenchError(f"the rubric has no single {TOLERANCE_EDIT[0]} tolerance to change")
    (root / "rubrics").mkdir(parents=True)
    (root / "rubrics" / f"{CLASS_ASSIGNMENT}.yaml").write_text(edited)
    return root


def _otter_venv() -> Path:
    """otter-grader in its own venv (made once; with the kernel and the torch the notebook needs,
    at this venv's versions): the otter executable."""
    otter = OTTER_VENV / "bin" / "otter"
    if otter.exists():
        return otter
    print(f"installing otter-grader {OTTER_VERSION} into {OTTER_VENV} (once)", flush=True)
    shutil.rmtree(OTTER_VENV, ignore_errors=True)
    pins = [f"otter-grader=={OTTER_VERSION}", *(f"{p}=={metadata.version(p)}" for p in ("ipykernel", "torch"))]
    for command in ([sys.executable, "-m", "venv", OTTER_VENV],
                    [OTTER_VENV / "bin" / "python", "-m", "pip", "install", "-q", *pins]):
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(OTTER_VENV, ignore_errors=True)
            raise BenchError(f"installing otter failed: {done.stderr.strip().splitlines()[-1:]}")
    return otter


def _marked_processes(marker: str) -> dict[int, str]:
    """pid -> command line of every process whose environment carries ``MARKER=marker``, and of
    their descendants (a sandbox's processes get a fresh environment)."""
    parents, marked, commands = {}, set(), {}
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            parents[pid] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            commands[pid] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                marked.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    found = set(marked)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        grew = bool(children)
        found |= children
    found.discard(os.getpid())
    return {pid: commands.get(pid, "") for pid in sorted(found)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"1 round each, a class of {QUICK.class_size} and regrade sets of "
                             f"{QUICK.class_size} and {QUICK.large_set} (a few minutes, for development)")
    parser.add_argument("--repeats", type=int, help="rounds per figure (default 3; 1 with --quick)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats:
        sizes = Sizes(args.repeats, sizes.class_size, sizes.large_set)
    started, clock = datetime.now(timezone.utc), time.perf_counter()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    bench = Bench(sizes)
    print(f"bench: {'quick' if args.quick else 'full'} run, {sizes.repeats} round(s) per figure, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    try:
        bench.section("per submission against the floor", bench.per_submission)
        bench.section("the probe, case by case", bench.probe_costs)
        bench.section("against otter-grader", bench.against_otter)
        bench.section("a submission that sleeps", bench.sleeping_submission)
        bench.section("throughput, regrades and memory", bench.throughput)
        bench.section("similarity across a class", bench.similarity)
    finally:
        leftover = bench.leftovers()
    wall = time.perf_counter() - clock
    record = bench_record(bench.figures, quick=args.quick, started=started.isoformat(timespec="seconds"),
                          wall_s=wall, stages=bench.stages, leftover=leftover, problems=bench.problems)
    write_record(record, RECORD)
    print(f"\nprocesses left running: {len(leftover)}" + "".join(f"\n    {line}" for line in leftover))
    for problem in bench.problems:
        print(f"problem: {problem}")
    short = [f.name for f in bench.figures if f.status != "ok" and f.target.gate]
    print(f"bench: {len(bench.figures)} figures, {len(short)} short of target or without data; "
          f"load average {os.getloadavg()[0]:.1f} at the end; {wall / 60:.1f} min; written to {RECORD}")
    return 1 if leftover or bench.problems else 0


if __name__ == "__main__":
    sys.exit(main())
