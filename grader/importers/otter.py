"""otter-assign's master notebook format, read into a ``Draft``.

What otter-assign's format holds, and what each becomes:

- the ``# ASSIGNMENT CONFIG`` raw cell (YAML): ``name`` names the assignment; ``requirements``
  (a file beside the master, or a list) and a ``requirements.txt`` beside the master are the
  assignment's requirements; ``seed``, ``init_cell``, ``check_all_cell``, ``export_cell`` and
  the other keys are otter's own machinery, named in the notes (the grader seeds the global
  generators itself before each test);
- a ``# BEGIN QUESTION`` ... ``# END QUESTION`` block (its YAML: ``name``, ``points``,
  ``manual``, ``all_or_nothing``): an autograded question's code cells with solution markers
  become ``scaffold`` cells declaring the functions they define, its other code cells
  ``provided``; each test cell of its ``# BEGIN TESTS`` block becomes a test cell named after
  the question (``q1``, or ``q1-1``, ``q1-2`` ... when it has several), with otter's points
  (per test, or the question's spread as otter spreads them) and visibility (``# HIDDEN``, a
  ``hidden`` test config); an ``all_or_nothing`` question's tests become one cell. A manually
  graded question whose solution is Markdown becomes a written question, its prompt the
  question and its solution the reference answer;
- a Markdown cell that is one ```` ```otter ```` fence is read as the raw cell it holds;
- ``# BEGIN SOLUTION`` / ``# END SOLUTION`` blocks and ``# SOLUTION`` lines become
  ``### BEGIN SOLUTION`` blocks (``grader assign`` writes the TODO); ``# BEGIN PROMPT`` blocks
  (what otter shows students instead) and ``# IGNORE`` lines are left out.

A test whose master cell stored an output is a doctest in otter (the output is what the cell
must print), and is written as ``>>>`` examples with that output.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import yaml

from grader import cells
from grader.importers.draft import (REQUIREMENTS_FILE, Draft, ImportRefused, WrittenQuestion, defined_functions,
                                    markdown_cell, new_master, provided_cell, question_cell, read_requirements, requirement_lines,
                                    scaffold_cell, tag_name, test_cell)

SOURCE = "otter-grader"
BOUNDARY = re.compile(r"#\s+(?P<end>begin|end)\s+(?P<kind>question|prompt|solution|tests)\b", re.IGNORECASE)
CONFIG = re.compile(r"#\s+assignment\s+config\b", re.IGNORECASE)
TEST_CONFIG = re.compile(r'^\s*"""\s*#\s*(BEGIN|END) TEST CONFIG', re.IGNORECASE)
BEGIN_SOLUTION = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION( NO PROMPT)?\s*$")
END_SOLUTION = re.compile(r"^\s*# END SOLUTION\s*$")
SOLUTION_LINE = re.compile(r"^(?P<indent>\s*)(?P<code>.*?)\s*# ?SOLUTION( NO PROMPT)?\s*$")
PROMPT_LINE = re.compile(r"#\s*(?P<end>BEGIN|END) PROMPT\s*$", re.IGNORECASE)
OTTER_MACHINERY = re.compile(r"^\s*(import otter\b|grader\s*=\s*otter\.|grader\.(check|check_all|export)\()", re.M)
# the config keys that mean something here; every other key is otter's own, and named in the notes
OWN_KEYS = {"name", "requirements"}


@dataclass
class _Question:
    """One ``# BEGIN QUESTION`` block as it is read."""

    config: dict[str, Any]
    where: str
    prompt: list[tuple[str, str]] = field(default_factory=list)     # (cell reference, Markdown)
    code: list[tuple[str, str]] = field(default_factory=list)        # (cell reference, source)
    answers: list[tuple[str, Any]] = field(default_factory=list)     # (cell reference, cell) in a solution block
    tests: list[tuple[str, Any]] = field(default_factory=list)       # (cell reference, cell)

    @property
    def name(self) -> str:
        return str(self.config["name"])


def read(master_path: Path, name: str | None = None) -> Draft:
    """The otter master notebook at ``master_path`` as a draft (``name``: the assignment's name,
    default the config's ``name`` or the notebook's stem). Raises ImportRefused when it is not
    an otter master notebook."""
    notebook = nbformat.read(str(master_path), as_version=4)
    notebook.cells = [_unfenced(cell) for cell in notebook.cells]
    config, config_cell = _config(notebook)
    draft = Draft(name or str(config.get("name") or master_path.stem), SOURCE, new_master())
    draft.requirements = _requirements(config, master_path)
    for key in sorted(set(config) - OWN_KEYS, key=str):
        draft.notes.append(f"config `{key}`: otter's own setting, not imported"
                           + (" (the grader seeds the global generators itself before each test)" if key == "seed"
                              else ""))
    question: _Question | None = None
    block: str | None = None      # inside a question: "solution", "prompt" or "tests"
    for number, cell in enumerate(notebook.cells, start=1):
        if number - 1 == config_cell:
            continue
        where = f"cell {number}"
        text = cells.source(cell)
        boundary = BOUNDARY.match(text.split("\n", 1)[0]) if cell.cell_type == "raw" else None
        if boundary:
            kind, ending = boundary["kind"].lower(), boundary["end"].lower() == "end"
            if kind == "question" and not ending:
                question = _begin_question(text, where, question)
            elif kind == "question":
                if question is None:
                    raise ImportRefused(f"{where}: END QUESTION without BEGIN QUESTION")
                _end_question(question, draft)
                question, block = None, None
            elif question is None:
                raise ImportRefused(f"{where}: {boundary.group(0).strip()} outside a question")
            else:
                block = None if ending else kind
            continue
        if question is None:
            _outside(cell, where, draft)
        elif block == "tests":
            if cell.cell_type == "code":
                question.tests.append((where, cell))
            else:
                draft.notes.append(f"{where}: a {cell.cell_type} cell among question {question.name}'s tests, "
                                   "not imported")
        elif block == "prompt":
            draft.notes.append(f"{where}: otter's prompt for question {question.name} (what students see instead "
                               "of the solution): the student notebook gets the grader's own TODO or blank answer")
        elif block == "solution":
            question.answers.append((where, cell))
        elif cell.cell_type == "markdown":
            question.prompt.append((where, text))
        elif cell.cell_type == "code":
            question.code.append((where, _without_ignored(text)))
        else:
            draft.notes.append(f"{where}: a raw cell in question {question.name}, not imported")
    if question is not None:
        raise ImportRefused(f"question {question.name} ({question.where}) has no END QUESTION")
    return draft


def _unfenced(cell: Any) -> Any:
    """A Markdown cell that is one ```` ```otter ```` fence as the raw cell it stands for (otter
    reads both); any other cell as it is."""
    lines = cells.source(cell).strip().split("\n")
    if (cell.cell_type == "markdown" and len(lines) > 2 and lines[0].strip() == "```otter"
            and lines[-1].strip() == "```" and "```" not in "\n".join(lines[1:-1])):
        return nbformat.v4.new_raw_cell("\n".join(lines[1:-1]))
    return cell


def _config(notebook: nbformat.NotebookNode) -> tuple[dict[str, Any], int | None]:
    """The assignment config (empty when there is none) and its cell's index."""
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "raw" and CONFIG.match(cells.source(cell)):
            return _yaml(cells.source(cell), f"cell {index + 1} (ASSIGNMENT CONFIG)"), index
    if not any(cell.cell_type == "raw" and BOUNDARY.match(cells.source(cell)) for cell in notebook.cells):
        raise ImportRefused("not an otter-assign master notebook: no ASSIGNMENT CONFIG cell and no BEGIN QUESTION cell")
    return {}, None


def _yaml(text: str, where: str) -> dict[str, Any]:
    body = text.split("\n", 1)[1] if "\n" in text else ""
    try:
        found = yaml.safe_load(body) or {}
    except yaml.YAMLError as exc:
        raise ImportRefused(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(found, dict):
        raise ImportRefused(f"{where}: its YAML is not a mapping")
    return found


def _requirements(config: dict[str, Any], master_path: Path) -> list[str]:
    """The config's ``requirements`` (a file beside the master, or a list), else a requirements.txt
    beside the master."""
    given = config.get("requirements")
    if isinstance(given, list):
        return requirement_lines([str(line) for line in given])
    path = master_path.parent / (str(given) if given else REQUIREMENTS_FILE)
    if given and not path.is_file():
        raise ImportRefused(f"config `requirements`: {path} does not exist")
    return read_requirements(path)


def _begin_question(text: str, where: str, open_question: _Question | None) -> _Question:
    if open_question is not None:
        raise ImportRefused(f"{where}: BEGIN QUESTION inside question {open_question.name}")
    config = _yaml(text, f"{where} (BEGIN QUESTION)")
    if not config.get("name"):
        raise ImportRefused(f"{where}: a question without a name")
    return _Question(config, where)


def _outside(cell: Any, where: str, draft: Draft) -> None:
    """A cell outside every question: Markdown as it is, code as provided code."""
    text = cells.source(cell)
    if cell.cell_type == "markdown":
        if "```otter" in text:
            draft.notes.append(f"{where}: an otter fence inside a longer Markdown cell is not read (put it in a cell "
                               "of its own); the cell is kept as text")
        draft.notebook.cells.append(markdown_cell(text, where))
    elif cell.cell_type != "code":
        draft.notes.append(f"{where}: a raw cell outside the questions, not imported")
    elif OTTER_MACHINERY.search(text):
        draft.notes.append(f"{where}: otter's own cell (`import otter`, `grader.check`...), not imported")
    else:
        if _has_solution(text):
            draft.notes.append(f"{where}: solution markers outside a question: kept whole as provided code, "
                               "with its solution")
        draft.notebook.cells.append(provided_cell(_without_ignored(text), where, draft.notes))


def _has_solution(text: str) -> bool:
    return any(BEGIN_SOLUTION.match(line) or SOLUTION_LINE.match(line) for line in text.split("\n"))


def _without_ignored(text: str) -> str:
    """Without otter's ``# IGNORE`` lines and ``# BEGIN IGNORE`` ... ``# END IGNORE`` blocks."""
    kept, inside = [], False
    for line in text.split("\n"):
        if re.match(r"\s*#\s*BEGIN\s*IGNORE\s*", line, re.IGNORECASE):
            inside = True
        elif line.rstrip().endswith("# END IGNORE"):
            inside = False
        elif not inside and not line.rstrip().endswith("# IGNORE"):
            kept.append(line)
    return "\n".join(kept)


def solution_markup(text: str) -> str:
    """otter's solution markers as this project's: blocks and ``# SOLUTION`` lines (consecutive
    ones at one indent as one block) become ``### BEGIN SOLUTION`` blocks; prompt lines go."""
    out: list[str] = []
    open_line: str | None = None      # the indent of an open block made from SOLUTION lines
    prompt = False                    # inside ``""" # BEGIN PROMPT`` ... ``"""; # END PROMPT``: a string in the master
    for line in text.split("\n"):
        marker = PROMPT_LINE.search(line)
        if marker or prompt:
            prompt = (marker["end"].upper() == "BEGIN") if marker else prompt
            continue
        single = SOLUTION_LINE.match(line) if not (BEGIN_SOLUTION.match(line) or END_SOLUTION.match(line)) else None
        if open_line is not None and not (single and single["indent"] == open_line):
            out.append(f"{open_line}### END SOLUTION")
            open_line = None
        begin = BEGIN_SOLUTION.match(line)
        if begin:
            out.append(f"{begin['indent']}### BEGIN SOLUTION")
        elif END_SOLUTION.match(line):
            out.append(line.replace("# END SOLUTION", "### END SOLUTION"))
        elif single:
            if open_line is None:
                out.append(f"{single['indent']}### BEGIN SOLUTION")
                open_line = single["indent"]
            out.append(f"{single['indent']}{single['code']}")
        else:
            out.append(line)
    if open_line is not None:
        out.append(f"{open_line}### END SOLUTION")
    return "\n".join(out)


def _end_question(question: _Question, draft: Draft) -> None:
    """The question's cells into the draft: written, or scaffolds and tests."""
    if question.config.get("manual"):   # the question cell carries the prompt
        _written(question, draft)
        return
    draft.notebook.cells += [markdown_cell(text, where) for where, text in question.prompt]
    for where, cell in question.answers:    # a solution block in an autograded question: its code cells
        if cell.cell_type == "code":
            question.code.append((where, _without_ignored(cells.source(cell))))
        else:
            draft.notes.append(f"{where}: a {cell.cell_type} solution cell in autograded question {question.name}, "
                               "not imported")
    scaffolds = 0
    for where, text in question.code:
        if not _has_solution(text):
            draft.notebook.cells.append(provided_cell(text, where, draft.notes))
            continue
        converted = solution_markup(text)
        problem = _scaffold_problem(converted)
        if problem:
            draft.notes.append(f"{where} (question {question.name}): {problem}; not imported")
            continue
        draft.notebook.cells.append(scaffold_cell(converted, defined_functions(converted), f"{question.name}-{where}"))
        scaffolds += 1
    if not scaffolds:
        draft.notes.append(f"question {question.name} ({question.where}): no code students write could be "
                           f"imported, so its {len(question.tests)} test(s) are not imported")
        return
    _tests(question, draft)


def _scaffold_problem(converted: str) -> str | None:
    """Why a solution cell cannot be a scaffold: the grader grafts functions students write,
    and a solution outside a function is a value the grader cannot take from the student's run."""
    try:
        tree = ast.parse(converted)
    except SyntaxError as exc:
        return f"not valid Python after its solution markers were read ({exc.msg}, line {exc.lineno})"
    if not defined_functions(converted):
        return "its solution is a value, not a function: the grader grades the functions students write"
    lines = converted.split("\n")
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = lines[node.lineno - 1:(node.end_lineno or node.lineno)]
            if any("### BEGIN SOLUTION" in line for line in span):
                return (f"line {node.lineno} holds a solution outside a function: the grader grades the "
                        "functions students write")
    return None


def _written(question: _Question, draft: Draft) -> None:
    answers = [cells.source(cell) for _, cell in question.answers if cell.cell_type == "markdown"]
    code = [where for where, cell in question.answers if cell.cell_type == "code"] + [w for w, _ in question.code]
    if code or not answers:
        draft.notes.append(f"question {question.name} ({question.where}): a manually graded question whose answer "
                           f"is {'code or a plot (' + ', '.join(code) + ')' if code else 'missing'}: it has no written "
                           "form here, grade it by hand; not imported")
        return
    for where, _ in question.tests:
        draft.notes.append(f"{where}: a test of manually graded question {question.name}, not imported")
    prompt = "\n\n".join(text for _, text in question.prompt).strip() or question.name
    written = WrittenQuestion(question.name, float(question.config.get("points") or 1), prompt,
                              "\n\n".join(answers).strip())
    draft.questions.append(written)
    draft.notebook.cells.append(question_cell(written))


def _tests(question: _Question, draft: Draft) -> None:
    """The question's test cells, with otter's points and visibility, tagged with its name."""
    read = [_test(where, cell) for where, cell in question.tests]
    if not read:
        draft.notes.append(f"question {question.name} ({question.where}): no tests, so nothing of it is graded")
        return
    tag = tag_name(question.name)
    draft.tags[tag] = f"otter question {question.name}"
    try:
        points = resolve_points(question.config.get("points"), [p for _, _, p, _ in read])
    except ValueError as exc:
        raise ImportRefused(f"question {question.name} ({question.where}): {exc}") from None
    if question.config.get("all_or_nothing"):
        if any(text.startswith('"""\n>>>') for _, text, _, _ in read):
            draft.notes.append(f"question {question.name}: all_or_nothing, with tests that compare printed output, "
                               "which one test cell cannot join: not imported (write its tests as asserts)")
            return
        source = "\n".join(text for _, text, _, _ in read)
        hidden = any(h for h, _, _, _ in read)
        draft.notes.append(f"question {question.name}: all_or_nothing, so its {len(read)} tests are one test cell"
                           + (" (hidden, since one of them is)" if hidden else ""))
        draft.notebook.cells.append(test_cell(question.name, sum(points), hidden, source, tag, question.name))
        return
    for index, ((hidden, text, _, message), worth) in enumerate(zip(read, points), start=1):
        name = question.name if len(read) == 1 else f"{question.name}-{index}"
        if worth <= 0:
            draft.notes.append(f"{question.tests[index - 1][0]}: test {name} is worth 0 points in otter; an item "
                               "here is worth more than 0, so it is not imported")
            continue
        title = question.name if len(read) == 1 else f"{question.name}, test {index} of {len(read)}"
        draft.notebook.cells.append(test_cell(name, worth, hidden, text, tag, title, message))


def _test(where: str, cell: Any) -> tuple[bool, str, float | None, str]:
    """One otter test cell: (hidden, source as a test cell holds it, its own points, failure message)."""
    lines = cells.source(cell).split("\n")
    hidden = bool(lines and lines[0].lstrip().startswith("#") and re.search(r"\bhidden\b", lines[0], re.IGNORECASE))
    config: dict[str, Any] = {}
    marks = [i for i, line in enumerate(lines) if TEST_CONFIG.match(line)]
    if len(marks) >= 2:
        config = _yaml("\n" + "\n".join(lines[marks[0] + 1:marks[1]]), f"{where} (TEST CONFIG)")
        lines = lines[:marks[0]] + lines[marks[1] + 1:]
    hidden = bool(config.get("hidden", hidden))
    points = config.get("points")
    text = "\n".join(lines).strip("\n") + "\n"
    output = _output(cell)
    return hidden, (_doctest(text, output) if output.strip() else text), points, str(config.get("failure_message") or "")


def _output(cell: Any) -> str:
    """What the master's test cell printed, as otter reads it (stream text and the result)."""
    text = ""
    for output in cell.get("outputs", []):
        text += "".join(output.get("text", ""))
        result = output.get("data", {}).get("text/plain")
        text += "".join(result) if isinstance(result, list) else (result or "")
    return text


def _doctest(text: str, output: str) -> str:
    """A test cell whose output counts: its statements as ``>>>`` examples, the output after the
    last one (otter compares the whole cell's output the same way), in one string literal (the
    cell stays Python, which the student notebook and check.py need)."""
    lines = text.split("\n")
    out = []
    for node in ast.parse(text).body:
        source = lines[node.lineno - 1:node.end_lineno]
        out += [f">>> {source[0]}", *(f"... {line}" for line in source[1:])]
    examples = "\n".join(out + output.rstrip("\n").split("\n"))
    return '"""\n' + examples.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""\n'


def resolve_points(total: Any, own: list[Any]) -> list[float]:
    """Each test's points as otter resolves them: a list gives each its own; a number is spread
    over the tests that name none (after those that do); none at all is 1 point spread over
    them; a mapping ``{each: n}`` gives each n."""
    if isinstance(total, dict):
        return [float(total.get("each", 1))] * len(own)
    if isinstance(total, list):
        if len(total) != len(own):
            raise ValueError(f"`points` lists {len(total)} values for {len(own)} tests")
        return [float(p) for p in total]
    if total is not None and (isinstance(total, bool) or not isinstance(total, (int, float))):
        raise ValueError(f"`points` is {total!r}, not a number, a list or {{each: n}}")
    named = sum(float(p) for p in own if p is not None)
    unnamed = sum(p is None for p in own)
    if total is not None:
        if named > total:
            raise ValueError("its tests name more points than the question's `points`")
        rest = (total - named) / unnamed if unnamed else 0.0
    else:
        rest = 1 / unnamed if unnamed and all(p in (0, None) for p in own) else 0.0
    return [float(p) if p is not None else rest for p in own]
