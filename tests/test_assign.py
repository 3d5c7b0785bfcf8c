"""grader assign: the committed student notebook and check.py are exactly what the master,
the rubric and the public tests produce."""
from __future__ import annotations

import ast
import copy
import shutil
from pathlib import Path

import nbformat
import pytest

from grader import cells, cli
from grader.assign import (CHECK_SCRIPT, CHECK_TEMPLATE, PLAIN_LINE, SPEC_LINE, blank_answer, check_spec,
                           strip_solutions, student_notebook, write_student_files)
from grader.assignment import Assignment
from grader.report import terminal

from conftest import HONEST_TEXT, ROOT, TERMINAL_ATTACKS

ASSIGNMENTS = sorted(p.stem for p in (ROOT / "rubrics").glob("*.yaml") if not p.stem.endswith("_calibration"))


def test_committed_student_notebook_matches_a_fresh_assign(assignment):
    fresh = student_notebook(assignment.master)
    committed = nbformat.read(str(assignment.template_path), as_version=4)
    assert nbformat.writes(fresh) == nbformat.writes(committed), (
        "assignments/linear_attention/linear_attention.ipynb is out of date: run `make assign`")


def test_student_notebook_has_no_solutions_outputs_or_instructor_cells(assignment):
    student = student_notebook(assignment.master)
    master_ids = [c.id for c in assignment.master.cells if cells.INSTRUCTOR not in cells.tags(c)]
    assert [c.id for c in student.cells] == master_ids
    for cell in student.cells:
        text = cells.source(cell)
        assert "### BEGIN SOLUTION" not in text and "### END SOLUTION" not in text
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        if cells.QUESTION in cells.tags(cell):
            parsed = cells.parse_written_answer(cell)
            assert parsed is not None and parsed.question and parsed.is_blank, cell.id
    scaffold = next(c for c in student.cells if cells.SCAFFOLD in cells.tags(c))
    assert cells.source(scaffold).count("raise NotImplementedError(\"TODO:") == 2


def test_strip_solutions_keeps_indentation_and_todo_text():
    code = ("def f(x):\n    y = 1\n    ### BEGIN SOLUTION  compute the square\n    return x * x\n"
            "    ### END SOLUTION\n")
    assert strip_solutions(code) == ("def f(x):\n    y = 1\n"
                                     "    raise NotImplementedError(\"TODO: compute the square\")\n")


def test_todo_text_with_quotes_stays_valid_python():
    stripped = strip_solutions('### BEGIN SOLUTION  the "parallel" form\nx = 1\n### END SOLUTION\n')
    with pytest.raises(NotImplementedError, match='TODO: the "parallel" form'):
        exec(stripped, {})


def test_unterminated_solution_block_is_an_error():
    with pytest.raises(ValueError, match="END SOLUTION"):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n")


def test_blank_answer_keeps_the_question():
    code = '"""Question: why?"""\n"""Answer: because."""\n'
    blanked = blank_answer(code)
    parsed = cells.parse_written_answer(nbformat.v4.new_code_cell(blanked))
    assert parsed.question == "why?" and parsed.is_blank


def test_markdown_question_answer_cells_are_read():
    cell = nbformat.v4.new_markdown_cell("Question: What is S?\n\nAnswer: The state matrix.")
    parsed = cells.parse_written_answer(cell)
    assert parsed.question == "What is S?" and parsed.answer == "The state matrix."


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_committed_check_py_matches_a_fresh_assign(tmp_path, name, capsys):
    """`grader assign` regenerates both files elsewhere; the committed ones must be the same bytes."""
    assignment = Assignment(name)
    target = tmp_path / name / f"{name}.ipynb"
    assert cli.main(["assign", str(assignment.master_path), "--out", str(target)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {target}", f"wrote {target.parent / CHECK_SCRIPT}"]
    committed = assignment.template_path.parent / CHECK_SCRIPT
    assert (target.parent / CHECK_SCRIPT).read_text() == committed.read_text(), (
        f"{committed} is out of date: run `grader assign {assignment.master_path.relative_to(ROOT)}`")
    assert target.read_bytes() == assignment.template_path.read_bytes()


def test_check_py_carries_the_assignments_data(tmp_path):
    """What the generator embeds comes from the notebooks, rubric and public tests, never from a
    hand-kept table: a provided cell changed in the master shows in check.py's SPEC."""
    assignment = Assignment("linear_attention")
    spec = check_spec(assignment, student_notebook(assignment.master))
    assert spec["max_bytes"] == int(assignment.rubric.limits.notebook_max_mib * 2**20)
    assert spec["run"]["cell_timeout_s"] == assignment.rubric.limits.cell_timeout_s
    assert spec["run"]["env"]["G2C_GRADING"] == "1"
    assert [p["id"] for p in spec["provided"]] == [c.id for c in assignment.template.cells
                                                   if cells.PROVIDED in cells.tags(c)]
    assert [q["id"] for q in spec["questions"]] == [q.id for q in assignment.rubric.questions]
    assert spec["public_tests"] == {"folder": "tests", "env": "LA_NOTEBOOK", "needs": ["pytest", "torch"]}
    assert {"nbclient", "ipykernel", "torch"} <= set(spec["run"]["needs"])
    hyena = Assignment("linear_attention_hyena")
    assert check_spec(hyena, student_notebook(hyena.master))["public_tests"] is None
    # Re-runnable: a new provided cell in a copy of the project appears in its check.py.
    root = tmp_path / "project"
    for folder in ("solutions/linear_attention", "rubrics", "assignments/linear_attention/tests"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    master = nbformat.read(str(root / "solutions/linear_attention/linear_attention.ipynb"), as_version=4)
    master.cells.append(nbformat.v4.new_code_cell("# Provided: show the answers\nimport json\n",
                                                  metadata={"tags": ["provided"]}, id="show-answers"))
    nbformat.write(master, str(root / "solutions/linear_attention/linear_attention.ipynb"))
    notebook, script = write_student_files(root / "solutions/linear_attention/linear_attention.ipynb",
                                           root / "assignments/linear_attention/linear_attention.ipynb")
    assert script == root / "assignments/linear_attention" / CHECK_SCRIPT
    module = ast.parse(script.read_text())
    spec = next(ast.literal_eval(n.value) for n in module.body if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", None) == "SPEC")
    assert spec["provided"][-1] == {"id": "show-answers", "source": "# Provided: show the answers\nimport json\n"}
    assert spec["cell_order"][-1] == "show-answers"


def test_a_provided_cell_with_a_solution_block_is_refused():
    """check.py runs the provided cells, so a solution inside one would ship to students."""
    assignment = Assignment("linear_attention_hyena")
    master = copy.deepcopy(assignment.master)
    provided = next(c for c in master.cells if cells.PROVIDED in cells.tags(c))
    provided.source += "\n### BEGIN SOLUTION\nSECRET = 1\n### END SOLUTION\n"
    with pytest.raises(ValueError, match=f"provided cell {provided.id!r} holds a solution block"):
        check_spec(_with_master(assignment, master), student_notebook(master))


def _with_master(assignment: Assignment, master: nbformat.NotebookNode) -> Assignment:
    """``assignment`` whose master notebook is ``master`` (cached_property is a plain attribute)."""
    clone = Assignment(assignment.name, assignment.root)
    clone.__dict__["master"] = master
    return clone


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_check_py_carries_the_graders_own_sanitizer(name):
    """check.py cannot import the grader, so `grader assign` copies terminal.py's sanitizer into
    it: the same lines, from `# BEGIN plain` to `# END plain`, doing the same on hostile text."""
    def block(path: Path) -> str:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        begin = next(i for i, line in enumerate(lines) if line.startswith("# BEGIN plain"))
        end = next(i for i, line in enumerate(lines) if line == "# END plain\n")
        return "".join(lines[begin:end + 1])

    check_py = ROOT / "assignments" / name / CHECK_SCRIPT
    copy = block(check_py)
    assert copy == block(Path(terminal.__file__)) and "def plain(text: str) -> str:" in copy
    namespace = {}
    exec(compile("import re\n" + copy, str(check_py), "exec"), namespace)   # the copy alone, on `re` only
    for text in [hostile for hostile, _ in TERMINAL_ATTACKS.values()] + list(HONEST_TEXT):
        assert namespace["plain"](text) == terminal.plain(text), repr(text)


def test_the_template_has_one_spec_line_and_names_no_assignment():
    text = CHECK_TEMPLATE.read_text()
    assert text.count(SPEC_LINE) == 1 and text.count(PLAIN_LINE) == 1
    assert all(name not in text for name in ASSIGNMENTS)


def test_assign_refuses_a_master_outside_the_project_layout(tmp_path, capsys):
    master = tmp_path / "lone.ipynb"
    shutil.copy(Assignment("linear_attention").master_path, master)
    assert cli.main(["assign", str(master), "--out", str(tmp_path / "out" / "lone.ipynb")]) == 2
    assert "check.py needs the rubric" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
