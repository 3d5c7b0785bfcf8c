"""One submission through the whole pipeline: load -> execute -> probe -> check -> score.

``SubmissionGrader.grade`` never raises for anything a submission does: every problem ends
up as a reason on the affected items, and the items that can still be graded are graded.

The sandboxed stages' raw outputs are kept beside results.json (``RAW_OUTPUTS``: the
``ExecutionResult`` fields the checks read, the ``ProbeResult`` with its float arrays as raw
bytes with dtype and shape, the stages' notes), written by the grader from what it had already
read, under the run's ``execution_key``. ``kept_run`` reads them back (capped, type-checked,
no pickle: they hold values student code produced) only under the same key, so after a change
to evaluation alone (``grader.digests``) ``grade(..., kept=...)`` recomputes verdicts and
scores without starting a sandbox. The grade-time screening's flags are kept beside it
(``SCREENING``) under the screening key, and reused when the written stage did not change.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, TypeVar

import nbformat

from grader import __version__, digests, requirements, untrusted
from grader.assignment import Assignment
from grader.checks import CheckContext, Verdict, checks_for, grounding_answers, inline
from grader.checks.tampering import submission_attempts
from grader.execute import (MAX_ANSWERS_BYTES, MAX_EXECUTED_NOTEBOOK_BYTES, ExecutionResult, execute_notebook, execution_from_record,
                            execution_record, prepare_notebook)
from grader.load import Submission, load_submission
from grader.graft import GraftError, submission_module_source
from grader.probe import MAX_PROBE_OUTPUT_BYTES, ProbeCase, ProbeResult, probe_from_record, probe_record, run_probe
from grader.rubric import Rubric
from grader.sandbox import MemoryShare, Sandbox
from grader.score import GradeResult, score_items
from grader.untrusted import json_object, read_bytes
from grader.written import WRITTEN_INPUTS, inputs_artifact, screen


EXECUTED_NOTEBOOK = "executed.ipynb"   # the graded run with its outputs, for TAs
GRADER_ERRORS = "grader_errors.txt"    # tracebacks of checks that crashed: for instructors only
GRADER_ERROR_NOTE = "internal grader error"
SCAFFOLD_SOURCE = "scaffold.py"        # the student's scaffold code, for the similarity comparison
RAW_OUTPUTS = "raw_outputs.bin"        # the kept run: what the sandboxed stages returned
SCREENING = "screening.json"           # the written stage's grade-time flags, under the screening key
RAW_MAGIC = b"G2C-RAW-1\n"
MAX_RAW_BYTES = MAX_PROBE_OUTPUT_BYTES + 4 * MAX_ANSWERS_BYTES
Outcome = TypeVar("Outcome")   # what one sandboxed stage returns


@dataclass
class KeptRun:
    """What the sandboxed stages of one submission returned: everything evaluation reads of them."""

    execution: ExecutionResult | None
    execution_problem: str | None
    probe: ProbeResult | None
    probe_problem: str | None
    notes: list[str] = field(default_factory=list)   # the stages' notes, after the submission's own
    ran: bool = False                                 # whether any student code ran
    # Timings (decide nothing): the sandboxed stages, in order, as [name, seconds] (``stages``
    # in results.json's extra_data.timings), and the peak memory of the submission's runs.
    stages: list[tuple[str, float]] = field(default_factory=list)
    peak_memory_mib: float | None = None
    # The screening's flags by question when kept under the current screening key (not in the
    # kept-run file: screening is evaluation, kept beside it in SCREENING).
    screening: dict[str, list[str]] | None = None

    def pack(self, key: str) -> bytes:
        """The kept-run file: a JSON header (with ``key``), then its arrays' bytes, each length-prefixed."""
        blobs: list[bytes] = []
        header = json.dumps({"key": key, "ran": self.ran, "notes": self.notes,
                             "execution": execution_record(self.execution) if self.execution else None,
                             "execution_problem": self.execution_problem,
                             "probe": probe_record(self.probe, blobs) if self.probe else None,
                             "probe_problem": self.probe_problem, "stages": self.stages,
                             "peak_memory_mib": self.peak_memory_mib}).encode()
        return b"".join([RAW_MAGIC, struct.pack(">Q", len(header)), header,
                         *(struct.pack(">Q", len(b)) + b for b in blobs)])

    @classmethod
    def unpack(cls, data: bytes, key: str) -> "KeptRun | None":
        """The kept run in ``data`` if it was kept under ``key`` and reads back whole, else None."""
        if not data.startswith(RAW_MAGIC):
            return None
        view, at = memoryview(data), len(RAW_MAGIC)
        try:
            size = struct.unpack(">Q", view[at: at + 8])[0]
            header = json_object(bytes(view[at + 8: at + 8 + size]))
            at += 8 + size
            blobs = []
            while at < len(view):
                size = struct.unpack(">Q", view[at: at + 8])[0]
                if at + 8 + size > len(view):
                    return None
                blobs.append(bytes(view[at + 8: at + 8 + size]))
                at += 8 + size
        except struct.error:
            return None
        if header is None or header.get("key") != key:
            return None
        problems = header.get("execution_problem"), header.get("probe_problem")
        notes = header.get("notes")
        if not all(isinstance(p, (str, type(None))) for p in problems) or not isinstance(header.get("ran"), bool) \
                or not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            return None
        execution = header.get("execution") and execution_from_record(header["execution"])
        probe = header.get("probe") and probe_from_record(header["probe"], blobs)
        stages = untrusted.stages(header.get("stages"), strict=True)
        peak = header.get("peak_memory_mib")
        if (header.get("execution") and execution is None) or (header.get("probe") and probe is None) \
                or stages is None or not (peak is None or type(peak) in (int, float) and 0 <= peak < math.inf):
            return None
        return cls(execution or None, problems[0], probe or None, problems[1], list(notes), header["ran"],
                   stages=stages, peak_memory_mib=peak)


class SubmissionGrader:
    """Grades single submissions of one assignment with one sandbox configuration."""

    def __init__(self, assignment: Assignment, sandbox: Sandbox, rubric: Rubric | None = None):
        self.assignment = assignment
        self.rubric = rubric or assignment.rubric
        requirements.importable(self.rubric.settings, assignment.root)   # the master's code imports them
        self.sandbox = sandbox
        self.checks = checks_for(self.rubric, self.assignment.root)
        self.inline_tests = inline.inline_tests(self.assignment.master)

    def probe_cases(self) -> list[ProbeCase]:
        """What the probe runs: the checks module's cases, then one per test cell."""
        return self.checks.probe_cases(self.rubric) + inline.probe_cases(self.inline_tests)

    def evaluate(self, context: CheckContext) -> dict[str, Verdict]:
        """The checks module's verdicts and the test cells'."""
        verdicts = self.checks.evaluate(context)
        if self.inline_tests:
            runs = inline.master_runs(self.assignment.master_path, self.assignment.fingerprint)
            verdicts.update(inline.evaluate(self.inline_tests, context, runs))
        return verdicts

    @cached_property
    def digests(self) -> dict[str, str]:
        """The execution and evaluation digests (``grader.digests``), in results.json's extra_data."""
        return {"execution": digests.execution_digest(self.checks, self.rubric, self.assignment.fingerprint,
                                                      cases=self.probe_cases()),
                "evaluation": digests.evaluation_digest(self.checks, self.rubric),
                "screening": digests.screening_digest(self.rubric)}

    def execution_key(self, submission_sha256: str) -> str:
        """Same submission, grader version, execution digest, limits and isolation level -> the
        same raw outputs: the key a kept run is reused under."""
        parts = [submission_sha256, __version__, self.digests["execution"], repr(self.rubric.limits),
                 self.sandbox.isolation]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def cache_key(self, submission_sha256: str) -> str:
        """The execution key and the evaluation digest: same key -> the same result."""
        parts = [self.execution_key(submission_sha256), self.digests["evaluation"]]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def kept_run(self, folder: Path, submission_sha256: str) -> KeptRun | None:
        """The raw outputs kept in ``folder`` (the submission's output folder) by a run under the
        current execution key, or None (none kept, another key, damaged: run again)."""
        data = read_bytes(folder / RAW_OUTPUTS, folder, MAX_RAW_BYTES)
        kept = None if data is None else KeptRun.unpack(data, self.execution_key(submission_sha256))
        if kept is not None:
            kept.screening = self._kept_screening(folder, submission_sha256)
            if kept.execution is not None:   # messages name cells by the run's own notebook, kept beside it
                kept.execution.executed_notebook = read_bytes(folder / EXECUTED_NOTEBOOK, folder,
                                                              MAX_EXECUTED_NOTEBOOK_BYTES)
        return kept

    def screening_key(self, submission_sha256: str) -> str:
        """Same raw outputs and same screening code and settings -> the same grade-time flags."""
        parts = [self.execution_key(submission_sha256), self.digests["screening"]]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _kept_screening(self, folder: Path, submission_sha256: str) -> dict[str, list[str]] | None:
        data = read_bytes(folder / SCREENING, folder, MAX_ANSWERS_BYTES)
        kept = None if data is None else json_object(data)
        if kept is None or kept.get("key") != self.screening_key(submission_sha256):
            return None
        flags = kept.get("flags")
        if not isinstance(flags, dict) or not all(isinstance(f, list) and all(isinstance(x, str) for x in f)
                                                  for f in flags.values()):
            return None
        return flags

    def grade(self, path: Path | None, submission_id: str, folder: Path | None = None,
              kept: KeptRun | None = None) -> GradeResult:
        """Grade the notebook ``path`` and the package files in ``folder`` (the submission's
        folder, None for a lone notebook); ``path`` is None when the folder holds no notebook.
        With ``kept`` (from ``kept_run`` for these same files) nothing is run: the verdicts are
        recomputed from its raw outputs."""
        started = time.monotonic()
        limits = self.rubric.limits
        submission = load_submission(path, submission_id, self.assignment.template,
                                     int(limits.notebook_max_mib * 2**20), folder)
        run = kept or self._run(submission)
        notes = list(submission.notes) + run.notes
        if self.rubric.settings.get("requirements"):   # installed beside the grader's packages for every run
            notes.append(f"The assignment's own requirements were installed for your code: "
                         f"{', '.join(map(str, self.rubric.settings['requirements']))}")
        execution = run.execution
        context = CheckContext(self.rubric, self.assignment.master_path, run.probe, run.probe_problem,
                               execution, run.execution_problem,
                               execution.answers if execution else {}, submission.ungraded)
        checking = time.monotonic()
        verdicts = self.evaluate(context)
        items_checked = time.monotonic()
        # Written answers are screened here, whatever --llm says: the written stage's grade-time part.
        screened = run.screening is None
        grounded = grounding_answers(self.checks, context)
        flags = screen(self.rubric, submission, grounded) if screened else run.screening
        stages = [*run.stages, ("checks", round(items_checked - checking, 3)),
                  ("written", round(time.monotonic() - items_checked, 3))]
        items = score_items(self.rubric, verdicts, submission, flags)
        if submission.fatal:
            notes.insert(0, f"This notebook could not be graded: {submission.fatal}" if path is not None
                         else f"Only the package files were graded: {submission.fatal}")
        # A kept run's executed notebook and raw outputs are already in the folder, unchanged.
        artifacts = {}
        if kept is None:
            if execution and execution.executed_notebook:
                artifacts[EXECUTED_NOTEBOOK] = execution.executed_notebook
            artifacts[RAW_OUTPUTS] = run.pack(self.execution_key(submission.sha256))
        if submission.scaffold_sources:
            artifacts[SCAFFOLD_SOURCE] = "\n\n\n".join(submission.scaffold_sources.values()).encode()
        if screened:   # else the flags and the written stage's inputs in the folder are still these
            artifacts[SCREENING] = json.dumps({"key": self.screening_key(submission.sha256), "flags": flags}).encode()
            if submission.notebook is not None:
                artifacts[WRITTEN_INPUTS] = inputs_artifact(self.rubric, submission, grounded)
        try:
            attempts = [a.to_json() for a in submission_attempts(submission, self.assignment.template)]
        except Exception as exc:  # noqa: BLE001 - a reading that fails costs the TA's list, never a score
            attempts = [{"kind": "unread", "where": "the notebook", "code": "",
                         "detail": f"the code could not be read for attempts ({type(exc).__name__})"}]
        crashed = {name: v.internal for name, v in verdicts.items() if v.internal}
        if crashed:
            # The tracebacks show hidden check code: a file beside results.json, never in it.
            notes.append(f"{GRADER_ERROR_NOTE} in {len(crashed)} item(s) ({', '.join(sorted(crashed))}); "
                         "they will be regraded")
            artifacts[GRADER_ERRORS] = "\n".join(f"== {name}\n{trace}" for name, trace in crashed.items()).encode()
            sys.stderr.write(f"{submission_id}: grader error in {', '.join(sorted(crashed))}, "
                             f"see {GRADER_ERRORS}\n")
        return GradeResult(submission_id, self.rubric.assignment, __version__, submission.sha256, items,
                           notes, time.monotonic() - started, self.cache_key(submission.sha256), artifacts,
                           isolation=self.sandbox.isolation if run.ran else "", sources=submission.sources,
                           grader_errors=sorted(crashed),
                           digests={k: self.digests[k] for k in ("execution", "evaluation")},
                           stages=stages, peak_memory_mib=run.peak_memory_mib, attempts=attempts)

    def _run(self, submission: Submission) -> KeptRun:
        """The sandboxed stages: the notebook run and, at the same time in a thread of its own,
        the probe of the scaffold (and, in another, the checks module's ``warm_up``). Each stage
        has its own sandbox run (uid and scratch); they share the memory limit
        (``MemoryShare``), which binds the submission as a whole. A stage that a wall-clock
        backstop stopped runs once more (``_retried``)."""
        share = MemoryShare()
        execution_notes: list[str] = []
        probe_notes: list[str] = []
        execution, execution_problem = None, submission.fatal
        probe, probe_problem = None, (None if submission.scaffold_sources
                                      else submission.scaffold_problem or submission.fatal)
        prober = ThreadPoolExecutor(max_workers=2, thread_name_prefix="g2c-probe")
        try:
            # A package file is graded without a readable notebook too.
            probing = (prober.submit(_retried, "the probe", probe_notes,
                                     lambda stage_notes: self.probe(submission, share, stage_notes),
                                     lambda outcome: outcome[0].backstop() if outcome[0] else None)
                       if submission.scaffold_sources else None)
            warm_up = getattr(self.checks, "warm_up", None)
            if warm_up is not None:   # what evaluation imports, while the sandboxes run (see ChecksModule)
                prober.submit(warm_up)
            if submission.fatal is None:
                execution = _retried("the notebook run", execution_notes,
                                     lambda stage_notes: self._execute(submission, share, stage_notes),
                                     ExecutionResult.backstop)
            if probing is not None:
                probe, probe_problem = probing.result()
        finally:
            # Not waited for when the notebook's run was cut short (the worker told to stop): the
            # probe's bwrap dies with this process (--die-with-parent), and the guard kills the rest.
            prober.shutdown(wait=False)
        ran = execution is not None or probe is not None
        notes = execution_notes + probe_notes
        if ran:
            notes.append(self.sandbox.note)   # students and TAs see how the code was isolated
        stages = (execution.stages() if execution else []) + (probe.stages() if probe else [])
        peak = round(share.peak_bytes / 2**20, 1) if ran else None
        return KeptRun(execution, execution_problem, probe, probe_problem, notes, ran, stages=stages,
                       peak_memory_mib=peak)

    def _execute(self, submission: Submission, share: MemoryShare, notes: list[str]) -> ExecutionResult:
        notebook = _with_package_scaffolds(submission, self.assignment.master)
        prepared = prepare_notebook(notebook, self.assignment.master, notes)
        with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission.submission_id)}-") as scratch:
            result = execute_notebook(prepared, self.sandbox, Path(scratch), self.rubric.limits,
                                      self.rubric.answer_variables, share)
        notes.extend(result.notes)
        notes.extend(f"stopped during execution: {reason}" for reason in result.stopped)
        return result

    def probe(self, submission: Submission, share: MemoryShare,
              notes: list[str]) -> tuple[ProbeResult | None, str | None]:
        """The probe of the submission's scaffold (one sandboxed run of the harness), or why it
        could not be built; what it noted goes to ``notes``. ``make bench`` times it alone."""
        try:
            source, graft_notes = submission_module_source(self.assignment.master, submission.scaffold_sources)
        except GraftError as exc:
            return None, str(exc)
        notes.extend(graft_notes)
        limits = self.rubric.limits
        with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission.submission_id)}-probe-") as scratch:
            result = run_probe(source, self.probe_cases(), self.sandbox, Path(scratch),
                               limits.probe_case_timeout_s, self.checks.PROBE_DRIVER, limits.wall_backstop_factor,
                               share, idle_timeout=limits.idle_timeout_s)
        notes.extend(f"stopped during the probe: {reason}" for reason in result.notes)
        return result, None


def _retried(stage: str, notes: list[str], run: Callable[[list[str]], Outcome],
             backstop: Callable[[Outcome], str | None]) -> Outcome:
    """``run(notes)`` of a sandboxed stage, and once more when ``backstop`` says a wall-clock
    backstop stopped it: code that slept or waited, or a machine so busy that it starved. Only
    the second run's outcome and notes are kept (graded, and kept for regrades), after a note
    that says what happened to the first."""
    first_notes: list[str] = []
    outcome = run(first_notes)
    stopped = backstop(outcome)
    if stopped is None:
        notes.extend(first_notes)
        return outcome
    second_notes: list[str] = []
    outcome = run(second_notes)
    again = backstop(outcome)
    notes.append(f"{stage} was stopped by a wall-clock backstop ({stopped}); graded again once: "
                 + (f"stopped again ({again})" if again else "the second run finished within its limits"))
    notes.extend(second_notes)
    return outcome


def _with_package_scaffolds(submission: Submission, master: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The submitted notebook with the code read from each package file in the notebook's own
    cell for that scaffold or, when it has none, in a new cell where the master has it: the
    exercises run the code that is graded. A package file that cannot be graded changes nothing."""
    notebook = copy.deepcopy(submission.notebook)
    for cell_id in [c for c in submission.package_scaffolds if c in submission.scaffold_sources]:
        code = submission.scaffold_sources[cell_id]
        if cell_id in submission.replaced_cells:
            notebook.cells[submission.replaced_cells[cell_id]].source = code
            continue
        present = {c.get("id"): i for i, c in enumerate(notebook.cells)}
        position = next(i for i, c in enumerate(master.cells) if c.get("id") == cell_id)
        after = [c.id for c in master.cells[position + 1:] if c.id in present]
        notebook.cells.insert(present[after[0]] if after else len(notebook.cells),
                              nbformat.v4.new_code_cell(code, id=cell_id))
    return notebook


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)[:40]
