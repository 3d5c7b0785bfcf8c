"""`grader import nbgrader`: nbgrader's source notebook as an assignment, with nbgrader 0.9.6
itself (`nbgrader generate_assignment`, `nbgrader autograde`, in out/peers/nbgrader-venv from
`make peers`) as the oracle.

One fixture imports tests/importers/nbgrader/nb_demo.ipynb (autograded answers, visible and
hidden tests, a written answer, and cells that cannot be imported: a partial-credit test, a value
answer and its test, a manually graded code answer); one batch of submissions is graded once by
each grader. Honest submissions score per grade cell exactly as nbgrader scores them; each trick
that fools nbgrader (it runs the tests in the student's kernel and reads their outputs) loses here
the item it was hiding, with a message that says what was caught.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from grader import cells
from grader.assignment import Assignment
from grader.importers import ImportRefused, nbgrader, write_assignment

from conftest import ROOT
from importers.peers import peer_bin, peer_env

GRADER = [sys.executable, "-m", "grader.cli"]
SOURCE = ROOT / "tests" / "importers" / "nbgrader" / "nb_demo.ipynb"
NAME = "nb_demo"
IMPORTED = ("softplus_values", "softplus_hidden", "running_mean_random", "first_negative_none", "first_negative_index")
SCORES = """
import json, sys
from nbgrader.api import Gradebook
with Gradebook("sqlite:///" + sys.argv[1]) as gb:
    print(json.dumps({student: {g.name: g.score for g in gb.find_submission_notebook("nb_demo", "nb_demo", student).grades}
                      for student in sys.argv[2:]}))
"""

SOLUTION = {
    "softplus": "def softplus(x):\n    return np.logaddexp(0.0, x)\n",
    "running_mean": "def running_mean(x):\n    return np.cumsum(x, axis=0) / np.arange(1, x.shape[0] + 1)[:, None]\n",
    "first_negative": ("def first_negative(values):\n    for i, v in enumerate(values):\n        if v < 0:\n"
                       "            return i\n    return None\n"),
}
HONEST = {
    "solution": {},
    "partial": {   # right at 0 only, one column only, the last negative
        "softplus": "def softplus(x):\n    return np.log(2.0) + np.asarray(x) / 2\n",
        "running_mean": ("def running_mean(x):\n    return np.cumsum(x[:, :1], axis=0) / "
                         "np.arange(1, x.shape[0] + 1)[:, None]\n"),
        "first_negative": ("def first_negative(values):\n    found = [i for i, v in enumerate(values) if v < 0]\n"
                           "    return found[-1] if found else None\n"),
    },
    "crashes": {
        "softplus": "def softplus(x):\n    raise ValueError('not written yet')\n",
        "first_negative": "def first_negative(values):\n    return None\n",
    },
}
TRICKS = {   # name -> (functions, the items it hides, what our message on the first must say)
    "patched_isclose": ({"softplus": ("np.isclose = lambda *args, **kwargs: True\n"
                                      "np.allclose = lambda *args, **kwargs: True\n\n\n"
                                      "def softplus(x):\n    return x + 1\n")},
                        ("softplus_values", "softplus_hidden"), "it is False"),
    "always_equal": ({"first_negative": ("class Anything(int):\n    def __eq__(self, other):\n        return True\n"
                                         "    __hash__ = int.__hash__\n\n\n"
                                         "def first_negative(values):\n"
                                         "    return Anything(7) if any(v < 0 for v in values) else None\n")},
                     ("first_negative_index",), "holds a submission.Anything, compared as the built-in value it holds"),
    # every later cell of the kernel wrapped in `try: ... except Exception: pass`: no error is ever shown
    "silenced_errors": ({"running_mean": ("import ast\n\n\n"
                                          "class Quiet(ast.NodeTransformer):\n"
                                          "    def visit_Module(self, node):\n"
                                          "        handler = ast.ExceptHandler(type=ast.Name('Exception', ast.Load()), "
                                          "name=None, body=[ast.Pass()])\n"
                                          "        node.body = [ast.Try(body=node.body or [ast.Pass()], handlers=[handler], "
                                          "orelse=[], finalbody=[])]\n"
                                          "        return ast.fix_missing_locations(node)\n\n\n"
                                          "get_ipython().ast_transformers.append(Quiet())\n\n\n"
                                          "def running_mean(x):\n    return x\n")},
                        ("running_mean_random",), "Not equal to tolerance"),
}


def _fill(notebook: nbformat.NotebookNode, functions: dict[str, str]) -> nbformat.NotebookNode:
    """``notebook`` with each answer cell holding ``functions``' source (found by what the cell
    defines, or in nbgrader's release by its grade_id), and the value question answered."""
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        defined = re.findall(r"^def (\w+)\(", cells.source(cell), re.M) or [grade_id.removesuffix("_answer")]
        if defined[0] in functions:
            cell.source = functions[defined[0]]
        elif grade_id == "value_answer":
            cell.source = "answer = 6 * 7\n"
    return notebook


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader-import") / "course"
    done = subprocess.run([*GRADER, "import", "nbgrader", str(SOURCE), "--out", str(root)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return root, done


@pytest.fixture(scope="module")
def graded(imported, tmp_path_factory):
    """Every submission autograded by nbgrader and graded by `grader grade`: per item, the scores."""
    root, _ = imported
    nbgrader_bin = peer_bin("nbgrader-venv", "nbgrader")
    env = peer_env(nbgrader_bin)
    course = tmp_path_factory.mktemp("nbgrader-course")
    (course / "source" / NAME).mkdir(parents=True)
    shutil.copy(SOURCE, course / "source" / NAME / SOURCE.name)
    root_option = f"--CourseDirectory.root={course}"
    done = subprocess.run([str(nbgrader_bin), "generate_assignment", NAME, root_option], cwd=course,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0 and (course / "release" / NAME / SOURCE.name).is_file(), done.stderr[-3000:]
    release = nbformat.read(str(course / "release" / NAME / SOURCE.name), as_version=4)
    ours_student = nbformat.read(str(root / "assignments" / NAME / f"{NAME}.ipynb"), as_version=4)
    ours = course / "ours"
    ours.mkdir()
    names = {**HONEST, **{k: v[0] for k, v in TRICKS.items()}}
    for name, changes in names.items():
        functions = {**SOLUTION, **changes}
        (course / "submitted" / name / NAME).mkdir(parents=True)
        nbformat.write(_fill(nbformat.reads(nbformat.writes(release), as_version=4), functions),
                       str(course / "submitted" / name / NAME / SOURCE.name))
        nbformat.write(_fill(nbformat.reads(nbformat.writes(ours_student), as_version=4), functions),
                       str(ours / f"{name}.ipynb"))
    done = subprocess.run([str(nbgrader_bin), "autograde", NAME, "--create", root_option], cwd=course,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    read = subprocess.run([str(nbgrader_bin.with_name("python")), "-c", SCORES, str(course / "gradebook.db"), *names],
                          capture_output=True, text=True, env=env)
    assert read.returncode == 0, read.stderr[-2000:]
    theirs = json.loads(read.stdout)
    out = course / "ours-out"
    done = subprocess.run([*GRADER, "grade", str(ours), "--assignment", NAME, "--assignment-root", str(root),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    scores, results = {}, {}
    for name in names:
        results[name] = json.loads((out / name / "results.json").read_text())["tests"]
        scores[name] = {"nbgrader": {i: float(theirs[name][i]) for i in IMPORTED},
                        "ours": {i: sum(t["score"] for t in results[name] if i in t["tags"]) for i in IMPORTED}}
    return scores, results


def test_import_writes_an_assignment_that_validates(imported):
    root, done = imported
    assignment = Assignment(NAME, root)
    assert assignment.check_files() is None
    items = {i.name: (i.points, i.visibility) for i in assignment.rubric.items if i.name != "notebook_runs"}
    assert items == {"softplus_values": (2.0, "visible"), "softplus_hidden": (1.0, "hidden"),
                     "running_mean_random": (2.0, "visible"), "first_negative_none": (1.0, "visible"),
                     "first_negative_index": (2.0, "hidden")}
    (written,) = assignment.rubric.questions
    assert (written.id, written.points) == ("why_positive", 2.0)
    assert "Why is softplus never negative?" in written.criteria[0].earns
    template = "\n".join(cells.source(c) for c in assignment.template.cells)
    assert "np.logaddexp(0.0, x)\n" not in template and "log of a number above 1" not in template
    assert "first_negative([4, -1, -2])" not in template and "np.linspace(-30.0" not in template   # hidden
    assert "assert first_negative([1, 2, 3]) is None" in template                                  # visible
    for said in ("cell 14 (partial_credit): its last statement is an expression, whose value nbgrader reads as "
                 "partial credit", "cell 18 (value_answer): its solution is a value, not a function",
                 "test cell value_check: uses answer, which no imported cell defines",
                 "cell 20 (plot_answer): a manually graded code answer has no written-answer form here"):
        assert said in done.stderr
    checked = subprocess.run([*GRADER, "validate", "--assignment", NAME, "--assignment-root", str(root)], cwd=ROOT,
                             capture_output=True, text=True)
    assert checked.returncode == 0 and "validate: OK" in checked.stdout, checked.stdout + checked.stderr


def test_honest_submissions_score_per_item_as_nbgrader_does(graded):
    scores, _ = graded
    for name in HONEST:
        assert scores[name]["ours"] == scores[name]["nbgrader"], name
    assert sum(scores["solution"]["nbgrader"].values()) == 8
    assert scores["partial"]["nbgrader"] == {"softplus_values": 2.0, "softplus_hidden": 0.0,
                                             "running_mean_random": 0.0, "first_negative_none": 1.0,
                                             "first_negative_index": 0.0}
    assert scores["crashes"]["nbgrader"] == {"softplus_values": 0.0, "softplus_hidden": 0.0,
                                             "running_mean_random": 2.0, "first_negative_none": 1.0,
                                             "first_negative_index": 0.0}


def test_tricks_that_fool_nbgrader_lose_the_items_they_hide(graded):
    scores, results = graded
    for name, (_, items, said) in TRICKS.items():
        for item in items:
            assert scores[name]["nbgrader"][item] == scores["solution"]["nbgrader"][item], f"{name} no longer fools nbgrader"
            assert scores[name]["ours"][item] == 0, (name, item)
        (test,) = [t for t in results[name] if items[0] in t["tags"]]
        assert test["status"] == "failed" and said in test["output"], (name, test["output"])
        others = {i: s for i, s in scores[name]["ours"].items() if i not in items}
        assert others == {i: s for i, s in scores["solution"]["ours"].items() if i not in items}, name


def test_task_cells_and_other_forms_are_named_not_dropped(tmp_path):
    def marked(cell, **marks):
        cell.metadata["nbgrader"] = {"grade": False, "locked": False, "solution": False, "schema_version": 3, **marks}
        return cell

    notebook = nbformat.v4.new_notebook(cells=[
        marked(nbformat.v4.new_code_cell("import math"), grade_id="imports", locked=True),
        marked(nbformat.v4.new_code_cell("def area(r):\n    return math.pi * r * r\n"), grade_id="no_block",
               solution=True),
        marked(nbformat.v4.new_markdown_cell("Discuss."), grade_id="discuss", task=True, points=1),
        marked(nbformat.v4.new_code_cell("assert area(1) == math.pi"), grade_id="area_one", grade=True, points=0)])
    path = tmp_path / "odd.ipynb"
    nbformat.write(notebook, str(path))
    draft = nbgrader.read(path)
    assert draft.notes == [
        "cell 2 (no_block): it has no ### BEGIN SOLUTION block (nbgrader replaces such a cell whole): mark the "
        "solution inside its functions; not imported",
        "cell 3 (discuss): a task cell (graded by hand over the whole notebook) has no item here; the cell is kept "
        "as text",
        "cell 4 (area_one): a test worth no points, not imported"]
    with pytest.raises(ImportRefused, match="no question could be imported"):
        write_assignment(draft, tmp_path / "root")
    plain = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(plain))
    with pytest.raises(ImportRefused, match="not an nbgrader source notebook"):
        nbgrader.read(plain)
