"""What the terminal shows: ``plain`` text (no escape sequences or control characters from
anything a student wrote, here and in each check.py), progress of long runs and the closing
score table (rich).

On a terminal, progress is one live bar with a line printed above it per finished
submission; in a log (CI, a file) rich draws no bar and the per-submission lines remain, so a
long batch is readable either way.
"""
from __future__ import annotations

import re
import sys
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grader.score import GradeResult


# BEGIN plain: `grader assign` copies this block, as it is, into each check.py (a test compares
# the copies), so it needs nothing but `re`.
# What a terminal acts on: escape sequences first, whole (CSI; the string sequences OSC, DCS,
# SOS, PM and APC to their BEL or ST terminator; two-character ones), then every control left,
# a lone ESC among them: C0 but newline and tab (carriage return overwrites a line), DEL, C1
# (U+009B is an 8-bit CSI) and the bidirectional controls that reorder what a reader sees.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b]*(\x07|\x1b\\)?|[0-Z\\`-~])")
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """``text`` without escape sequences or control characters (newlines and tabs stay): for
    anything a student may have written, before a terminal shows it."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))
# END plain


def counted(n: int, noun: str) -> str:
    """'1 submission', '2 submissions': a count with its noun (a regular plural)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def say(text: str, stream: TextIO | None = None, end: str = "\n") -> None:
    """Print ``plain(text)`` to ``stream`` (standard output when None, looked up at the call):
    the command line's one way to the terminal. Where rich reads markup, ``escape`` it too."""
    print(plain(text), file=stream or sys.stdout, end=end)


class RunProgress:
    """A bar over ``total`` units of work; ``advance`` moves it and prints one line."""

    def __init__(self, stream: TextIO, label: str, total: int, done: int = 0):
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=self.console, transient=True,
                                  disable=not self.console.is_terminal)
        self._task = self._progress.add_task(label, total=total, completed=done)

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._progress.stop()

    def advance(self, line: str | None = None, *, to: int | None = None) -> None:
        """One unit done (or ``to`` units in all), with a line for the log."""
        if to is None:
            self._progress.advance(self._task)
        else:
            self._progress.update(self._task, completed=to)
        if line:
            self.console.print(plain(line), markup=False)


def score_table(results: list[GradeResult]) -> Table:
    """One row per submission: score, and the items it did not pass."""
    table = Table(title=None if results else "no submissions graded")
    table.add_column("submission")
    table.add_column("score", justify="right")
    table.add_column("not passed")
    for result in sorted(results, key=lambda r: r.submission_id):
        failed = [i.name for i in result.items if i.status in ("failed", "error")]
        pending = sum(1 for i in result.items if i.status == "pending_review")
        shown = ", ".join(failed[:6]) + (f" (+{len(failed) - 6} more)" if len(failed) > 6 else "")
        if pending:
            shown += f"{'; ' if shown else ''}{pending} written pending review"
        table.add_row(escape(plain(result.submission_id)), f"{result.score:g} / {result.max_score:g}",
                      escape(plain(shown)) or "-")
    return table


def print_scores(results: list[GradeResult], stream: TextIO) -> None:
    """The closing table, sized for the terminal (or 120 columns in a log)."""
    Console(file=stream, highlight=False, width=None if stream.isatty() else 120).print(score_table(results))
