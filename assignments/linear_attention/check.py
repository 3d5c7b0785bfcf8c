"""Check your notebook before you submit it: ``python check.py [NOTEBOOK]``.

NOTEBOOK defaults to ``linear_attention.ipynb`` next to this file. In a few seconds the check

1. reads the notebook by the grader's own rules and gives the reason the grader would give
   when it cannot grade it (not JSON, not nbformat 4, too large, no ``LinearAttention``), and
   warns about provided cells you edited (the grader runs its own copy of those);
2. runs the public tests of ``tests/`` on that notebook and summarizes them;
3. lists the written answers that are blank (a blank answer counts as not submitted);
4. says what will be graded, as far as the notebook shows it.

Exit status 0 when the grader can read the notebook, finds your ``LinearAttention`` and every
public test passes; 1 otherwise. Passing is not full marks: the grader's hidden checks test far
more than the public tests, and the written answers are graded after submission.

It needs only Python and pytest, as the public tests do. When nbformat is installed (it comes
with Jupyter) the notebook is also validated against the nbformat 4 schema, as the grader does.

The notebook you check is usually the one you edited in place, so the original provided cells
and questions cannot be read back from it: the tables below fingerprint them as shipped (the
first 16 hex digits of the sha256 of each cell's source, of each question's text).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import nbformat
except ImportError:  # optional: only the schema validation needs it
    nbformat = None

HERE = Path(__file__).resolve().parent
DEFAULT_NOTEBOOK = HERE / "linear_attention.ipynb"
PUBLIC_TESTS = HERE / "tests"
NOTEBOOK_ENV = "LA_NOTEBOOK"          # the notebook the public tests load (see tests/conftest.py)
NOTEBOOK_MAX_BYTES = 50 * 2**20       # the grader's size limit for a submitted notebook
TESTS_TIMEOUT_S = 600
SCAFFOLD_CLASS = "LinearAttention"
SCAFFOLD_METHODS = ("forward", "step")   # the methods you write
PROVIDED = {                          # provided cell id -> fingerprint of its source
    "setup": "cdc0ce8ca4bbe9ec",
    "course-basics": "6389257c1469b410",
    "multi-head-attention": "bf19f6557667bb9d",
    "hybrid-model": "87f103cec317a6c7",
    "ex1-helpers": "41028406542f0c19",
    "ex2-data-helpers": "eddee13bc6c5c889",
    "ex2-training-helpers": "06fb6b1d518bacc0",
    "ex3-recall-helpers": "5eee78357f3c26f6",
}
QUESTIONS = {                         # written question id -> fingerprint of the question's text
    "ex1_crossover": "b416b38664c9dcb9",
    "ex2_comparison": "ba27ecb14a518ed6",
    "ex3_recall": "bdfb7e11c3e96534",
    "ex4_decay": "0a6b62c1e5cfa38f",
    "ex5_memory_bill": "7919e8b93a4bf47b",
    "explain_reassociation": "ed43e1c7cf9c5e05",
    "explain_hybrids": "1d4b2195b50472b4",
    "explain_fixed_state": "07b1867563c9c2a5",
    "explain_gate": "6307ecaa14962463",
    "explain_delta_rule": "5459897f4e861a2e",
}


def fingerprint(text: str) -> str:
    """The short digest the PROVIDED and QUESTIONS tables hold."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class Findings:
    """What reading the notebook found; ``fatal`` set means the grader cannot grade it at all."""

    cells: list[dict[str, Any]] = field(default_factory=list)   # with ids repaired as the grader does
    fatal: str | None = None
    notes: list[str] = field(default_factory=list)      # the grader's notes on a gradable notebook
    schema_checked: bool = False
    scaffold_cell: int | None = None                    # index of the cell graded as the scaffold
    scaffold_problem: str | None = None
    edited_provided: list[str] = field(default_factory=list)
    missing_provided: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)   # question ids, in QUESTIONS order
    blank: list[str] = field(default_factory=list)
    missing_answers: list[str] = field(default_factory=list)


def parse_python(code: str) -> ast.Module:
    """ast.parse whose every failure is a SyntaxError: a deeply nested expression makes the
    parser raise RecursionError or MemoryError, and the check must still give its reason."""
    try:
        return ast.parse(code)
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SyntaxError(f"the code cannot be parsed ({type(exc).__name__})") from None


def _source(cell: dict[str, Any]) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else str(text)


def _metadata(cell: dict[str, Any]) -> dict[str, Any]:
    metadata = cell.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _question_id(cell: dict[str, Any]) -> str | None:
    g2c = _metadata(cell).get("g2c")
    qid = g2c.get("question") if isinstance(g2c, dict) else None
    return qid if isinstance(qid, str) else None


def read_cells(path: Path, findings: Findings, max_bytes: int = NOTEBOOK_MAX_BYTES) -> None:
    """Fill ``findings.cells``, or ``findings.fatal`` with the grader's reason for refusing the file.

    The checks and their messages follow the grader's loader one for one, so a student sees
    here the exact sentence their results would show.
    """
    size = path.stat().st_size
    if size > max_bytes:
        findings.fatal = (f"the notebook is {size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB "
                          "limit; clear large outputs (Kernel > Restart & Clear Output) and resubmit")
        return
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        findings.fatal = f"the file is not UTF-8 text (byte {exc.start}); is it really a .ipynb notebook?"
        return
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        findings.fatal = f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        return
    except (RecursionError, MemoryError, ValueError):
        findings.fatal = "the file's JSON is nested too deeply to read"
        return
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        findings.fatal = "the JSON is not a Jupyter notebook (no list of cells)"
        return
    if raw.get("nbformat") != 4:
        findings.fatal = (f"unsupported notebook format {raw.get('nbformat')!r}; "
                          "save the notebook with Jupyter (nbformat 4)")
        return
    seen: set[str] = set()
    for index, cell in enumerate(raw["cells"]):
        if not isinstance(cell, dict):
            findings.fatal = f"cell {index} is not a JSON object"
            return
        cell_id = cell.get("id")
        if isinstance(cell_id, str) and cell_id in seen:
            findings.notes.append(f"duplicate cell id {cell_id!r} (cell {index}); it was renamed for grading")
            cell["id"] = f"{cell_id}-dup{index}"
        if isinstance(cell.get("id"), str):
            seen.add(cell["id"])
    if nbformat is not None:
        findings.schema_checked = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                nbformat.validate(nbformat.from_dict(raw))
        except Exception as exc:  # nbformat raises several types; all mean "not a valid notebook"
            findings.fatal = f"the notebook does not follow the nbformat 4 schema: {str(exc).splitlines()[0]}"
            return
    findings.cells = raw["cells"]


def find_scaffold(findings: Findings) -> None:
    """The scaffold is the last code cell defining the class at top level, as the grader decides."""
    candidates: list[int] = []
    broken: list[int] = []
    for index, cell in enumerate(findings.cells):
        if cell.get("cell_type") != "code":
            continue
        code = _source(cell)
        try:
            module = parse_python(code)
        except SyntaxError:
            if f"class {SCAFFOLD_CLASS}" in code:
                broken.append(index)
            continue
        if any(isinstance(node, ast.ClassDef) and node.name == SCAFFOLD_CLASS for node in module.body):
            candidates.append(index)
    if not candidates:
        if broken:
            findings.scaffold_problem = (f"the cell defining {SCAFFOLD_CLASS} (cell {broken[-1]}) "
                                         "is not valid Python")
        else:
            findings.scaffold_problem = (f"no cell defines `class {SCAFFOLD_CLASS}`; restore the scaffold "
                                         "cell from the assignment notebook and keep the name")
        return
    if len(candidates) > 1:
        findings.notes.append(f"{SCAFFOLD_CLASS} is defined in {len(candidates)} cells "
                              f"({', '.join(str(i) for i in candidates)}); the last one is graded")
    findings.scaffold_cell = candidates[-1]


def find_provided_edits(findings: Findings) -> None:
    """Provided cells (matched by cell id) whose source differs from the shipped one, or that are gone."""
    present = {cell.get("id"): cell for cell in findings.cells}
    for cell_id, expected in PROVIDED.items():
        if cell_id not in present:
            findings.missing_provided.append(cell_id)
        elif fingerprint(_source(present[cell_id])) != expected:
            findings.edited_provided.append(cell_id)


def parse_written_answer(cell: dict[str, Any]) -> tuple[str, str] | None:
    """(question, answer) of a Question/Answer cell: two string literals, or a markdown cell.

    The same reading as the grader's, so the question text matches its fingerprint.
    """
    text = _source(cell)
    if cell.get("cell_type") == "markdown":
        head, sep, tail = text.partition("Answer:")
        if not sep or not head.lstrip().startswith("Question:"):
            return None
        return head.strip()[len("Question:"):].strip(), tail.strip()
    try:
        module = parse_python(text)
    except SyntaxError:
        return None
    literals = [node.value.value for node in module.body
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)]
    question = next((s for s in literals if s.lstrip().startswith("Question:")), None)
    answer = next((s for s in literals if s.lstrip().startswith("Answer:")), None)
    if question is None or answer is None:
        return None
    return question.strip()[len("Question:"):].strip(), answer.strip()[len("Answer:"):].strip()


def find_answers(findings: Findings) -> None:
    """Sort the questions into answered, blank and missing.

    A cell counts for a question by its ``g2c.question`` metadata, else by its question text;
    the first cell for a question is its answer, as the grader decides. The shipped answers are all blank, so an answer
    "unchanged from the template" is a blank one.
    """
    by_text = {digest: qid for qid, digest in QUESTIONS.items()}
    answers: dict[str, str] = {}
    for cell in findings.cells:
        parsed = parse_written_answer(cell)
        if parsed is None:
            continue
        qid = _question_id(cell) or by_text.get(fingerprint(parsed[0]))
        if qid is not None and qid not in answers:
            answers[qid] = parsed[1]
    for qid in QUESTIONS:
        if qid not in answers:
            findings.missing_answers.append(qid)
        elif answers[qid].strip():
            findings.answered.append(qid)
        else:
            findings.blank.append(qid)


def inspect_notebook(path: Path, max_bytes: int = NOTEBOOK_MAX_BYTES) -> Findings:
    """Everything the check can tell without running code."""
    findings = Findings()
    read_cells(path, findings, max_bytes)
    if findings.fatal is None:
        find_scaffold(findings)
        find_provided_edits(findings)
        find_answers(findings)
    return findings


def _raises_todo(node: ast.AST) -> bool:
    """Whether ``node`` still holds a ``raise NotImplementedError`` (the TODOs of the notebook)."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Raise) and inner.exc is not None:
            target = inner.exc.func if isinstance(inner.exc, ast.Call) else inner.exc
            if isinstance(target, ast.Name) and target.id == "NotImplementedError":
                return True
    return False


def scaffold_todos(code: str) -> tuple[list[str], list[str]]:
    """(methods not defined, methods still raising NotImplementedError) of the graded class."""
    classes = [node for node in parse_python(code).body
               if isinstance(node, ast.ClassDef) and node.name == SCAFFOLD_CLASS]
    methods = {node.name: node for node in classes[-1].body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [name for name in SCAFFOLD_METHODS if name not in methods]
    todo = [name for name in SCAFFOLD_METHODS if name in methods and _raises_todo(methods[name])]
    return missing, todo


def exercise_todos(findings: Findings) -> list[str]:
    """Exercise cells (not provided, not the scaffold) that still raise NotImplementedError."""
    found = []
    for index, cell in enumerate(findings.cells):
        if cell.get("cell_type") != "code" or index == findings.scaffold_cell or cell.get("id") in PROVIDED:
            continue
        try:
            module = parse_python(_source(cell))
        except SyntaxError:
            continue
        if _raises_todo(module):
            found.append(f"cell {index}" + (f" ({cell['id']})" if isinstance(cell.get("id"), str) else ""))
    return found


@dataclass
class PublicTests:
    """The public tests' outcome; ``problem`` is set when pytest could not report per test."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)   # test name -> first lines of its failure
    skipped: list[str] = field(default_factory=list)
    problem: str | None = None


def _one_line(message: str, limit: int = 300) -> str:
    """A failure message on one line: enough to recognize it, the rerun shows the traceback."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_public_tests(notebook: Path) -> PublicTests:
    """Run ``tests/`` on ``notebook`` in a fresh interpreter, as ``LA_NOTEBOOK=... pytest tests/``.

    A subprocess, so that your code can neither hang nor crash the check; an empty ini file, so
    that no pytest configuration around this folder changes the run; and no bytecode or cache
    written, so that the check leaves your folder as it found it.
    """
    env = dict(os.environ, **{NOTEBOOK_ENV: str(notebook), "PYTHONDONTWRITEBYTECODE": "1"})
    with tempfile.TemporaryDirectory(prefix="la-check-") as scratch:
        ini, report = Path(scratch) / "pytest.ini", Path(scratch) / "junit.xml"
        ini.write_text("[pytest]\n", encoding="utf-8")
        command = [sys.executable, "-m", "pytest", str(PUBLIC_TESTS), "-q", "-p", "no:cacheprovider",
                   "-c", str(ini), "--rootdir", str(HERE), f"--junitxml={report}"]
        try:
            done = subprocess.run(command, cwd=HERE, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=TESTS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return PublicTests(problem=f"the public tests did not finish in {TESTS_TIMEOUT_S} s; "
                                   "does forward or step loop forever?")
        if not report.is_file():
            tail = "\n".join(done.stdout.strip().splitlines()[-15:])
            return PublicTests(problem=f"pytest did not run the tests (exit {done.returncode}); is pytest "
                                   f"installed in this Python ({sys.executable})?\n{tail}")
        run = PublicTests()
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            name = case.get("name", "?")
            outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
            if outcome is None:
                run.passed.append(name)
            elif outcome.tag == "skipped":
                run.skipped.append(name)
            else:
                run.failed[name] = _one_line(outcome.get("message") or outcome.text or outcome.tag)
        if not run.passed and not run.failed:
            run.problem = f"pytest found no public tests in {PUBLIC_TESTS}"
        return run


def report_loading(findings: Findings) -> None:
    """Part 1: the grader's reasons first, then what it will change (notes, provided cells)."""
    print("Reading the notebook as the grader will")
    if findings.fatal:
        print(f"  PROBLEM: the grader cannot grade this notebook: {findings.fatal}")
        return
    print(f"  nbformat 4, {len(findings.cells)} cells"
          + ("" if findings.schema_checked else
             " (nbformat is not installed here, so the schema was not checked; the grader checks it)"))
    if findings.scaffold_problem:
        print(f"  PROBLEM: the grader cannot test your {SCAFFOLD_CLASS}: {findings.scaffold_problem}")
    else:
        print(f"  {SCAFFOLD_CLASS} is graded from cell {findings.scaffold_cell}")
    for note in findings.notes:
        print(f"  note: {note}")
    for cell_id in findings.edited_provided:
        print(f"  WARNING: provided cell {cell_id!r} was edited. The grader replaces it with its own copy, "
              "so your edits there will not count; move code of your own into a cell of your own.")
    for cell_id in findings.missing_provided:
        print(f"  WARNING: provided cell {cell_id!r} is missing. The grader puts its own copy back.")


def report_tests(run: PublicTests | None, notebook: Path) -> None:
    """Part 2: failures grouped by message, since one bug usually fails several tests alike."""
    print(f"Public tests ({NOTEBOOK_ENV}={notebook} pytest tests/)")
    if run is None:
        print("  not run: the notebook cannot be read")
        return
    if run.problem:
        print(f"  PROBLEM: {run.problem}")
        return
    counts = [f"{len(run.passed)} passed", f"{len(run.failed)} failed"]
    print("  " + ", ".join(counts + ([f"{len(run.skipped)} skipped"] if run.skipped else [])))
    by_message: dict[str, list[str]] = defaultdict(list)
    for name, message in run.failed.items():
        by_message[message].append(name)
    for message, names in by_message.items():
        print(f"  FAILED {', '.join(names)}\n      {message}")
    if run.failed:
        print(f"  Rerun one with its traceback, from {HERE}:\n"
              f"      {NOTEBOOK_ENV}={notebook} pytest tests/ -k {next(iter(run.failed))}")


def report_answers(findings: Findings) -> None:
    """Part 3: the answers that would score nothing as submitted now."""
    print(f"Written answers: {len(findings.answered)} of {len(QUESTIONS)} answered")
    if findings.blank:
        print(f"  blank, so not submitted: {', '.join(findings.blank)}")
    if findings.missing_answers:
        print(f"  no Question/Answer cell found (restore it from the assignment notebook): "
              f"{', '.join(findings.missing_answers)}")


def report_graded(findings: Findings) -> None:
    """What the grader will look at, from the notebook alone: no hidden check, input or point."""
    print("What will be graded")
    print("  - the whole notebook, run top to bottom headless with G2C_GRADING=1 (small budgets), "
          f"with the grader's own copy of the {len(PROVIDED)} provided cells")
    if findings.scaffold_cell is not None:
        missing, todo = scaffold_todos(_source(findings.cells[findings.scaffold_cell]))
        print(f"  - {' and '.join(f'{SCAFFOLD_CLASS}.{m}' for m in SCAFFOLD_METHODS)} of cell "
              f"{findings.scaffold_cell}, by hidden checks that test far more than the public tests")
        if missing:
            print(f"      not defined: {', '.join(missing)}")
        if todo:
            print(f"      still TODO (raises NotImplementedError): {', '.join(todo)}")
    else:
        print(f"  - {' and '.join(f'{SCAFFOLD_CLASS}.{m}' for m in SCAFFOLD_METHODS)}: not found (see above)")
    print("  - the results your exercise cells compute")
    todos = exercise_todos(findings)
    if todos:
        print(f"      still TODO (raises NotImplementedError): {', '.join(todos)}")
    print(f"  - {len(QUESTIONS)} written answers, graded after submission: {', '.join(list(QUESTIONS))}")


def verdict(findings: Findings, run: PublicTests | None) -> tuple[bool, str]:
    """Whether the notebook is ready to submit, and the one line that says why."""
    if findings.fatal:
        return False, "NOT READY: the grader cannot read this notebook (see above)."
    if findings.scaffold_problem:
        return False, f"NOT READY: the grader cannot find your {SCAFFOLD_CLASS} (see above)."
    if run is None or run.problem:
        return False, "NOT READY: the public tests could not run (see above)."
    if run.failed:
        return False, f"NOT READY: {len(run.failed)} of {len(run.failed) + len(run.passed)} public tests fail."
    blank = len(findings.blank) + len(findings.missing_answers)
    return True, (f"READY: the grader can read this notebook and all {len(run.passed)} public tests pass"
                  + (f"; {blank} written answers are still blank or missing." if blank else "."))


def main(argv: list[str] | None = None) -> int:
    """Print the four parts of the check; 0 when the notebook loads and the public tests pass."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", type=Path, default=DEFAULT_NOTEBOOK,
                        help=f"the notebook to check (default: {DEFAULT_NOTEBOOK.name} next to check.py)")
    notebook = parser.parse_args(argv).notebook.expanduser().resolve()
    if not notebook.is_file():
        print(f"{notebook}: no such notebook")
        return 1
    print(f"Checking {notebook}\n")
    findings = inspect_notebook(notebook)
    report_loading(findings)
    print()
    run = None if findings.fatal else run_public_tests(notebook)
    report_tests(run, notebook)
    if not findings.fatal:
        print()
        report_answers(findings)
        print()
        report_graded(findings)
    ready, summary = verdict(findings, run)
    print(f"\n{summary}")
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
