"""grader assign: the committed student notebook is exactly what the master produces."""
from __future__ import annotations

import nbformat
import pytest

from grader import cells
from grader.assign import blank_answer, strip_solutions, student_notebook


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
