"""No module of the pipeline names an assignment: adding one is content, a rubric and a checks
package, never an edit to the toolkit. Only ``grader/checks/<name>/`` may know ``<name>``."""
from __future__ import annotations

import re
from pathlib import Path

from grader import cells
from grader.assignment import Assignment

from conftest import ROOT

ASSIGNMENTS = sorted(p.stem for p in (ROOT / "rubrics").glob("*.yaml") if not p.stem.endswith("_calibration"))


def _names_of(name: str) -> set[str]:
    """What would show that code knows this assignment: its name, its checks package, and the
    top-level names its students write (classes and functions of its scaffold cells)."""
    assignment = Assignment(name)
    owners = {owner for scaffold in cells.scaffolds(assignment.master) for owner in scaffold.owners}
    return {name, assignment.rubric.checks, *owners}


def test_there_are_several_assignments():
    assert len(ASSIGNMENTS) >= 2, ASSIGNMENTS


def test_no_pipeline_module_names_an_assignment():
    names = set().union(*(_names_of(name) for name in ASSIGNMENTS))
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    own = {ROOT / "grader" / "checks" / name for name in ASSIGNMENTS}
    found = []
    for path in sorted((ROOT / "grader").rglob("*")):
        if not path.is_file() or path.suffix not in {".py", ".j2", ".css", ".sh", ".yaml", ""}:
            continue
        if any(folder in path.parents for folder in own) or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in pattern.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    for path in sorted((ROOT / "gradescope").iterdir()):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)}" for m in pattern.finditer(line)]
    assert not found, "pipeline code names an assignment:\n" + "\n".join(found)
