"""assignments/<name>/check.py, the pre-submission check students run themselves.

check.py ships without the grader, so it carries its own small copy of the loader's rules and
``grader assign`` embeds the assignment's data in it (its SPEC: scaffolds, provided cells,
question fingerprints, limits). These tests keep the two from drifting: on a set of good and
broken notebooks of each assignment, check.py must reach the grader's own verdicts (load.py,
execute.py's provided-cell replacement, score.py's blank answers); it must name each missing
module in one line; and ``--run`` must report the cells that raise as grading runs them. The
end-to-end runs start together, each in a fresh interpreter, and cost a few seconds in all; on a
pseudo-terminal, no control character a notebook writes reaches the terminal.
(tests/test_assign.py fails when a committed check.py is not what ``grader assign`` writes.)
"""
from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import termios
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

from grader import cells, cli
from grader.sandbox import levels as sandbox_levels
from grader.assignment import PROJECT_ROOT, Assignment
from grader.execute import prepare_notebook
from grader.load import load_submission
from grader.score import score_items

from conftest import finish_all

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = ROOT / "assignments" / "linear_attention"
CHECK = ASSIGNMENT / "check.py"
REFERENCE = ROOT / "examples" / "submissions" / "linear_attention" / "reference.ipynb"
UNTOUCHED = ROOT / "examples" / "submissions" / "linear_attention" / "untouched.ipynb"
HYENA = "linear_attention_hyena"
HYENA_REFERENCE = ROOT / "examples" / "submissions" / HYENA / "reference.ipynb"
HIDDEN = (ROOT / "grader", ROOT / "rubrics", ROOT / "solutions")   # nothing check.py may open
TIMEOUT = 240


def load_check(name: str) -> ModuleType:
    """An assignment's check.py as a module (it is a script, not in a package); registered so
    dataclasses work."""
    spec = importlib.util.spec_from_file_location(f"check_{name}", ROOT / "assignments" / name / "check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = load_check("linear_attention")
CHECKS = {"linear_attention": check, HYENA: load_check(HYENA)}


def reference_json(path: Path = REFERENCE) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def edit_cell(data: dict, cell_id: str, change) -> dict:
    cell = next(c for c in data["cells"] if c.get("id") == cell_id)
    cell["source"] = change(cells.source(cell))
    return data


def without_scaffold(data: dict) -> dict:
    data["cells"] = [c for c in data["cells"] if cells.SCAFFOLD not in cells.tags(c)]
    return data


def with_edited_provided(data: dict) -> dict:
    return edit_cell(data, "setup", lambda s: s + "\nprint('my own line')\n")


def _drop_outputs(data: dict) -> dict:
    del data["cells"][1]["outputs"]
    return data


def _duplicate_id(data: dict) -> dict:
    data["cells"][3]["id"] = data["cells"][2]["id"]
    return data


def _second_scaffold(data: dict) -> dict:
    scaffold = next(c for c in data["cells"] if cells.SCAFFOLD in cells.tags(c))
    data["cells"].append({**copy.deepcopy(scaffold), "id": "my-copy", "metadata": {}})
    return data


def _delete(cell_id: str):
    def delete(data: dict) -> dict:
        data["cells"] = [c for c in data["cells"] if c.get("id") != cell_id]
        return data
    return delete


def _blank_answers(data: dict) -> dict:
    for cell_id in ("ex1-question", "explain-gate"):
        edit_cell(data, cell_id, lambda s: s[: s.index('"""Answer:')] + '"""Answer:   """\n')
    return data


def _strip_g2c(data: dict) -> dict:
    for cell in data["cells"]:
        cell["metadata"].pop("g2c", None)
    return data


def _markdown_answer(data: dict) -> dict:
    """A written answer rewritten as a markdown cell, its metadata lost: matched by its text."""
    index = next(i for i, c in enumerate(data["cells"]) if c.get("id") == "explain-hybrids")
    literals = [node.value.value for node in ast.parse(cells.source(data["cells"][index])).body]
    data["cells"][index] = {"cell_type": "markdown", "id": "explain-hybrids", "metadata": {},
                            "source": "\n\n".join(literals)}
    return data


def _second_answer_cell(data: dict) -> dict:
    """A copy of the first question cell at the end, under a new id: the first cell stays graded."""
    question = next(c for c in data["cells"] if cells.QUESTION in cells.tags(c))
    data["cells"].append({**copy.deepcopy(question), "id": "my-answer"})
    return data


def _rename_owner(old: str, new: str):
    def rename(data: dict) -> dict:
        for cell in data["cells"]:
            if cell["cell_type"] == "code":
                cell["source"] = re.sub(rf"\b{old}\b", new, cells.source(cell))
        return data
    return rename


def edited(edit, path: Path = REFERENCE):
    """A case made by editing a reference notebook's JSON."""
    return lambda: json.dumps(edit(reference_json(path))).encode()


# name -> the notebook's bytes, for the grader and check.py alike
CASES = {
    "reference": REFERENCE.read_bytes,
    "untouched": UNTOUCHED.read_bytes,
    "broken_json": lambda: b'{"cells": [{"cell_type": "code", "source": "x = ',
    "not_utf8": lambda: b"\xff\xfe\x00junk\x81",
    "not_a_notebook": lambda: b"[1, 2, 3]",
    "nbformat_3": edited(lambda data: {**data, "nbformat": 3}),
    "cell_not_an_object": edited(lambda data: {**data, "cells": [*data["cells"][:3], "x"]}),
    "schema_invalid": edited(_drop_outputs),
    "duplicate_ids": edited(_duplicate_id),
    "missing_scaffold": edited(without_scaffold),
    "renamed_class": edited(lambda data: edit_cell(data, "linear-attention", lambda s: s.replace(
        "class LinearAttention(", "class LinearAttn("))),
    "scaffold_syntax_error": edited(lambda data: edit_cell(data, "linear-attention",
                                                           lambda s: s + "\n    def broken(:\n")),
    "two_scaffolds": edited(_second_scaffold),
    "edited_provided": edited(with_edited_provided),
    "deleted_provided": edited(_delete("ex1-helpers")),
    "provided_as_one_string": edited(lambda data: edit_cell(data, "hybrid-model", str)),
    "blank_answers": edited(_blank_answers),
    "answers_without_metadata": edited(_strip_g2c),
    "deleted_answer": edited(_delete("ex4-question")),
    "markdown_answer": edited(_markdown_answer),
    "second_answer_cell": edited(_second_answer_cell),
}
# The other assignment: five scaffold cells of plain functions, provided demo cells, no public tests.
HYENA_CASES = {
    "reference": HYENA_REFERENCE.read_bytes,
    "untouched": (ROOT / "examples" / "submissions" / HYENA / "untouched.ipynb").read_bytes,
    "partly_wrong": (ROOT / "examples" / "submissions" / HYENA / "partly_wrong.ipynb").read_bytes,
    "edited_provided": edited(with_edited_provided, HYENA_REFERENCE),
    "deleted_demo": edited(_delete("demo-gating"), HYENA_REFERENCE),
    "missing_scaffolds": edited(without_scaffold, HYENA_REFERENCE),
    "renamed_function": edited(_rename_owner("gla_recurrent", "gla_rec"), HYENA_REFERENCE),
    "one_scaffold_twice": edited(_second_scaffold, HYENA_REFERENCE),
    "deleted_answer": edited(_delete("ex11-3-question"), HYENA_REFERENCE),
    "second_answer_cell": edited(_second_answer_cell, HYENA_REFERENCE),
    "answers_without_metadata": edited(_strip_g2c, HYENA_REFERENCE),
}
ALL_CASES = [("linear_attention", name) for name in sorted(CASES)] + [(HYENA, name) for name in sorted(HYENA_CASES)]


def grader_view(path: Path, assignment, max_bytes: int) -> dict:
    """What the grader decides about the notebook, in the terms check.py reports."""
    sub = load_submission(path, "case", assignment.template, max_bytes)
    view = {"fatal": sub.fatal, "notes": sub.notes, "scaffold_problem": sub.scaffold_problem,
            "scaffolds": sub.scaffold_sources}
    if sub.notebook is None:
        return view
    replaced: list[str] = []
    prepare_notebook(sub.notebook, assignment.master, replaced)
    view["edited"] = [m.group(1) for m in map(re.compile(r"provided cell '(.+)' was edited").match, replaced) if m]
    view["missing"] = [m.group(1) for m in map(re.compile(r"provided cell '(.+)' was missing").match, replaced) if m]
    by_item = {q.item_name: q.id for q in assignment.rubric.questions}
    written = {by_item[r.name]: r for r in score_items(assignment.rubric, {}, sub) if r.name in by_item}
    view["answered"] = sorted(q for q, r in written.items() if r.status == "pending_review")
    view["blank"] = sorted(q for q, r in written.items() if r.output.startswith("not submitted"))
    view["missing_answers"] = sorted(q for q, r in written.items() if "was not found" in r.output)
    return view


def check_view(path: Path, max_bytes: int, module: ModuleType = check) -> dict:
    findings = module.inspect_notebook(path, max_bytes)
    view = {"fatal": findings.fatal, "notes": findings.notes, "scaffold_problem": findings.scaffold_problem,
            "scaffolds": {cell_id: module._source(findings.cells[index])
                          for cell_id, index in findings.scaffold_cells.items()}}
    if findings.fatal is None:
        view.update(edited=findings.edited_provided, missing=findings.missing_provided,
                    answered=sorted(findings.answered), blank=sorted(findings.blank),
                    missing_answers=sorted(findings.missing_answers))
    return view


def _case_bytes(name: str, case: str) -> bytes:
    return (CASES if name == "linear_attention" else HYENA_CASES)[case]()


@pytest.mark.parametrize("name, case", ALL_CASES)
def test_check_agrees_with_the_grader(tmp_path, name, case):
    path = tmp_path / f"{case}.ipynb"
    path.write_bytes(_case_bytes(name, case))
    module = CHECKS[name]
    limit = module.NOTEBOOK_MAX_BYTES
    assert check_view(path, limit, module) == grader_view(path, Assignment(name), limit)


def test_check_agrees_on_the_size_limit(tmp_path, assignment):
    path = tmp_path / "big.ipynb"
    path.write_bytes(REFERENCE.read_bytes())
    limit = path.stat().st_size - 1
    view = check_view(path, limit)
    assert "MiB limit" in view["fatal"] and view == grader_view(path, assignment, limit)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_case_set_covers_every_verdict(tmp_path, name):
    """The agreement cases above exercise each kind of finding at least once, per assignment."""
    seen: dict[str, set] = {}
    for case in (CASES if name == "linear_attention" else HYENA_CASES):
        path = tmp_path / f"{case}.ipynb"
        path.write_bytes(_case_bytes(name, case))
        for key, value in check_view(path, CHECKS[name].NOTEBOOK_MAX_BYTES, CHECKS[name]).items():
            if value:
                seen.setdefault(key, set()).add(case)
    expected = {"notes", "scaffold_problem", "scaffolds", "edited", "missing", "answered", "blank", "missing_answers"}
    assert set(seen) == expected | ({"fatal"} if name == "linear_attention" else set())
    assert "edited_provided" in seen["edited"]
    assert "second_answer_cell" in seen["notes"]
    if name == "linear_attention":
        assert "provided_as_one_string" not in seen["edited"]


def test_written_answers_are_read_as_the_grader_reads_them(assignment):
    for notebook in (assignment.master, assignment.template, nbformat.reads(UNTOUCHED.read_text(), 4)):
        for cell in notebook.cells:
            parsed = cells.parse_written_answer(cell)
            assert check.parse_written_answer(cell) == ((parsed.question, parsed.answer) if parsed else None)


def test_todos_are_listed_per_scaffold_symbol_and_exercise_cell(tmp_path):
    """A scaffold function still raising its TODO, a method missing, an exercise cell with a TODO:
    each named, and the notebook is not ready however the public tests went."""
    hyena = CHECKS[HYENA]
    data = edit_cell(reference_json(HYENA_REFERENCE), "decay-masks",
                     lambda s: s + "\n\ndef gla_decay_mask(log_gates):\n    raise NotImplementedError('TODO')\n")
    data["cells"].append({"cell_type": "code", "id": "mine", "metadata": {}, "outputs": [], "execution_count": None,
                          "source": "# my exercise\nraise NotImplementedError"})
    path = tmp_path / "todo.ipynb"
    path.write_text(json.dumps(data))
    findings = hyena.inspect_notebook(path)
    scaffold_lines, exercise_lines = hyena.todos(findings)
    # cells named one way throughout: by their place among the code cells, with their first line
    assert scaffold_lines == ["still TODO (raises NotImplementedError) in code cell 9 "
                              "(`def retnet_decay_mask(length: int, gamma):`): gla_decay_mask"]
    code_cells = sum(c["cell_type"] == "code" for c in data["cells"])
    assert exercise_lines == [f"code cell {code_cells} (`# my exercise`)"]
    ready, line = hyena.verdict(findings, None, None)
    assert not ready and line == "NOT READY: TODOs are left that raise NotImplementedError (see above)."
    data = edit_cell(reference_json(), "linear-attention", lambda s: s.replace("def step(", "def stepp("))
    path.write_text(json.dumps(data))
    assert check.todos(check.inspect_notebook(path))[0] == [
        "not defined in code cell 4 (`class LinearAttention(Module):`): LinearAttention.step"]


def missing_block(out: str) -> list[str]:
    """check.py's lines about missing modules: the MISSING line and the indented lines under it."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("MISSING:")), len(lines))
    block = lines[start:start + 1]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return block


@pytest.mark.parametrize("name, modules, run", [
    ("linear_attention", {"torch"}, False), ("linear_attention", {"pytest", "torch"}, False),
    ("linear_attention", {"pytest", "torch", "nbclient", "ipykernel"}, False),
    ("linear_attention", {"pytest", "nbformat", "ipykernel"}, True),
    ("linear_attention_hyena", {"nbclient", "ipykernel"}, True), ("linear_attention_hyena", {"torch"}, False)])
def test_every_missing_module_is_named_at_once(monkeypatch, capsys, name, modules, run):
    """One round: every module that the public tests or --run need and this Python lacks is named
    before anything else, whether or not this run uses it, each with the parts that need it, and
    one command installs them all. A part that lacks one does not start (the notebook is then not
    ready); the loading checks still run on the standard library."""
    module = CHECKS[name]
    monkeypatch.setattr(module, "installed", lambda m: m not in modules)
    path = REFERENCE if name == "linear_attention" else HYENA_REFERENCE
    status = module.main([str(path), *(["--run"] if run else [])])
    out = capsys.readouterr().out
    missing = sorted(modules)
    tests_need = sorted(modules & {"pytest", "torch"}) if name == "linear_attention" else []
    run_needs = sorted(modules & {"nbformat", "nbclient", "ipykernel", "torch"})
    assert missing_block(out) == [
        f"MISSING: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this Python "
        f"({sys.executable})",
        *([f"the public tests need: {', '.join(tests_need)}"] if tests_need else []),
        *([f"--run and your notebook need: {', '.join(run_needs)}"] if run_needs else []),
        f"install them all at once: {sys.executable} -m pip install {' '.join(missing)}"], out
    assert out.index("MISSING:") < out.index("Reading the notebook as the grader will"), out
    assert sum(line.startswith("MISSING") for line in out.splitlines()) == 1, out
    assert "Written answers: 10 of 10 answered" in out or name == HYENA
    if tests_need:
        assert f"PROBLEM: not run: {', '.join(tests_need)} {'is' if len(tests_need) == 1 else 'are'} not installed " \
               "(see MISSING above)" in out, out
        assert status == 1 and out.rstrip().endswith("NOT READY: the public tests could not run (see above)."), out
    elif run:
        assert f"PROBLEM: not run: {', '.join(run_needs)} are not installed (see MISSING above)" in out, out
        assert status == 1 and out.rstrip().endswith("NOT READY: the notebook could not be run (see above)."), out
    else:   # what is missing serves --run only, which was not asked for
        assert status == 0 and "PROBLEM" not in out and out.rstrip().splitlines()[-1].startswith("READY"), out


def test_nothing_missing_says_nothing_about_modules(capsys):
    """Where every module is installed, the check starts with the notebook."""
    module = CHECKS["linear_attention"]
    assert module.missing_modules() == {}
    module.report_modules({})
    assert capsys.readouterr().out == ""


def _code(cell_id: str, source: str) -> dict:
    return {"cell_type": "code", "id": cell_id, "metadata": {}, "outputs": [], "execution_count": None,
            "source": source.splitlines(keepends=True)}


def test_run_reports_the_cells_that_raise_as_grading_runs_them(tmp_path, capsys):
    """One real --run (the fast assignment, in process; nbclient starts the kernel): the grader's
    copy of an edited provided cell runs and a deleted one is put back, the kernel sees
    G2C_GRADING=1 and a fresh working folder, and a cell that raises is named by its place among
    the code cells, its first line and its execution count; the cells after it still run."""
    hyena = load_check(HYENA)
    data = edit_cell(reference_json(HYENA_REFERENCE), "setup", lambda s: "raise RuntimeError('edited')\n" + s)
    data = _delete("demo-gating")(data)
    (tmp_path / "stories.txt").write_text("next to the notebook")
    at = next(i for i, c in enumerate(data["cells"]) if c.get("id") == "ex11-1-question")
    data["cells"][at:at] = [
        _code("env", "import os\nassert os.environ.get('G2C_GRADING') == '1', os.environ.get('G2C_GRADING')\n"
                     "assert not os.path.exists('stories.txt'), os.getcwd()"),
        _code("bill", "# Exercise 5: the memory bill\nBILL = 1 / 0"),
    ]
    path = tmp_path / "run.ipynb"
    path.write_text(json.dumps(data))
    assert hyena.main([str(path), "--run"]) == 1
    out = capsys.readouterr().out
    section = out[out.index("Running the notebook as the grader will"):]
    code_cells = [c for c in data["cells"] if c["cell_type"] == "code"]
    bill = 1 + next(i for i, c in enumerate(code_cells) if c["id"] == "bill")
    # the demo cell is put back after it, so every code cell before it ran once: In [n] is n
    assert f"RAISES code cell {bill} (`# Exercise 5: the memory bill`), In [{bill}]\n" \
           "      ZeroDivisionError: division by zero" in section, section
    assert "RuntimeError" not in section and "`import os`" not in section, section
    assert f"{len(code_cells) + 1} code cells" in section and "1 raised or timed out, 0 did not run" in section
    assert out.rstrip().endswith(f"NOT READY: 1 of {len(code_cells) + 1} code cells raise, time out or do not "
                                 "run when the grader runs the notebook (see above)."), out
    assert os.environ.get("G2C_GRADING") is None   # the kernel's environment, not the check's


def test_run_stops_after_a_second_time_out_in_a_row(tmp_path, capsys, monkeypatch):
    """As the grader's driver: a cell over the per-cell limit is interrupted and reported, and a
    second one in a row means the kernel is hung, so the cells after it do not run."""
    hyena = load_check(HYENA)
    monkeypatch.setitem(hyena.SPEC["run"], "cell_timeout_s", 3)
    monkeypatch.setattr(hyena, "PROVIDED", {})   # a notebook of its own: no provided cell to put back
    notebook = {"cells": [_code("a", "x = 1"), _code("b", "import time\ntime.sleep(60)"),
                          _code("c", "time.sleep(60)"), _code("d", "y = 2")],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "slow.ipynb"
    path.write_text(json.dumps(notebook))
    run = hyena.run_notebook(hyena.inspect_notebook(path), hyena.missing_modules())
    assert [(c.label, c.status, c.execution_count) for c in run.cells] == [
        ("code cell 2 (`import time`)", "timeout", 2), ("code cell 3 (`time.sleep(60)`)", "timeout", 3),
        ("code cell 4 (`y = 2`)", "not_run", None)]
    assert run.kernel == "hung" and "3 s cell limit" in run.cells[0].error
    hyena.report_graded(hyena.inspect_notebook(path), run)
    assert ("NOT RUN: code cell 4 (`y = 2`), because the kernel hung"
            in capsys.readouterr().out)


def test_prepare_cells_puts_provided_cells_back_where_grading_does(tmp_path):
    """The cells --run executes are those grading executes: execute.prepare_notebook's order,
    sources and cell types, for a deleted, an edited and a moved provided cell."""
    data = _delete("ex2-data-helpers")(with_edited_provided(reference_json()))
    moved = next(c for c in data["cells"] if c.get("id") == "ex1-helpers")
    data["cells"].remove(moved)
    data["cells"].append(moved)
    path = tmp_path / "moved.ipynb"
    path.write_text(json.dumps(data))
    findings = check.inspect_notebook(path)
    ours = [(c.get("id"), c["cell_type"], c["source"]) for c, _ in check.prepare_cells(findings)]
    graders = prepare_notebook(nbformat.reads(path.read_text(), 4), Assignment("linear_attention").master, [])
    assert ours == [(c.get("id"), c.cell_type, cells.source(c)) for c in graders.cells]
    origins = [index for _, index in check.prepare_cells(findings)]
    assert origins.count(None) == 1 and origins[[c[0] for c in ours].index("ex2-data-helpers")] is None


def test_run_leaves_out_the_test_cells_as_grading_does(tmp_path, capsys):
    """A new assignment's visible test cells stay in the student's notebook; grading's run leaves
    them out (the probe decides each as an item), and so does --run: the cells it executes are
    grading's, and its summary says the test cells were left out and why."""
    from grader.assign import new_assignment
    new_assignment("fresh", tmp_path)
    assignment = Assignment("fresh", tmp_path)
    spec = importlib.util.spec_from_file_location("check_fresh", tmp_path / "assignments" / "fresh" / "check.py")
    fresh = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fresh
    spec.loader.exec_module(fresh)
    student = assignment.template_path
    tests = [c.get("id") for c in assignment.template.cells if cells.TEST in cells.tags(c)]
    assert tests, "a new assignment's notebook keeps its visible test cells"
    findings = fresh.inspect_notebook(student)
    ours = [c.get("id") for c, _ in fresh.prepare_cells(findings)]
    graders = prepare_notebook(nbformat.read(str(student), 4), assignment.master, [])
    assert ours == [c.get("id") for c in graders.cells] and not set(tests) & set(ours)
    fresh.report_graded(findings, fresh.NotebookRun(code_cells=len(ours), test_cells=len(tests)))
    assert (f"({len(tests)} test cell{'s' if len(tests) != 1 else ''} left out, as the grader's run leaves them out"
            in capsys.readouterr().out)

VISIBLE_TESTS = (  # visible test cells added to a new assignment: an author's message, a doctest
    ("mean_square_message", 'assert mean_square(np.full(3, 2.0)) == 4.0, "the mean of squares of twos is 4"\n'),
    ("mean_square_doctest", '">>> mean_square(np.array([2.0]))\\n4.0\\n"\n'),
)


def test_visible_test_cells_are_run_by_the_check_with_their_authors_messages(tmp_path):
    """Without --run, a new assignment's check cannot run its visible test cells (they call the
    student's code), so it never says READY; with --run it runs each after the notebook, as
    shipped, and a failure names the line and carries the author's message (or doctest's
    report); a correct notebook passes them all and is READY."""
    from grader.assign import new_assignment, write_student_files
    new_assignment("fresh", tmp_path)
    master_path = tmp_path / "solutions" / "fresh" / "fresh.ipynb"
    master = nbformat.read(str(master_path), 4)
    for name, source in VISIBLE_TESTS:
        master.cells.append(nbformat.v4.new_code_cell(source, id=name.replace("_", "-"), metadata={
            "tags": [cells.TEST], "g2c": {"test": {"name": name, "points": 1, "visibility": "visible",
                                                  "tags": ["values"]}}}))
    nbformat.write(master, str(master_path))
    student_path = tmp_path / "assignments" / "fresh" / "fresh.ipynb"
    write_student_files(master_path, student_path)
    student = nbformat.read(str(student_path), 4)
    scaffold = next(c for c in student.cells if c.get("id") == "mean-square")
    scaffold.source = "def mean_square(x):\n    return float(np.mean(x))\n"   # the mean, not of the squares
    nbformat.write(student, str(tmp_path / "wrong.ipynb"))
    scaffold.source = "def mean_square(x):\n    return float((x * x).sum() / x.size)\n"
    nbformat.write(student, str(tmp_path / "right.ipynb"))

    def check(notebook: str, *flags: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, str(student_path.parent / "check.py"), str(tmp_path / notebook),
                               *flags], capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout

    status, out = check("wrong.ipynb")
    assert status == 1 and "NOT CHECKED: the 3 visible tests call your code" in out, out
    assert "READY" not in out.replace("NOT READY", "")
    status, out = check("wrong.ipynb", "--run")
    assert status == 1 and "NOT READY: 3 of 3 visible tests fail" in out, out
    assert "line 1, `assert mean_square(np.array([3.0, 4.0])) == 12.5`: AssertionError" in out
    assert ("line 1, `assert mean_square(np.full(3, 2.0)) == 4.0, \"the mean of squares of twos is 4\"`: "
            "AssertionError: the mean of squares of twos is 4") in out
    assert "FAILED mean_square_doctest\n      AssertionError: Line 1, in mean_square_doctest Failed example: " \
           "mean_square(np.array([2.0])) Expected: 4.0 Got: 2.0" in out, out
    assert "RAISES" not in out, "a failing test is the test's, never a cell of the notebook"
    status, out = check("right.ipynb", "--run")
    assert status == 0 and "all 3 visible tests pass" in out and "3 passed, 0 failed" in out, out



# --- end to end: check.py and `grader check` as subprocesses -----------------------------------

# Installed by PYTHONPATH into each check.py run and the pytest it starts: logs any open of a
# file under HIDDEN and any import of the grader, and makes the modules of G2C_BLOCKED unimportable.
AUDIT_SITE = textwrap.dedent('''
    import os
    import sys

    _LOG = open(os.environ["G2C_AUDIT_LOG"], "a", encoding="utf-8")
    _HIDDEN = tuple(p + os.sep for p in os.environ["G2C_AUDIT_HIDDEN"].split(os.pathsep))
    _BLOCKED = set(filter(None, os.environ.get("G2C_BLOCKED", "").split(",")))

    def _audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(_HIDDEN):
                _LOG.write(f"{os.getpid()} opened {path}\\n")
                _LOG.flush()
        elif event == "import" and args[0].split(".")[0] == "grader":
            _LOG.write(f"{os.getpid()} imported {args[0]}\\n")
            _LOG.flush()

    class _Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in _BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.addaudithook(_audit)
    sys.meta_path.insert(0, _Blocker())
''')


# Appended to the scaffold cell, so the public tests' conftest runs it as it loads the notebook:
# it writes a file into $HOME and wherever else the TA's files live and prints the environment
# (pytest captures that), then replaces feature_map with one that fails with what it found, in
# the one line of the failure that check.py shows.
HOSTILE = textwrap.dedent('''
    import json as _json, os as _os

    _written = []
    for _folder in [_os.environ.get("HOME", ""), *{targets!r}]:
        try:
            with open(_os.path.join(_folder, {marker!r}), "w") as _f:
                _f.write("written by the notebook")
            _written.append(_folder)
        except OSError:
            pass
    print(dict(_os.environ))
    _found = {{"key": "ANTHROPIC_API_KEY" in _os.environ, "home": _os.environ.get("HOME"), "wrote": _written}}

    def feature_map(x):
        raise AssertionError("G2C-ENV " + _json.dumps(_found))
''')
MARKER = "g2c-hostile.txt"
SENTINEL = "sk-ant-g2c-sentinel-do-not-leak"


class Run:
    """One finished subprocess."""

    def __init__(self, name: str, returncode: int, output: str, audit: str):
        self.name, self.returncode, self.output, self.audit = name, returncode, output, audit

    def context(self) -> str:
        return f"output of run {self.name!r} (exit {self.returncode}):\n{self.output[-6000:]}"


@pytest.fixture(scope="module")
def ta(tmp_path_factory) -> dict[str, Path]:
    """A TA's fresh HOME, TMPDIR and working directory, and the folder of the notebook they check."""
    work = tmp_path_factory.mktemp("ta")
    folders = {folder: work / folder for folder in ("home", "tmp", "cwd", "submitted")}
    for folder in folders.values():
        folder.mkdir()
    return folders


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ta) -> dict[str, Run]:
    work = tmp_path_factory.mktemp("check")
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT_SITE, encoding="utf-8")
    broken = work / "broken.ipynb"
    broken.write_bytes(CASES["broken_json"]())
    edited = work / "edited.ipynb"
    edited.write_text(json.dumps(with_edited_provided(reference_json())), encoding="utf-8")
    no_scaffold = work / "no_scaffold.ipynb"
    no_scaffold.write_text(json.dumps(without_scaffold(reference_json())), encoding="utf-8")
    # What a student receives, away from the repository, with a Python that has neither the
    # grader nor nbformat.
    shipped = work / "shipped"
    shutil.copytree(ASSIGNMENT, shipped / "linear_attention",
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copy(REFERENCE, shipped / "submission.ipynb")
    # A TA running `grader check` on a hostile notebook, an API key in their environment.
    hostile = ta["submitted"] / "hostile.ipynb"
    code = HOSTILE.format(targets=[*map(str, ta.values()), str(ASSIGNMENT), str(ROOT)], marker=MARKER)
    hostile.write_text(json.dumps(edit_cell(reference_json(), "linear-attention", lambda s: s + code)),
                       encoding="utf-8")
    ta_env = {"HOME": str(ta["home"]), "TMPDIR": str(ta["tmp"]), "ANTHROPIC_API_KEY": SENTINEL}

    python = [sys.executable]
    plans = {  # name -> (command, cwd, blocked modules or None for no audit, environment set)
        "reference": (python + [str(CHECK), str(REFERENCE)], ROOT, "", {}),
        "untouched": (python + [str(CHECK), str(UNTOUCHED)], ROOT, "", {}),
        "broken": (python + [str(CHECK), str(broken)], ROOT, "", {}),
        "edited": (python + [str(CHECK), str(edited)], ROOT, "", {}),
        "no_scaffold": (python + [str(CHECK), str(no_scaffold)], ROOT, "", {}),
        "standalone": (python + [str(shipped / "linear_attention" / "check.py"), "../submission.ipynb"],
                       shipped / "linear_attention", "grader,nbformat", {}),
        "standalone_import": (python + ["-c", "import grader"], shipped, "grader,nbformat", {}),
        "no_torch": (python + [str(shipped / "linear_attention" / "check.py"), "../submission.ipynb"],
                     shipped / "linear_attention", "grader,nbformat,torch", {}),
        "grader_check": (python + ["-m", "grader.cli", "check", str(REFERENCE), "--assignment", "linear_attention"],
                         ROOT, None, {}),
        "grader_check_hostile": (python + ["-m", "grader.cli", "check", str(hostile), "--assignment",
                                           "linear_attention"], ta["cwd"], None, ta_env),
        # no --assignment: the notebook's cell ids say it is the hyena assignment's
        "grader_check_run": (python + ["-m", "grader.cli", "check", str(HYENA_REFERENCE), "--run"], ROOT, None, {}),
    }
    started = {}
    for name, (command, cwd, blocked, extra_env) in plans.items():
        env = {k: v for k, v in os.environ.items() if k not in ("LA_NOTEBOOK", "PYTHONPATH", "PYTEST_ADDOPTS")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the shipped folder
        env.update(extra_env)
        log = work / f"{name}.audit"
        log.write_text("")
        if blocked is not None:
            env.update(PYTHONPATH=str(site), G2C_AUDIT_LOG=str(log), G2C_BLOCKED=blocked,
                       G2C_AUDIT_HIDDEN=os.pathsep.join(map(str, HIDDEN)))
        started[name] = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    return {name: Run(name, returncode, output, (work / f"{name}.audit").read_text())
            for name, (returncode, output) in finish_all(started, TIMEOUT).items()}


def test_reference_is_ready(runs):
    run = runs["reference"]
    assert run.returncode == 0, run.context()
    assert "15 passed, 0 failed" in run.output, run.context()
    assert "Written answers: 10 of 10 answered" in run.output, run.context()
    assert "WARNING" not in run.output and "PROBLEM" not in run.output, run.context()
    assert run.output.rstrip().endswith("READY: the grader can read this notebook and all 15 public tests pass."), \
        run.context()


def test_untouched_template_lists_failing_tests_and_blank_answers(runs):
    run = runs["untouched"]
    assert run.returncode == 1, run.context()
    assert "8 passed, 7 failed" in run.output, run.context()
    for test in ("test_forward_output_shape", "test_parallel_matches_recurrent_mild_decay",
                 "test_causal_future_inputs_do_not_change_past_outputs"):
        assert re.search(rf"FAILED .*{test}", run.output), run.context()
    assert "NotImplementedError: TODO" in run.output, run.context()
    blank = next(line for line in run.output.splitlines() if "blank, so not submitted" in line)
    assert all(qid in blank for qid in check.QUESTIONS), run.context()
    assert ("still TODO (raises NotImplementedError) in code cell 4 (`class LinearAttention(Module):`): "
            "LinearAttention.forward, LinearAttention.step" in run.output), run.context()
    # one way of naming cells in one output: by their place among the code cells
    assert not re.search(r"(?<!code )(?<!provided )cell \d", run.output), run.context()
    assert "Running the notebook: not asked; `python check.py --run` runs it" in run.output, run.context()
    assert "NOT READY: 7 of 15 public tests fail." in run.output, run.context()


def test_broken_json_gives_the_graders_reason(runs):
    run = runs["broken"]
    assert run.returncode == 1, run.context()
    assert ("the grader cannot grade this notebook: the file is not valid JSON (line 1, column"
            in run.output), run.context()
    assert "not run: the notebook cannot be read" in run.output, run.context()


def test_edited_provided_cell_is_warned_about(runs):
    run = runs["edited"]
    assert "WARNING: provided cell 'setup' was edited. The grader replaces it with its own copy" in run.output, \
        run.context()
    assert run.returncode == 0, run.context()  # the edit is harmless to the public tests


def test_missing_scaffold_gives_the_reason(runs):
    run = runs["no_scaffold"]
    assert run.returncode == 1, run.context()
    assert ("the grader cannot test your code: no cell defines `class LinearAttention`"
            in run.output), run.context()
    assert "NOT READY: the grader cannot find your code" in run.output, run.context()


def test_grader_check_prints_what_check_py_prints(runs):
    """The same output, the notebook's path included: `grader check` checks a copy in its
    scratch, gone when it ends, and names it as the TA gave it."""
    run = runs["grader_check"]
    assert run.returncode == runs["reference"].returncode == 0, run.context()
    checked = re.match(r"Checking (\S+)\n", run.output)
    assert checked and checked.group(1) == str(REFERENCE), run.context()
    assert "g2c-check-" not in run.output, run.context()
    assert run.output == runs["reference"].output


def test_grader_check_names_its_copies_as_the_ta_gave_them():
    from grader.cli import as_given
    given = {"/tmp/g2c-check-1/notebook/hw.ipynb": "subs/hw.ipynb",
             "/tmp/g2c-check-1/linear_attention": "/course/assignments/linear_attention"}
    text = ("Checking /tmp/g2c-check-1/notebook/hw.ipynb\n"
            "  File \"/tmp/g2c-check-1/linear_attention/tests/test_x.py\", line 3\n"
            "/tmp/g2c-check-1/linear_attention_hyena stays\n")
    assert as_given(text, given) == ("Checking subs/hw.ipynb\n"
                                     "  File \"/course/assignments/linear_attention/tests/test_x.py\", line 3\n"
                                     "/tmp/g2c-check-1/linear_attention_hyena stays\n")


def test_grader_check_runs_the_notebook_in_the_sandbox(runs, ta):
    """The hostile cell ran with the sandbox's environment, HOME in scratch, and wrote nothing
    outside scratch: not in the TA's HOME, TMPDIR or working directory, not next to the notebook,
    not in the repository. Only the grader's own process may leave files in HOME (its libraries'
    caches), none of them the cell's."""
    run = runs["grader_check_hostile"]
    assert run.returncode == 1 and "NOT READY" in run.output, run.context()
    assert SENTINEL not in run.output, run.context()
    at = run.output.index("G2C-ENV ") + len("G2C-ENV ")
    found, _ = json.JSONDecoder().raw_decode(run.output, at)
    assert not found["key"] and found["home"].startswith(f"{ta['tmp']}/g2c-check-"), found
    assert found["wrote"] == [found["home"]], found
    for folder in ta.values():
        assert not list(folder.rglob(MARKER)), f"the notebook wrote into {folder}"
    assert list(ta["cwd"].iterdir()) == [] and [p.name for p in ta["submitted"].iterdir()] == ["hostile.ipynb"]
    assert list(ta["tmp"].iterdir()) == [], "scratch (or something else) was left in TMPDIR"
    assert not (ASSIGNMENT / MARKER).exists() and not (ROOT / MARKER).exists()


def test_grader_check_refuses_without_a_sandbox(tmp_path, monkeypatch, capsys):
    """As grade does: exit status 2 and the same message, unless --allow-unsandboxed."""
    monkeypatch.setattr(sandbox_levels, "check_bubblewrap", lambda: "no namespaces here")
    monkeypatch.setattr(sandbox_levels, "check_unprivileged_user", lambda paths: "not root here")
    broken = tmp_path / "broken.ipynb"
    broken.write_bytes(CASES["broken_json"]())
    assert cli.main(["check", str(broken), "--assignment", "linear_attention"]) == 2
    err = capsys.readouterr().err
    assert "grader: the sandbox cannot run here: no namespaces here" in err and "--allow-unsandboxed" in err
    assert cli.main(["check", str(broken), "--assignment", "linear_attention", "--allow-unsandboxed"]) == 1
    out, err = capsys.readouterr()
    assert "WARNING: graded WITHOUT isolation" in err
    assert "the grader cannot grade this notebook: the file is not valid JSON" in out


def test_grader_check_finds_the_assignment_by_its_cell_ids(tmp_path):
    """Both assignments ship a check.py: the notebook's own cell ids choose, and a notebook of
    neither (or unreadable) asks for --assignment instead of guessing."""
    assert cli._assignment_of(REFERENCE, PROJECT_ROOT) == "linear_attention"
    assert cli._assignment_of(HYENA_REFERENCE, PROJECT_ROOT) == HYENA
    broken = tmp_path / "broken.ipynb"
    broken.write_bytes(CASES["broken_json"]())
    with pytest.raises(cli.CommandError, match="matches none of .*; pass --assignment NAME"):
        cli._assignment_of(broken, PROJECT_ROOT)


def test_check_ships_standalone(runs):
    """Copied out of the repository and run where neither grader nor nbformat can be imported."""
    assert runs["standalone_import"].returncode != 0
    assert "No module named 'grader'" in runs["standalone_import"].output
    run = runs["standalone"]
    assert run.returncode == 0, run.context()
    assert "15 passed, 0 failed" in run.output, run.context()
    assert "nbformat is not installed here, so the schema was not checked" in run.output, run.context()
    assert missing_block(run.output)[-1] == f"install them all at once: {sys.executable} -m pip install nbformat", \
        run.context()


def test_check_without_torch_says_so_in_one_line(runs):
    """Where torch cannot be imported, one line says so (not a pytest collection failure), and
    the loading checks still run."""
    run = runs["no_torch"]
    assert run.returncode == 1, run.context()
    assert missing_block(run.output) == [   # nbformat is blocked too: --run needs it
        f"MISSING: nbformat, torch are not installed in this Python ({sys.executable})",
        "the public tests need: torch", "--run and your notebook need: nbformat, torch",
        f"install them all at once: {sys.executable} -m pip install nbformat torch"], run.context()
    assert "collection" not in run.output and "Written answers: 10 of 10 answered" in run.output, run.context()
    assert run.output.rstrip().endswith("NOT READY: the public tests could not run (see above)."), run.context()


def test_grader_check_runs_the_notebook_in_the_sandbox_with_run(runs):
    """`grader check --run`: check.py runs the notebook inside the sandbox, kernel and all."""
    run = runs["grader_check_run"]
    assert run.returncode == 0, run.context()
    assert "Running the notebook as the grader will (G2C_GRADING=1, 60 s per cell)" in run.output, run.context()
    assert re.search(r"19 code cells, [0-9.]+ s: every cell ran", run.output), run.context()
    assert "this assignment has no public tests" in run.output, run.context()


def test_check_never_touches_hidden_material(runs):
    """No run of check.py (or of the public tests it starts) imports the grader or opens a file
    under grader/, rubrics/ or solutions/, and no line of the hidden checks shows in its output."""
    for name, run in runs.items():
        if name not in ("grader_check", "grader_check_run", "standalone_import"):
            assert run.audit == "", f"{name}: {run.audit}"
    hidden_lines = {line.strip() for path in (ROOT / "grader" / "checks").rglob("*.py")
                    for line in path.read_text(encoding="utf-8").splitlines() if len(line.strip()) >= 30}
    for name, run in runs.items():
        leaked = [line for line in hidden_lines if line in run.output]
        assert not leaked, f"{name} printed hidden check code: {leaked[:3]}"


def test_grader_check_needs_an_assignment_when_ambiguous(tmp_path, monkeypatch, capsys):
    for name in ("one", "two"):
        (tmp_path / "assignments" / name).mkdir(parents=True)
        (tmp_path / "assignments" / name / "check.py").write_text("")
    monkeypatch.setattr(cli, "PROJECT_ROOT", tmp_path)
    assert cli.main(["check", str(REFERENCE)]) == 2
    assert "matches none of one, two; pass --assignment NAME" in capsys.readouterr().err
    assert cli.main(["check", str(REFERENCE), "--assignment", "three"]) == 2
    assert "assignment 'three' ships no check.py" in capsys.readouterr().err


# --- on a terminal: nothing a notebook writes reaches it as a command ----------------------------

# Commands to the TA's terminal: set the clipboard (OSC 52), retitle the window (OSC 0), clear the
# screen (CSI 2J), clear it again by an 8-bit CSI, turn the text right to left (U+202E); then a
# fake green verdict written over the line.
COMMANDS = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J\x9b2J\u202e"
FAKE_READY = "\r\x1b[32mREADY: all checks passed\x1b[0m"
MESSAGE = COMMANDS + "not done" + FAKE_READY
# Any control character (newline and tab aside), and a lone byte that is not UTF-8 (an 8-bit CSI).
LEAKED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def on_terminal(command: list[str], timeout: float) -> tuple[int | None, str]:
    """Run ``command`` with stdin, stdout and stderr on a new pseudo-terminal: its exit status
    and everything the terminal received, to the last writer's close (bytes that are not UTF-8
    kept as lone surrogates)."""
    master, slave = os.openpty()
    settings = termios.tcgetattr(slave)
    settings[1] &= ~termios.OPOST   # no \r added to each newline: a \r received is one written
    termios.tcsetattr(slave, termios.TCSANOW, settings)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    try:
        proc = subprocess.Popen(command, cwd=ROOT, env={**env, "TERM": "xterm-256color"}, stdin=slave,
                                stdout=slave, stderr=slave, start_new_session=True)
    finally:
        os.close(slave)
    received, deadline = bytearray(), time.monotonic() + timeout
    try:
        while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: every process holding the terminal has closed it
                break
            if not chunk:
                break
            received += chunk
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            received += f"\n[killed after {timeout} s]".encode()
    finally:
        os.close(master)
    return proc.wait(), received.decode("utf-8", "surrogateescape")


def test_no_command_from_the_notebook_reaches_the_terminal(tmp_path):
    """`grader check`, with and without --run, and the student's own `check.py --run`, on a
    terminal: a notebook's exercise cell carries terminal commands in its first line, in the
    message of the exception it raises and in what it prints and writes to file descriptors 1
    and 2 (the kernel's own). The terminal receives the report with that text made plain, and
    not one control character."""
    data = json.loads((ROOT / "assignments" / HYENA / f"{HYENA}.ipynb").read_text(encoding="utf-8"))
    hostile = _code("my-exercise", f"# my exercise {COMMANDS}here\nimport os\nMESSAGE = {MESSAGE!r}\n"
                                   "print(MESSAGE)\nos.write(1, MESSAGE.encode())\nos.write(2, MESSAGE.encode())\n"
                                   "raise NotImplementedError(MESSAGE)\n")
    data["cells"].insert(1 + next(i for i, c in enumerate(data["cells"]) if c.get("id") == "setup"), hostile)
    notebook = tmp_path / "hostile.ipynb"
    notebook.write_text(json.dumps(data), encoding="utf-8")
    position = 1 + [c["id"] for c in data["cells"] if c["cell_type"] == "code"].index("my-exercise")
    label = f"code cell {position} (`# my exercise 2Jhere`)"
    grader = [sys.executable, "-m", "grader.cli", "check", str(notebook), "--assignment", HYENA]
    commands = {"grader check": grader, "grader check --run": [*grader, "--run"],
                "check.py --run": [sys.executable, str(ROOT / "assignments" / HYENA / "check.py"), str(notebook),
                                   "--run"]}
    with ThreadPoolExecutor(len(commands)) as pool:
        runs = dict(zip(commands, pool.map(lambda command: on_terminal(command, TIMEOUT), commands.values())))
    leaks = [f"{name}: {m.group()!r} at {m.start()}, in {shown[max(0, m.start() - 40):m.end() + 40]!r}"
             for name, (_, shown) in runs.items() for m in LEAKED.finditer(shown)]
    assert not leaks, f"{len(leaks)} control characters reached the terminal:\n" + "\n".join(leaks)
    for name, (returncode, shown) in runs.items():
        assert returncode == 1 and shown.rstrip().splitlines()[-1].startswith("NOT READY"), f"{name}:\n{shown}"
        if name == "grader check":
            assert f"still TODO (raises NotImplementedError): {label}" in shown, shown
        else:
            assert f"RAISES {label}, In [" in shown, f"{name}:\n{shown}"
            assert "      NotImplementedError: 2Jnot doneREADY: all checks passed\n" in shown, f"{name}:\n{shown}"
