"""The floor: nbclient executing one notebook, kernel start included, and nothing else.

Run as ``python bench/floor.py NOTEBOOK`` by ``bench/run.py`` in a subprocess whose whole wall
time is the figure (interpreter start and imports included, as for ``grader grade``), with the
grader's grading environment (``grader.execute.GRADING_ENV``) set by the caller: no sandbox, no
probe, no checks, no pages. It runs in a fresh temporary folder (as the grader's scratch) and
exits 1 when a cell raised, so a floor is never timed on a notebook that did not run.
"""
from __future__ import annotations

import sys
import tempfile

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main(argv: list[str]) -> int:
    notebook = nbformat.read(argv[1], as_version=4)
    with tempfile.TemporaryDirectory(prefix="g2c-floor-") as work:
        client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": work}})
        try:
            client.execute()
        except CellExecutionError as exc:
            print(f"floor: a cell raised: {str(exc).splitlines()[-1] if str(exc) else exc!r}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
