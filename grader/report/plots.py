"""The class summary's plots, as inline SVG, and matplotlib imported on first use.

A grading worker imports the report modules and draws nothing, so matplotlib is imported only
when a plot is drawn (or, by ``grader grade``, beside its workers: ``load_matplotlib``), with its
font cache in a temporary folder: a grader run leaves nothing outside its output folder.
"""
from __future__ import annotations

import atexit
import functools
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from grader.report.results import is_pending
from grader.score import ItemResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@functools.cache
def matplotlib_module() -> ModuleType:
    """matplotlib, imported when the first plot is drawn (a grading worker imports this module
    and draws none). It caches its font list in ~/.cache and ~/.config when it is imported: a
    grader run leaves nothing outside its output folder, so the cache lives in a temporary
    folder removed at exit (unless MPLCONFIGDIR says otherwise)."""
    if "MPLCONFIGDIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="g2c-matplotlib-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ["MPLCONFIGDIR"] = folder
    import matplotlib.figure
    import matplotlib.ticker
    return matplotlib


def load_matplotlib(folder: Path) -> None:
    """Import matplotlib now (about a second, its font list included), caching that list in
    ``folder`` unless MPLCONFIGDIR says otherwise: ``grader grade`` does it beside its workers
    (``grade_batch``'s meanwhile), so that the summary's plots are drawn at once."""
    os.environ.setdefault("MPLCONFIGDIR", str(folder))
    matplotlib_module()


def svg(figure: Figure) -> str:
    """The figure as an inline <svg> element (no XML prolog, no date, stable ids)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def histogram(scores: list[float], max_score: float) -> str:
    figure = matplotlib_module().figure.Figure(figsize=(6.5, 2.6))
    axes = figure.add_subplot()
    bins = min(20, max(5, len(scores)))
    axes.hist(scores, bins=bins, range=(0, max(max_score, 1)), color="#3a6ea5", edgecolor="white")
    axes.set_xlabel("score")
    axes.set_ylabel("submissions")
    axes.yaxis.set_major_locator(matplotlib_module().ticker.MaxNLocator(integer=True))
    axes.spines[["top", "right"]].set_visible(False)
    return svg(figure)


@dataclass(frozen=True)
class PassRate:
    """One item across the class: a pending item (no score yet) counts neither as passed nor as
    failed, so the rate is passed / graded and the pending count is said beside it."""

    name: str
    passed: int
    graded: int      # items with a score: passed, failed or error
    pending: int

    @classmethod
    def of(cls, name: str, group: list[ItemResult]) -> PassRate:
        pending = sum(map(is_pending, group))
        return cls(name, sum(i.status == "passed" for i in group), len(group) - pending, pending)

    @property
    def rate(self) -> float | None:
        return self.passed / self.graded if self.graded else None

    @property
    def label(self) -> str:
        """The text beside the bar."""
        shown = (f"{self.rate:.0%} ({self.passed} of {self.graded})" if self.rate is not None
                 else "none graded yet")
        return shown + (f", {self.pending} pending" if self.pending else "")


def pass_rates_svg(rates: list[PassRate]) -> str:
    """Horizontal bars of passed / graded per item, each labelled with its rate and pending
    count. The labels are SVG text (not glyph outlines), so they can be read, found and copied."""
    figure = matplotlib_module().figure.Figure(figsize=(6.5, 0.28 * max(len(rates), 1) + 0.8))
    axes = figure.add_subplot()
    ordered = rates[::-1]
    bars = axes.barh([r.name for r in ordered], [100 * (r.rate or 0) for r in ordered], color="#5a9a5a")
    for bar, rate in zip(bars, ordered):
        bar.set_gid(f"bar-{rate.name}")
        text = axes.annotate(rate.label, (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                             xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
        text.set_gid(f"rate-{rate.name}")
    axes.set_xlim(0, 100)
    axes.set_xlabel("% of graded submissions passed (pending items not counted)")
    axes.tick_params(axis="y", labelsize=8)
    axes.spines[["top", "right"]].set_visible(False)
    with matplotlib_module().rc_context({"svg.fonttype": "none"}):   # this figure only; the histogram keeps the default
        return svg(figure)
