"""Stage 1: every broken notebook becomes a readable reason, never an exception."""
from __future__ import annotations

import copy
import json

import nbformat

from grader import cells
from grader.load import load_submission

LIMIT = 5 * 2**20


def load(tmp_path, assignment, data: bytes, max_bytes: int = LIMIT):
    path = tmp_path / "sub.ipynb"
    path.write_bytes(data)
    return load_submission(path, "sub", assignment.template, max_bytes)


def master_json(assignment) -> dict:
    return json.loads(nbformat.writes(assignment.master))


def test_master_loads_with_scaffold_and_all_answers(tmp_path, assignment):
    sub = load(tmp_path, assignment, nbformat.writes(assignment.master).encode())
    assert sub.fatal is None and sub.scaffold_problem is None
    assert "def forward" in sub.scaffold_sources["linear-attention"]
    assert set(sub.answers) == {q.id for q in assignment.rubric.questions}
    assert not any(a.is_blank for a in sub.answers.values())


def test_invalid_json(tmp_path, assignment):
    sub = load(tmp_path, assignment, b'{"cells": [')
    assert "not valid JSON" in sub.fatal


def test_non_utf8_bytes(tmp_path, assignment):
    sub = load(tmp_path, assignment, b"\xff\xfe\x00junk\x81")
    assert "not UTF-8" in sub.fatal


def test_wrong_nbformat_version(tmp_path, assignment):
    data = master_json(assignment)
    data["nbformat"] = 3
    assert "unsupported notebook format 3" in load(tmp_path, assignment, json.dumps(data).encode()).fatal


def test_too_large(tmp_path, assignment):
    sub = load(tmp_path, assignment, b" " * 2048, max_bytes=1024)
    assert "over the" in sub.fatal and "MiB limit" in sub.fatal


def test_duplicate_cell_ids_are_repaired_with_a_note(tmp_path, assignment):
    data = master_json(assignment)
    data["cells"][3]["id"] = data["cells"][2]["id"]
    sub = load(tmp_path, assignment, json.dumps(data).encode())
    assert sub.fatal is None
    assert any("duplicate cell id" in n for n in sub.notes)


def test_missing_scaffold(tmp_path, assignment):
    notebook = copy.deepcopy(assignment.master)
    notebook.cells = [c for c in notebook.cells if cells.SCAFFOLD not in cells.tags(c)]
    sub = load(tmp_path, assignment, nbformat.writes(notebook).encode())
    assert sub.fatal is None and "no cell defines `class LinearAttention`" in sub.scaffold_problem


def test_renamed_scaffold_class_is_missing(tmp_path, assignment):
    notebook = copy.deepcopy(assignment.master)
    for cell in notebook.cells:
        if cells.SCAFFOLD in cells.tags(cell):
            cell.source = cells.source(cell).replace("class LinearAttention(", "class LinearAttn(")
    sub = load(tmp_path, assignment, nbformat.writes(notebook).encode())
    assert "no cell defines" in sub.scaffold_problem


def test_duplicated_scaffold_uses_the_last_with_a_note(tmp_path, assignment):
    notebook = copy.deepcopy(assignment.master)
    scaffold = next(c for c in notebook.cells if cells.SCAFFOLD in cells.tags(c))
    extra = nbformat.v4.new_code_cell(cells.source(scaffold) + "\n# second copy\n")
    notebook.cells.append(extra)
    sub = load(tmp_path, assignment, nbformat.writes(notebook).encode())
    assert sub.scaffold_sources["linear-attention"].endswith("# second copy\n")
    assert any("defined in 2 cells" in n for n in sub.notes)


def test_scaffold_with_syntax_error(tmp_path, assignment):
    notebook = copy.deepcopy(assignment.master)
    for cell in notebook.cells:
        if cells.SCAFFOLD in cells.tags(cell):
            cell.source = cells.source(cell) + "\n    def broken(:\n"
    sub = load(tmp_path, assignment, nbformat.writes(notebook).encode())
    assert "not valid Python" in sub.scaffold_problem


def test_answers_matched_by_question_text_when_metadata_is_lost(tmp_path, assignment):
    notebook = copy.deepcopy(assignment.master)
    for cell in notebook.cells:
        cell.metadata.pop("g2c", None)
    sub = load(tmp_path, assignment, nbformat.writes(notebook).encode())
    assert set(sub.answers) == {q.id for q in assignment.rubric.questions}
