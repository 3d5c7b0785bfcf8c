"""The reference solution as live code, for checks that need more than numpy.

The master notebook is trusted: its ``provided`` and ``scaffold`` cells (solutions included)
are executed once per process in the grader, never in the sandbox.
"""
from __future__ import annotations

import contextlib
import io
from functools import lru_cache
from pathlib import Path
from typing import Any

import nbformat

from grader import cells


def model_cells_source(notebook: nbformat.NotebookNode) -> str:
    """Source of the code cells tagged provided or scaffold, in notebook order."""
    return "\n\n".join(cells.source(c) for c in notebook.cells if c.cell_type == "code"
                       and ({cells.PROVIDED, cells.SCAFFOLD} & set(cells.tags(c))))


@lru_cache(maxsize=4)
def reference_namespace(master_path: Path) -> dict[str, Any]:
    """The master's model code executed in a fresh namespace (its prints are swallowed)."""
    master = nbformat.read(str(master_path), as_version=4)
    namespace: dict[str, Any] = {"__name__": "g2c_reference"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(model_cells_source(master), f"<reference {master_path.name}>", "exec"), namespace)
    return namespace
