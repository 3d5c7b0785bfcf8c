"""One submission through the whole pipeline: load -> execute -> probe -> check -> score.

``SubmissionGrader.grade`` never raises for anything a submission does: every problem ends
up as a reason on the affected items, and the items that can still be graded are graded.
"""
from __future__ import annotations

import copy
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from grader import __version__
from grader.assignment import Assignment
from grader.checks import CheckContext, checks_for
from grader.execute import ExecutionResult, execute_notebook, prepare_notebook
from grader.load import Submission, load_submission
from grader.graft import GraftError, submission_module_source
from grader.probe import ProbeResult, run_probe
from grader.rubric import Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult, score_items
from grader.written import WRITTEN_INPUTS, inputs_artifact, screen


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

    def grade(self, path: Path | None, submission_id: str, folder: Path | None = None) -> GradeResult:
        """Grade the notebook ``path`` and the package files in ``folder`` (the submission's
        folder, None for a lone notebook); ``path`` is None when the folder holds no notebook."""
        started = time.monotonic()
        limits = self.rubric.limits
        submission = load_submission(path, submission_id, self.assignment.template,
                                     int(limits.notebook_max_mib * 2**20), folder)
        notes = list(submission.notes)
        execution, execution_problem = None, submission.fatal
        probe, probe_problem = None, (None if submission.scaffold_sources
                                      else submission.scaffold_problem or submission.fatal)
        if submission.fatal is None:
            with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission_id)}-") as scratch:
                execution = self._execute(submission, Path(scratch), notes)
        if submission.scaffold_sources:   # a package file is graded without a readable notebook too
            with tempfile.TemporaryDirectory(prefix=f"g2c-{_safe(submission_id)}-probe-") as scratch:
                probe, probe_problem = self._probe(submission, Path(scratch), notes)
        ran = execution is not None or probe is not None
        if ran:
            notes.append(self.sandbox.note)   # students and TAs see how the code was isolated
        context = CheckContext(self.rubric, self.assignment.master_path, probe, probe_problem,
                               execution, execution_problem,
                               execution.answers if execution else {})
        verdicts = self.checks.evaluate(context)
        # Written answers are screened here, whatever --llm says: the written stage's grade-time part.
        items = score_items(self.rubric, verdicts, submission, screen(self.rubric, submission, context.answers))
        if submission.fatal:
            notes.insert(0, f"This notebook could not be graded: {submission.fatal}" if path is not None
                         else f"Only the package files were graded: {submission.fatal}")
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
                           isolation=self.sandbox.isolation if ran else "", sources=submission.sources,
                           grader_errors=sorted(crashed))

    def _execute(self, submission: Submission, scratch: Path, notes: list[str]) -> ExecutionResult:
        notebook = _with_package_scaffolds(submission, self.assignment.master)
        prepared = prepare_notebook(notebook, self.assignment.master, notes)
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
                           self.rubric.limits.probe_case_timeout_s, self.checks.PROBE_DRIVER)
        notes.extend(f"stopped during the probe: {reason}" for reason in result.notes)
        return result, None


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
