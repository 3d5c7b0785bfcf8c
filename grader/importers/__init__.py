"""``grader import``: another autograder's assignment notebook, as an assignment of this project.

Each importer reads its peer's master notebook into a ``draft.Draft`` (the master notebook in this
project's markup, its written questions, its requirements, and a note for each thing of the
peer's it could not carry over); ``draft.write_assignment`` lays the draft out under an
assignment root with the same machinery as ``grader new`` and ``grader assign``:

- ``otter``: otter-assign's format (``# ASSIGNMENT CONFIG``, ``# BEGIN QUESTION`` ... blocks);
- ``nbgrader``: nbgrader's source format (the ``nbgrader`` cell metadata).
"""
from __future__ import annotations

from grader.importers.draft import Draft, ImportRefused, write_assignment

__all__ = ["Draft", "ImportRefused", "write_assignment"]
