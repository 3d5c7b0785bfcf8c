"""Scaffold cells are declared by the master notebook (``metadata.g2c.symbols``): load finds
the student's cells by those symbols, and the graft builds each one, for functions and for
``Class.method`` alike, for any number of scaffold cells."""
from __future__ import annotations

import copy

import nbformat
import numpy as np
import pytest
import torch

from grader import cells
from grader.assignment import Assignment
from grader.load import load_submission
from grader.graft import GraftError, submission_module_source
from grader.probe import ProbeCase

from conftest import write_notebook
from probe_in_process import probe_in_process

PROVIDED = "import math\nEPS = 1e-6\n"
FUNCTIONS = ("def scale(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n\n\n"
             "def shift(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n")
CLASS = ("class Counter:\n    start = 10\n\n    def helper(self):\n        return 'grader'\n\n"
         "    def bump(self, n):\n        ### BEGIN SOLUTION\n        return self.start + n\n        ### END SOLUTION\n")


def scaffold_cell(source: str, cell_id: str, symbols: list[str]) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.id = cell_id
    cell.metadata = {"tags": [cells.SCAFFOLD], "g2c": {"symbols": symbols}}
    return cell


def master() -> nbformat.NotebookNode:
    provided = nbformat.v4.new_code_cell(PROVIDED)
    provided.id, provided.metadata = "setup", {"tags": [cells.PROVIDED]}
    return nbformat.v4.new_notebook(cells=[
        provided, scaffold_cell(FUNCTIONS, "maths", ["scale", "shift"]),
        nbformat.v4.new_markdown_cell("Now the class."), scaffold_cell(CLASS, "counter", ["Counter.bump"])])


def student(*sources: str) -> nbformat.NotebookNode:
    """A notebook as an editor may leave it: other ids, no metadata, cells in any order."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    for index, cell in enumerate(notebook.cells):
        cell.id, cell.metadata = f"edited-{index}", {}
    return notebook


def test_the_declaration_is_read_and_checked():
    maths, counter = cells.scaffolds(master())
    assert (maths.cell_id, maths.owners, counter.owners) == ("maths", ("scale", "shift"), ("Counter",))
    assert counter.methods("Counter") == {"bump"} and maths.methods("scale") == frozenset()
    assert (maths.definition("scale"), counter.definition("Counter")) == ("def scale", "class Counter")
    broken = master()
    broken.cells[1].metadata["g2c"]["symbols"] = ["not a name"]
    with pytest.raises(ValueError, match="declares no valid metadata.g2c.symbols"):
        cells.scaffolds(broken)


def test_load_finds_each_scaffold_by_its_symbols_and_the_graft_builds_them(tmp_path):
    mine = ("import math\n\n\ndef _twice(x):\n    return x + x\n\n\n"
            "def scale(x):\n    return _twice(x)\n\n\ndef shift(x):\n    return x + math.floor(1.5)\n")
    klass = "class Counter:\n    start = 0\n\n    def helper(self):\n        return 'mine'\n\n    def bump(self, n):\n        return self.start + n + 1\n"
    path = write_notebook(student(PROVIDED, klass, "print('exercise')", mine), tmp_path / "s.ipynb")
    sub = load_submission(path, "s", master(), 2**20)
    assert sub.scaffold_problem is None and sub.scaffold_sources == {"maths": mine, "counter": klass}
    source, notes = submission_module_source(master(), sub.scaffold_sources)
    namespace: dict = {}
    exec(compile(source, "grafted", "exec"), namespace)
    assert (namespace["scale"](3), namespace["shift"](3)) == (6, 4)   # the student's functions
    counter = namespace["Counter"]()
    assert counter.helper() == "grader" and counter.start == 10       # the grader's other members
    assert counter.bump(1) == 12                                       # the student's method
    assert notes == []


def test_a_missing_scaffold_cell_costs_its_symbols_only(tmp_path):
    path = write_notebook(student(PROVIDED, "def scale(x):\n    return 2 * x\n"), tmp_path / "s.ipynb")
    sub = load_submission(path, "s", master(), 2**20)
    assert "no cell defines `class Counter`" in sub.scaffold_problem
    source, notes = submission_module_source(master(), sub.scaffold_sources)
    namespace: dict = {}
    exec(compile(source, "grafted", "exec"), namespace)
    assert namespace["scale"](2) == 4 and "Counter" not in namespace and "shift" not in namespace
    assert "the scaffold cell defines no shift" in notes
    assert "Counter.bump: not found in the notebook, not graded" in notes
    with pytest.raises(GraftError, match="not valid Python"):
        submission_module_source(master(), {"maths": "def scale(x):\n  return (", "counter": "class Counter: pass"})


def test_an_assignment_whose_notebooks_disagree_on_the_scaffold_cannot_run(tmp_path, assignment):
    assert assignment.check_files() is None
    for folder in ("solutions/la", "assignments/la", "rubrics"):
        (tmp_path / folder).mkdir(parents=True)
    template = copy.deepcopy(assignment.template)   # the session's own stays as it is
    for cell in template.cells:
        if cells.SCAFFOLD in cells.tags(cell):
            cell.metadata["g2c"]["symbols"] = ["LinearAttention.forward"]
    write_notebook(assignment.master, tmp_path / "solutions" / "la" / "la.ipynb")
    write_notebook(template, tmp_path / "assignments" / "la" / "la.ipynb")
    (tmp_path / "rubrics" / "la.yaml").write_text(assignment.rubric_path.read_text())
    assert "regenerate it with `grader assign`" in Assignment("la", tmp_path).check_files()


DEMO = "print('demo ran')\nRESULT = scale(21)\n"
DRAWS = ("import torch\n\n\ndef draw(n, generator):\n    return torch.randn(n, generator=generator, dtype=torch.float64)\n\n\n"
         "def halves(x):\n    return x[: len(x) // 2], x[len(x) // 2:].to(torch.float32)\n\n\n"
         "def refuse(n):\n    raise ValueError(f'no {n}')\n")


def test_the_harness_calls_declared_functions_by_name_with_no_assignment_code():
    """The harness's own ``call`` handler: arguments from arrays, literals and seeded (shared)
    generators, earlier results fed on, tuples split, dtypes reported; a demo cell is not part
    of the module the probe imports."""
    notebook = master()
    demo = nbformat.v4.new_code_cell(DEMO)
    demo.id, demo.metadata = "demo-run", {"tags": [cells.PROVIDED, cells.DEMO]}
    notebook.cells.append(demo)
    notebook.cells.append(scaffold_cell(DRAWS, "draws", ["draw", "halves", "refuse"]))
    scaffolds = {"maths": FUNCTIONS.replace("### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", ""),
                 "counter": CLASS, "draws": DRAWS}
    source, _ = submission_module_source(notebook, scaffolds)
    assert "demo ran" not in source and "RESULT" not in source
    call = {"dtype": "float64", "calls": [
        {"symbol": "draw", "args": [{"value": 4}, {"generator": 7, "shared": "g"}], "output": "a"},
        {"symbol": "draw", "args": [{"value": 4}, {"generator": 7, "shared": "g"}], "output": "b"},
        {"symbol": "draw", "args": [{"value": 4}, {"generator": 7}], "output": "fresh"},
        {"symbol": "halves", "args": [{"result": "a"}], "output": "parts"},
        {"symbol": "scale", "args": [{"array": "x"}], "output": "scaled"}]}
    cases = [ProbeCase("draws", "call", call, {"x": np.arange(3.0)}, ("a", "b", "fresh", "parts.1", "scaled")),
             ProbeCase("refuses", "call", {"calls": [{"symbol": "refuse", "args": [{"value": 3}], "output": "r"}]}, {})]
    result = probe_in_process(source, cases)
    assert result.import_status == "ok", result.import_error
    drawn = result.cases["draws"]
    assert drawn.status == "ok", drawn.error
    expected = torch.randn(4, generator=torch.Generator().manual_seed(7), dtype=torch.float64).numpy()
    np.testing.assert_array_equal(drawn.arrays["a"], expected)
    np.testing.assert_array_equal(drawn.arrays["fresh"], expected)
    assert not np.array_equal(drawn.arrays["b"], expected)          # the shared stream went on
    np.testing.assert_array_equal(drawn.arrays["parts.1"], expected[2:].astype(np.float32))
    np.testing.assert_array_equal(drawn.arrays["scaled"], [0.0, 2.0, 4.0])
    assert set(drawn.arrays) == {"a", "b", "fresh", "parts.1", "scaled"}   # parts.0 is not kept
    assert drawn.info["parts.1"] == {"type": "Tensor", "dtype": "float32", "shape": [2]}
    assert drawn.info["parts"] == {"type": "tuple", "length": 2}
    refused = result.cases["refuses"]
    assert refused.status == "error" and refused.error.startswith("ValueError: no 3 (in your code: raise ValueError")
