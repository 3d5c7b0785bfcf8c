"""Stage 5, written answers: each Question/Answer cell graded against its rubric by an LLM.

The package's face: what the pipeline, the command line and the reports use of the stage. Its
modules:

* ``stage``: the stage itself: each submission's inputs (``inputs_artifact``), the grade-time
  screening (``screen``), the agreement of the student's reported run with the grader's
  (``run_agreement``), and, after a batch, the drafts asked for and applied (``grade_written``);
* ``prompt``: the request and the draft's format; ``client``: the API, live or as a Message
  Batch; ``cache``: drafts cached by everything that decides them;
* ``injection``: the detector of data that addresses the grader; ``evidence``: quotes checked
  and confirmed by an answer-free second question;
* ``calibrate``: the model's agreement with TA-scored sample answers.
"""
from __future__ import annotations

from grader.written.stage import (CACHE_FOLDER, MAX_ROWS, USAGE_FILE, WRITTEN_INPUTS, WrittenOutcome, grade_written,
                                  inputs_artifact, run_agreement, screen)

__all__ = ["CACHE_FOLDER", "MAX_ROWS", "USAGE_FILE", "WRITTEN_INPUTS", "WrittenOutcome", "grade_written",
           "inputs_artifact", "run_agreement", "screen"]
