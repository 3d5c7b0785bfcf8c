"""One submission through the whole pipeline: load -> execute -> probe -> check -> score.

``SubmissionGrader.grade`` never raises for anything a submission does: every problem ends
up as a reason on the affected items, and the items that can still be graded are graded.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from pathlib import Path

from grader import __version__
from grader.assignment import Assignment
from grader.checks import CheckContext, checks_for
from grader.execute import ExecutionResult, execute_notebook, prepare_notebook
from grader.load import Submission, load_submission
from grader.probe import GraftError, ProbeResult, run_probe, submission_module_source
from grader.rubric import Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult, score_items
from grader.written import WRITTEN_INPUTS, inputs_artifact


EXECUTED_NOTEBOOK = "executed.ipynb"   # the graded run with its outputs, for TAs
GRADER_ERRORS = "grader_errors.txt"    # tracebacks of checks that crashed: for instructors only
GRADER_ERROR_NOTE = "internal grader error"
SCAFFOLD_SOURCE = "scaffold.py"        # the student's scaffold code, for the integrity comparison


class SubmissionGrader:
    """Grades single submissions of one assignment with one sandbox configuration."""

    def __init__(self, assignment: Assignment, sandbox: Sandbox, rubric: Rubric | None = None):
        self.assignment = assignment
        self.rubric = rubric or assignment.rubric
        self.sandbox = sandbox
        self.checks = checks_for(self.rubric)

    def cache_key(self, submission_sha256: str) -> str:
        """Same submission, grader version, assignment files, limits and isolation level -> same key."""
        parts = [submission_sha256, __version__, self.assignment.fingerprint, repr(self.rubric.limits),
                 self.sandbox.isolation]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def grade(self, path: Path, submission_id: str) -> GradeResult:
        started = time.monotonic()
        limits = self.rubric.limits
        submission = load_submission(path, submission_id, self.assignment.template,
                                     int(limits.notebook_max_mib * 2**20))
        notes = list(submission.notes)
        execution, execution_problem = None, submission.fatal
        probe, probe_problem = None, submission.fatal or (None if submission.scaffold_sources
                                                          else submission.scaffold_problem)
        if submission.fatal is None:
            with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission_id)}-") as scratch:
                execution = self._execute(submission, Path(scratch), notes)
            if submission.scaffold_sources:
                with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission_id)}-probe-") as scratch:
                    probe, probe_problem = self._probe(submission, Path(scratch), notes)
        if submission.fatal is None:
            notes.append(self.sandbox.note)   # students and TAs see how the code was isolated
        context = CheckContext(self.rubric, self.assignment.master_path, probe, probe_problem,
                               execution, execution_problem,
                               execution.answers if execution else {})
        verdicts = self.checks.evaluate(context)
        items = score_items(self.rubric, verdicts, submission)
        if submission.fatal:
            notes.insert(0, f"This notebook could not be graded: {submission.fatal}")
        artifacts = {EXECUTED_NOTEBOOK: execution.executed_notebook} if execution and execution.executed_notebook else {}
        if submission.scaffold_sources:
            artifacts[SCAFFOLD_SOURCE] = "\n\n\n".join(submission.scaffold_sources.values()).encode()
        if submission.notebook is not None:
            artifacts[WRITTEN_INPUTS] = inputs_artifact(self.rubric, submission, context.answers)
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
                           isolation=self.sandbox.isolation if submission.fatal is None else "")

    def _execute(self, submission: Submission, scratch: Path, notes: list[str]) -> ExecutionResult:
        prepared = prepare_notebook(submission.notebook, self.assignment.master, notes)
        result = execute_notebook(prepared, self.sandbox, scratch, self.rubric.limits,
                                  self.rubric.answer_variables)
        notes.extend(result.notes)
        notes.extend(f"stopped during execution: {reason}" for reason in result.stopped)
        return result

    def _probe(self, submission: Submission, scratch: Path,
               notes: list[str]) -> tuple[ProbeResult | None, str | None]:
        try:
            source, graft_notes = submission_module_source(self.assignment.master, submission.scaffold_sources)
        except GraftError as exc:
            return None, str(exc)
        notes.extend(graft_notes)
        result = run_probe(source, self.checks.probe_cases(self.rubric), self.sandbox, scratch,
                           self.rubric.limits.probe_case_timeout_s)
        notes.extend(f"stopped during the probe: {reason}" for reason in result.notes)
        return result, None


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)[:40]
