"""Package-style submissions: a ``<id>/`` folder holding the notebook and/or the scaffold's
package file (the master's ``metadata.g2c.package_file``). Load, discovery, the digest and the
notes are tested in process; one real graded run (the example of examples/submissions/linear_attention/) checks
that the file is what the probe and the notebook run use."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import nbformat
import pytest

from grader import cells
from grader.intake import discover
from grader.graft import submission_module_source
from grader.load import load_submission, package_files
from grader.pipeline import _with_package_scaffolds
from grader.rubric import WRITTEN_TAG
from grader.score import result_from_json, score_items

from conftest import ROOT, write_notebook

EXAMPLE = ROOT / "examples" / "submissions" / "linear_attention" / "package_style"
PACKAGE_FILE = "g2c/linear_attention/attention.py"
# The exercises' functions (Exercises 1 to 4) have no package file: they are graded from the notebook.
GRADED_FROM = {"linear-attention": PACKAGE_FILE, "ex1-benchmark": "linear_attention.ipynb",
               "ex2-train": "linear_attention.ipynb", "ex3-recall": "linear_attention.ipynb",
               "ex4-decay": "linear_attention.ipynb"}
SOURCES_NOTE = (f"scaffold LinearAttention: from {PACKAGE_FILE}; scaffold decode_step_sweep: from linear_attention.ipynb; "
                "scaffold train_and_compare: from linear_attention.ipynb; "
                "scaffold train_recall, recall_accuracy: from linear_attention.ipynb; "
                "scaffold state_norms, learned_decays: from linear_attention.ipynb; "
                "exercises and answers: from linear_attention.ipynb")
PACKAGE_CODE = (EXAMPLE / PACKAGE_FILE).read_text(encoding="utf-8")
LIMIT = 5 * 2**20


def submission_folder(root: Path, notebook: nbformat.NotebookNode | None, package: str | bytes | None) -> Path:
    """``root`` holding ``linear_attention.ipynb`` and/or the package file (text or raw bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    if notebook is not None:
        write_notebook(notebook, root / "linear_attention.ipynb")
    if package is not None:
        target = root / PACKAGE_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(package.encode() if isinstance(package, str) else package)
    return root


def load(folder: Path, assignment, max_bytes: int = LIMIT):
    notebook = folder / "linear_attention.ipynb"
    return load_submission(notebook if notebook.exists() else None, folder.name, assignment.template,
                           max_bytes, folder)


def example_notebook() -> nbformat.NotebookNode:
    """The example's notebook: the reference exercises and answers, the scaffold cell a TODO."""
    return nbformat.read(str(EXAMPLE / "linear_attention.ipynb"), as_version=4)


def without_scaffold(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    notebook = copy.deepcopy(notebook)
    notebook.cells = [c for c in notebook.cells if cells.SCAFFOLD not in cells.tags(c)]
    return notebook


def test_the_master_declares_the_package_file(assignment):
    assert package_files(assignment.master) == package_files(assignment.template) == [PACKAGE_FILE]
    broken = copy.deepcopy(assignment.master)
    scaffold = next(c for c in broken.cells if cells.SCAFFOLD in cells.tags(c))
    for bad in ("../attention.py", "/g2c/attention.py", "g2c//attention.py", "g2c\\attention.py", 3):
        scaffold.metadata.g2c["package_file"] = bad
        with pytest.raises(ValueError, match="package_file"):
            cells.scaffolds(broken)


def test_package_file_only(tmp_path, assignment):
    sub = load(submission_folder(tmp_path / "alice", None, PACKAGE_CODE), assignment)
    assert sub.notebook is None and "the submission has no notebook" in sub.fatal
    assert sub.scaffold_problem is None and "class LinearAttention" in sub.scaffold_sources["linear-attention"]
    assert sub.sha256 == hashlib.sha256(PACKAGE_CODE.encode()).hexdigest()
    assert sub.sources == {"scaffolds": {"linear-attention": PACKAGE_FILE}, "notebook": None}
    assert f"scaffold LinearAttention: from {PACKAGE_FILE}; exercises and answers: no notebook" in sub.notes
    written = [i for i in score_items(assignment.rubric, {}, sub) if WRITTEN_TAG in i.tags]
    assert all(i.score == 0 and "the submission has no notebook" in i.output for i in written)


def test_notebook_only_folder_is_graded_as_a_lone_notebook(tmp_path, assignment):
    folder = submission_folder(tmp_path / "bob", assignment.master, None)
    sub = load(folder, assignment)
    alone = load_submission(folder / "linear_attention.ipynb", "bob", assignment.template, LIMIT)
    assert sub.sha256 == alone.sha256 == _sha256(folder / "linear_attention.ipynb")
    assert (sub.notes, sub.scaffold_sources, sub.sources) == (alone.notes, alone.scaffold_sources, {})


def test_the_package_file_wins_over_the_notebook_cell(tmp_path, assignment):
    folder = submission_folder(tmp_path / "carol", example_notebook(), PACKAGE_CODE)
    sub = load(folder, assignment)
    assert sub.fatal is None and sub.scaffold_problem is None
    assert "feature_map(self._split_heads" in sub.scaffold_sources["linear-attention"]   # not the TODO
    assert sub.replaced_cells == {"linear-attention": 6}
    assert any(f"in {PACKAGE_FILE} and in the notebook (cell 6): the package file wins" in n for n in sub.notes)
    assert SOURCES_NOTE in sub.notes
    assert sub.sources == {"scaffolds": GRADED_FROM, "notebook": "linear_attention.ipynb"}
    assert set(sub.answers) == {q.id for q in assignment.rubric.questions}
    graded = sorted(["linear_attention.ipynb", PACKAGE_FILE])
    lines = "".join(f"{name}\0{_sha256(folder / name)}\n" for name in graded)
    assert sub.sha256 == hashlib.sha256(lines.encode()).hexdigest()
    (folder / PACKAGE_FILE).write_text(PACKAGE_CODE + "\n# edited\n")
    assert load(folder, assignment).sha256 != sub.sha256


def test_course_package_imports_of_provided_names_are_not_noted(tmp_path, assignment):
    code = PACKAGE_CODE.replace(
        "import torch\n",
        "import torch\nfrom g2c.nn import (\n    LayerNorm,\n    my_helper,\n)\nfrom g2c.utils import shout\n"
        "from math import pi as EPS\n")
    sub = load(submission_folder(tmp_path / "dave", None, code), assignment)
    cell = sub.scaffold_sources["linear-attention"]
    assert cell.count("\n") == code.count("\n")   # the file's line numbers stay
    line = code.splitlines().index("class LinearAttention(Module):")
    assert cell.splitlines()[line] == "class LinearAttention(Module):"
    assert "from g2c.nn import my_helper  # the grader's provided code defines LayerNorm" in cell
    assert "\nfrom g2c.utils import shout\n" in cell
    source, notes = submission_module_source(assignment.master, sub.scaffold_sources)
    assert source.startswith("from __future__ import annotations\n")   # hoisted: it opens the module
    compile(source, "submission_code.py", "exec")
    assert "from g2c.utils import shout" in source   # not provided: it fails as it would in a cell
    assert notes == ["redefinition of provided EPS ignored; the grader uses its own copy",   # the folder has no notebook:
                     "decode_step_sweep: not found in the notebook, not graded",
                     "train_and_compare: not found in the notebook, not graded",
                     "train_recall, recall_accuracy: not found in the notebook, not graded",
                     "state_norms, learned_decays: not found in the notebook, not graded"]


@pytest.mark.parametrize("package, limit, reason", [
    (b"class LinearAttention(Module):\n    \xff\n", LIMIT, "is not UTF-8 text (byte 35)"),
    ("class LinearAttention(Module:\n    pass\n", LIMIT, "is not valid Python: line 1"),
    ("class LinearAttention(Module):\n    pass\n" + "#" * 4096, 2048, "over the 0 MiB limit"),
    ("class LinearAttn(Module):\n    pass\n", LIMIT, "defines no `class LinearAttention`"),
], ids=["not-utf8", "syntax-error", "too-large", "no-declared-symbol"])
def test_a_broken_package_file_has_a_reason(tmp_path, assignment, package, limit, reason):
    sub = load(submission_folder(tmp_path / "erin", assignment.master, package), assignment, limit)
    assert sub.scaffold_problem.startswith(PACKAGE_FILE) and reason in sub.scaffold_problem
    assert "linear-attention" not in sub.scaffold_sources   # the notebook's own (correct) cell does not stand in for it
    assert sub.sources["scaffolds"]["linear-attention"] == PACKAGE_FILE


def test_discovery_accepts_a_notebook_and_or_the_package_file(tmp_path, assignment):
    submission_folder(tmp_path / "both", example_notebook(), PACKAGE_CODE)
    submission_folder(tmp_path / "file_only", None, PACKAGE_CODE)
    submission_folder(tmp_path / "notebook_only", assignment.master, None)
    (tmp_path / "empty").mkdir()
    two = submission_folder(tmp_path / "two", assignment.master, PACKAGE_CODE)
    write_notebook(assignment.master, two / "copy.ipynb")
    found = {s.submission_id: s for s in discover([tmp_path], package_files(assignment.template))}
    assert (found["both"].path, found["both"].folder) == (tmp_path / "both" / "linear_attention.ipynb",
                                                          tmp_path / "both")
    assert (found["file_only"].path, found["file_only"].folder, found["file_only"].problem) == (
        None, tmp_path / "file_only", None)
    assert found["notebook_only"].problem is None
    assert found["empty"].problem == f"the folder holds no .ipynb notebook and no {PACKAGE_FILE}"
    assert found["two"].problem == ("the folder holds 2 notebooks (copy.ipynb, linear_attention.ipynb); "
                                    "submit exactly one")
    undeclared = {s.submission_id: s for s in discover([tmp_path])}
    assert undeclared["file_only"].problem == "the folder holds no .ipynb notebook"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_notebook_run_uses_the_package_code(tmp_path, assignment):
    """In the TODO cell's place, or where the master has the scaffold cell when the notebook has none."""
    for name, notebook in (("replaced", example_notebook()), ("inserted", without_scaffold(example_notebook()))):
        sub = load(submission_folder(tmp_path / name, notebook, PACKAGE_CODE), assignment)
        run = _with_package_scaffolds(sub, assignment.master)
        (index,) = [i for i, c in enumerate(run.cells) if "class LinearAttention" in cells.source(c)]
        assert cells.source(run.cells[index]) == sub.scaffold_sources["linear-attention"]
        assert [c.get("id") for c in run.cells[index - 1: index + 2]] == [
            "scaffold-intro", "linear-attention", "hybrid-intro"]


def test_the_package_style_example_gets_every_autograded_point(submission_grader, assignment):
    """The one real graded run: the probe grades the file, the notebook's exercises run on it."""
    result = submission_grader.grade(EXAMPLE / "linear_attention.ipynb", "package_style", EXAMPLE)
    autograded = [i for i in result.items if WRITTEN_TAG not in i.tags]
    assert [(i.name, i.output) for i in autograded if i.status != "passed"] == []
    assert sum(i.score for i in autograded) == sum(i.points for i in assignment.rubric.items)
    assert SOURCES_NOTE in result.notes
    assert not any("redefinition" in n for n in result.notes)
    data = json.loads(json.dumps(result.to_json()))
    assert data["extra_data"]["sources"] == {"scaffolds": GRADED_FROM,
                                             "notebook": "linear_attention.ipynb"}
    assert result_from_json(data).sources == result.sources
