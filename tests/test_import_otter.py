"""`grader import otter`: otter-assign's master notebook as an assignment, with otter-grader
7.0.0 itself (`otter assign`, `otter run`, in out/peers/otter-venv from `make peers`) as the
oracle.

One fixture imports tests/importers/otter/otter_demo.ipynb (three autograded questions with
visible and hidden tests, per-test points, a doctest whose output counts, a manual question and
a question whose answer is a value, which cannot be imported); one batch of submissions is
graded once by each grader. Honest submissions score per question exactly as otter scores them;
each trick that fools otter (it runs the tests in the student's kernel) loses here the question it
was hiding, with a message that says what was caught.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from grader import cells
from grader.assignment import Assignment
from grader.importers import ImportRefused, otter

from conftest import ROOT, otter_master_requiring_g2c_tiny
from importers.peers import peer_bin, peer_env

GRADER = [sys.executable, "-m", "grader.cli"]
MASTER = ROOT / "tests" / "importers" / "otter" / "otter_demo.ipynb"
NAME = "otter_demo"
IMPORTED = ("q1", "q2", "q3")    # q4 is written, q5's answer is a value: neither is autograded here

SOLUTION = {
    "softplus": "def softplus(x):\n    return np.logaddexp(0.0, x)\n",
    "running_mean": "def running_mean(x):\n    return np.cumsum(x, axis=0) / np.arange(1, x.shape[0] + 1)[:, None]\n",
    "first_negative": ("def first_negative(values):\n    for i, v in enumerate(values):\n        if v < 0:\n"
                       "            return i\n    return None\n"),
}
# name -> the functions it writes differently from SOLUTION
HONEST = {
    "solution": {},
    "partial": {   # right at 0 only, one column only, the last negative: each passes one test of two
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
TRICKS = {   # name -> (functions, the question it hides, what our message must say)
    "patched_isclose": ({"softplus": ("np.isclose = lambda *args, **kwargs: True\n"
                                      "np.allclose = lambda *args, **kwargs: True\n\n\n"
                                      "def softplus(x):\n    return x\n")}, "q1", "it is False"),
    "always_equal": ({"first_negative": ("class Anything(int):\n    def __eq__(self, other):\n        return True\n"
                                         "    __hash__ = int.__hash__\n\n\n"
                                         "def first_negative(values):\n"
                                         "    return Anything(7) if any(v < 0 for v in values) else None\n")},
                     "q3", "holds a submission.Anything, compared as the built-in value it holds"),
    "silenced_doctest_report": ({"running_mean": ("import doctest\n"
                                                  "doctest.DocTestRunner.summarize = "
                                                  "lambda self, verbose=None: doctest.TestResults(0, 1)\n\n\n"
                                                  "def running_mean(x):\n    return x\n")}, "q2", "expected"),
}


def _fill(notebook: nbformat.NotebookNode, functions: dict[str, str]) -> nbformat.NotebookNode:
    """``notebook`` with each cell that defines one of ``functions`` holding that source instead,
    and otter's value question answered."""
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        defined = re.findall(r"^def (\w+)\(", cells.source(cell), re.M)
        if defined and defined[0] in functions:
            cell.source = functions[defined[0]]
        elif re.match(r"answer = ", cells.source(cell)):
            cell.source = "answer = 6 * 7\n"
    return notebook


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("otter-import") / "course"
    done = subprocess.run([*GRADER, "import", "otter", str(MASTER), "--out", str(root)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return root, done


@pytest.fixture(scope="module")
def otter_dist(tmp_path_factory):
    """`otter assign` of the same master: the student notebook and the autograder zip."""
    otter_bin = peer_bin("otter-venv", "otter")
    work = tmp_path_factory.mktemp("otter-assign")
    (work / MASTER.name).write_bytes(MASTER.read_bytes())
    done = subprocess.run([str(otter_bin), "assign", MASTER.name, "dist"], cwd=work, capture_output=True,
                          text=True, env=peer_env(otter_bin))
    assert done.returncode == 0, done.stderr[-2000:]
    (autograder,) = (work / "dist" / "autograder").glob("*.zip")
    return otter_bin, work / "dist" / "student" / MASTER.name, autograder


@pytest.fixture(scope="module")
def graded(imported, otter_dist, tmp_path_factory):
    """Every submission graded by `otter run` and by `grader grade`: per question, each one's scores."""
    root, _ = imported
    otter_bin, otter_student, autograder = otter_dist
    ours_student = nbformat.read(str(root / "assignments" / NAME / f"{NAME}.ipynb"), as_version=4)
    folder = tmp_path_factory.mktemp("otter-submissions")
    (folder / "ours").mkdir()
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for name, changes in {**HONEST, **{k: v[0] for k, v in TRICKS.items()}}.items():
        functions = {**SOLUTION, **changes}
        nbformat.write(_fill(nbformat.read(str(otter_student), as_version=4), functions),
                       str(folder / f"{name}.ipynb"))
        nbformat.write(_fill(nbformat.reads(nbformat.writes(ours_student), as_version=4), functions),
                       str(folder / "ours" / f"{name}.ipynb"))
        out = folder / f"otter-{name}"
        out.mkdir()
        done = subprocess.run([str(otter_bin), "run", "--no-logo", "-a", str(autograder), "-o", str(out),
                               str(folder / f"{name}.ipynb")], capture_output=True, text=True, env=peer_env(otter_bin))
        assert done.returncode == 0, done.stderr[-2000:]
        tests = json.loads((out / "results.json").read_text())["tests"]
        scores[name] = {"otter": {t["name"]: float(t["score"]) for t in tests if t["name"] in IMPORTED}}
    out = folder / "ours-out"
    done = subprocess.run([*GRADER, "grade", str(folder / "ours"), "--assignment", NAME, "--assignment-root",
                           str(root), "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {}
    for name in scores:
        results[name] = json.loads((out / name / "results.json").read_text())
        scores[name]["ours"] = {q: sum(t["score"] for t in results[name]["tests"] if q in t["tags"]) for q in IMPORTED}
    return scores, results


def test_import_writes_an_assignment_that_validates(imported):
    root, done = imported
    assignment = Assignment(NAME, root)
    assert assignment.check_files() is None
    items = {item.name: item for item in assignment.rubric.items}
    # otter's identity, points and visibility: q1's 2 points spread over its two tests, q2's list,
    # q3's 3 points after its second test's own 2
    assert {n: (i.points, i.visibility, i.tags) for n, i in items.items() if n != "notebook_runs"} == {
        "q1-1": (1.0, "visible", ("q1",)), "q1-2": (1.0, "hidden", ("q1",)),
        "q2-1": (1.0, "visible", ("q2",)), "q2-2": (2.0, "hidden", ("q2",)),
        "q3-1": (1.0, "hidden", ("q3",)), "q3-2": (2.0, "hidden", ("q3",))}
    assert items["notebook_runs"].points == 0
    (written,) = assignment.rubric.questions
    assert (written.id, written.points) == ("q4", 2.0)
    assert "Why is softplus never negative?" in written.criteria[0].earns
    assert "log of a number above 1 is positive" in assignment.reference_answers["q4"].answer
    student = cells.source
    template = "\n".join(student(c) for c in assignment.template.cells)
    assert "np.logaddexp" not in template and "log of a number above 1" not in template
    assert "q1-2" not in json.dumps(assignment.template.metadata) and "np.linspace(-30.0" not in template
    assert "running_mean(np.array([[1.0], [3.0], [8.0]])).tolist()" in template   # a visible test stays
    # what was not imported is named, with its cell and why
    assert re.search(r"cell \d+ \(question q5\): its solution is a value, not a function", done.stderr)
    assert "question q5" in done.stderr and "1 test(s) are not imported" in done.stderr
    assert "otter's prompt for question q4" in done.stderr
    checked = subprocess.run([*GRADER, "validate", "--assignment", NAME, "--assignment-root", str(root)], cwd=ROOT,
                             capture_output=True, text=True)
    assert checked.returncode == 0 and "validate: OK" in checked.stdout, checked.stdout + checked.stderr
    assert "0 of them (0%) decided in the sandbox" in checked.stdout
    bundle = subprocess.run([*GRADER, "gradescope-bundle", "--assignment", NAME, "--assignment-root", str(root),
                             "--out", str(root / "autograder.zip")], cwd=ROOT, capture_output=True, text=True)
    assert bundle.returncode == 0, bundle.stderr
    solved = root / "solved.ipynb"
    nbformat.write(_fill(assignment.template, SOLUTION), str(solved))
    ready = subprocess.run([*GRADER, "check", str(solved), "--run", "--assignment-root", str(root)], cwd=ROOT,
                           capture_output=True, text=True)
    assert ready.returncode == 0 and "READY" in ready.stdout, ready.stdout + ready.stderr


def test_honest_submissions_score_per_question_as_otter_does(graded):
    scores, _ = graded
    for name in HONEST:
        assert scores[name]["ours"] == scores[name]["otter"], name
    # and the batch is not trivial: the honest submissions differ from each other
    assert scores["solution"]["otter"] == {"q1": 2.0, "q2": 3.0, "q3": 3.0}
    assert scores["partial"]["otter"] == {"q1": 1.0, "q2": 1.0, "q3": 1.0}
    assert scores["crashes"]["otter"] == {"q1": 0.0, "q2": 3.0, "q3": 1.0}


def test_tricks_that_fool_otter_lose_the_question_they_hide(graded):
    scores, results = graded

    for name, (_, question, said) in TRICKS.items():
        full = scores["solution"]["otter"][question]
        assert scores[name]["otter"][question] == full, f"{name} no longer fools otter"
        assert scores[name]["ours"][question] < full, name
        failed = [t for t in results[name]["tests"] if question in t["tags"] and t["status"] == "failed"]
        assert failed and any(said in t["output"] for t in failed), (name, [t["output"] for t in failed])
        others = {q: s for q, s in scores[name]["ours"].items() if q != question}
        assert others == {q: s for q, s in scores["solution"]["ours"].items() if q != question}, name
    # the patches of numpy and doctest at the cell's top level are not taken, and the results say so
    for name in ("patched_isclose", "silenced_doctest_report"):
        assert "scaffold cell line 2: statement ignored by the grader" in results[name]["output"], name


def test_otter_markers_become_this_projects(tmp_path):
    text = ("def f(x):\n    y = x + 1  # SOLUTION\n    return y  # SOLUTION\n\n\ndef g(x):\n"
            "    # BEGIN SOLUTION NO PROMPT\n    return 2 * x\n    # END SOLUTION\n"
            '    """ # BEGIN PROMPT\n    return ...\n    """; # END PROMPT\n')
    assert otter.solution_markup(text) == (
        "def f(x):\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n\n\ndef g(x):\n"
        "    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n")
    assert otter.resolve_points(None, [None, None]) == [0.5, 0.5]
    assert otter.resolve_points(4, [1, None, None]) == [1.0, 1.5, 1.5]
    assert otter.resolve_points({"each": 2}, [None, 3]) == [2.0, 2.0]
    with pytest.raises(ValueError, match="more points"):
        otter.resolve_points(1, [2, None])


def test_otters_own_settings_are_named_not_taken(tmp_path):
    master = tmp_path / "seeded.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_raw_cell("# ASSIGNMENT CONFIG\nseed:\n  variable: rng_seed\n  autograder_value: 42\n"
                                 "export_cell: false\n"),
        nbformat.v4.new_code_cell("rng_seed = 90\nweights = [1, 2]  # SOLUTION"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport math")]), str(master))
    draft = otter.read(master)
    assert draft.name == "seeded" and draft.notes == [
        "config `export_cell`: otter's own setting, not imported",
        "config `seed`: otter's own setting, not imported (the grader seeds the global generators itself before "
        "each test)",
        "cell 2: solution markers outside a question: kept whole as provided code, with its solution",
        "cell 3, line 1: `%matplotlib inline` is IPython, not Python; not imported"]
    assert cells.source(draft.notebook.cells[-1]) == "import math"


def test_fenced_otter_cells_are_read_as_raw_cells(tmp_path):
    master = tmp_path / "fenced.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("```otter\n# BEGIN QUESTION\nname: q1\npoints: 2\n```"),
        nbformat.v4.new_code_cell("def double(x):\n    return 2 * x  # SOLUTION"),
        nbformat.v4.new_markdown_cell("```otter\n# BEGIN TESTS\n```"),
        nbformat.v4.new_code_cell("assert double(2) == 4"),
        nbformat.v4.new_markdown_cell("```otter\n# END TESTS\n```"),
        nbformat.v4.new_markdown_cell("```otter\n# END QUESTION\n```"),
        nbformat.v4.new_markdown_cell("Notes.\n\n```otter\n# BEGIN QUESTION\nname: q2\n```")]), str(master))
    draft = otter.read(master)
    assert [t.name for t in cells.test_cells(draft.notebook)] == ["q1"]
    assert cells.test_cells(draft.notebook)[0].points == 2.0
    assert draft.notes == ["cell 7: an otter fence inside a longer Markdown cell is not read (put it in a cell of "
                           "its own); the cell is kept as text"]


def test_a_notebook_that_is_not_otters_is_refused(tmp_path):
    plain = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(plain))
    with pytest.raises(ImportRefused, match="not an otter-assign master notebook"):
        otter.read(plain)
    done = subprocess.run([*GRADER, "import", "otter", str(plain), "--out", str(tmp_path / "r")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "not an otter-assign master notebook" in done.stderr


# ----------------------------------------------------------------------------- requirements, offline

def _import(master: Path, root: Path, wheels: Path, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    return subprocess.run([*GRADER, "import", "otter", str(master), "--out", str(root), "--name", name], cwd=ROOT,
                          capture_output=True, text=True, env=env)


def test_requirements_are_recorded_and_installed_once_per_content(tmp_path, wheels):
    master = otter_master_requiring_g2c_tiny(tmp_path / "src", "g2c_tiny==0.1  # the course's helpers\n")
    root = tmp_path / "course"
    done = _import(master, root, wheels, "tiny")
    assert done.returncode == 0, done.stderr
    assert (root / "requirements" / "tiny.txt").read_text() == "g2c_tiny==0.1\n"
    assert yaml.safe_load((root / "rubrics" / "tiny.yaml").read_text())["settings"] == {
        "imported_from": "otter-grader", "requirements": ["g2c_tiny==0.1"]}
    (env,) = (root / "envs").iterdir()
    assert (env / "site" / "g2c_tiny" / "__init__.py").read_text() == "ANSWER = 42\n"
    installed = (env / ".complete").stat().st_mtime_ns
    again = _import(master, root, wheels, "tiny_again")   # the same content: the same environment, not reinstalled
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (root / "envs").iterdir()] == [env.name]
    assert (env / ".complete").stat().st_mtime_ns == installed


def test_a_requirement_that_cannot_be_installed_stops_the_import(tmp_path, wheels):
    master = otter_master_requiring_g2c_tiny(tmp_path / "src", "g2c_tiny==0.1\ng2c_not_a_package==9.9\n")
    root = tmp_path / "course"
    done = _import(master, root, wheels, "tiny")
    assert done.returncode == 2
    assert "requirements cannot be installed (g2c_tiny==0.1, g2c_not_a_package==9.9)" in done.stderr
    assert "g2c_not_a_package" in done.stderr.split("cannot be installed", 1)[1].split(")", 1)[1]   # pip's reason
    assert not (root / "solutions").exists() and not any((root / "envs").iterdir())


def test_the_requirements_are_importable_in_every_sandboxed_run_and_named_in_the_results(tmp_path, wheels):
    """A master whose provided cell imports its requirement: the notebook's run and the probe's
    (which grades the test cell) both import it from the assignment's environment, mounted
    read-only on their PYTHONPATH; validate passes, a graded submission earns the test and its
    results name the requirements. An environment removed is installed again by validate (once),
    and one that cannot be installed stops it with pip's reason."""
    master = otter_master_requiring_g2c_tiny(tmp_path / "src")
    root = tmp_path / "course"
    assert _import(master, root, wheels, "tiny").returncode == 0
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    shutil.rmtree(root / "envs")   # validate installs it again, from the same offline folder
    checked = subprocess.run([*GRADER, "validate", "--assignment", "tiny", "--assignment-root", str(root)],
                             cwd=ROOT, capture_output=True, text=True, env=offline)
    assert checked.returncode == 0 and "validate: OK" in checked.stdout, checked.stdout + checked.stderr
    (env,) = (root / "envs").iterdir()
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    nbformat.write(nbformat.read(str(root / "solutions" / "tiny" / "tiny.ipynb"), 4), str(submissions / "ada.ipynb"))
    graded = subprocess.run([*GRADER, "grade", str(submissions), "--assignment", "tiny", "--assignment-root",
                             str(root), "--out", str(tmp_path / "out"), "--similarity", "off"],
                            cwd=ROOT, capture_output=True, text=True, env=offline)
    assert graded.returncode == 0, graded.stderr
    results = json.loads((tmp_path / "out" / "ada" / "results.json").read_text())
    assert {t["name"]: t["status"] for t in results["tests"]}["q1"] == "passed", results
    assert "requirements were installed for your code: g2c_tiny==0.1" in results["output"]
    assert [p.name for p in (root / "envs").iterdir()] == [env.name]   # installed once
    rubric = root / "rubrics" / "tiny.yaml"
    rubric.write_text(rubric.read_text().replace("g2c_tiny==0.1", "g2c_not_a_package==9.9"))
    refused = subprocess.run([*GRADER, "validate", "--assignment", "tiny", "--assignment-root", str(root)],
                             cwd=ROOT, capture_output=True, text=True, env=offline)
    assert refused.returncode == 2 and "requirements cannot be installed (g2c_not_a_package==9.9)" in refused.stderr
