"""Stage 6, report: what the grader hands to students, TAs and other systems.

Everything here is rebuilt from the output folder, so ``grader report DIR`` re-renders it all
after a TA edits ``DIR/overrides.yaml``, without executing anything:

- ``results``: ``DIR/<id>/results.json`` (Gradescope's schema) and ``DIR/gradebook.csv``
- ``overrides``: the TA's overrides, checked, applied and audited
- ``changes``: old -> new per item when a regrade changes a score
- ``plots``: the class summary's plots, as inline SVG
- ``canvas``: final totals and pages into Canvas by its API (``grader publish``)
- ``pages``: ``report.html`` for the student, ``review.html``, ``summary.html`` and
  ``similarity.html`` (from ``grader.similarity``'s record) for TAs
- ``executed``: ``executed.html``, the executed notebook sanitized, for TAs
- ``export``: gradebook CSV for an LMS (Canvas)
- ``terminal``: progress bars and the closing table (rich)

The modules import nothing from each other through this file, so the pipeline's stages can
use ``results`` without loading the pages.
"""
