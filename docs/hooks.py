"""MkDocs hook: the reference pages, generated at build time from the code that is their truth.

``on_files`` adds these pages to the build, in memory only (nothing is written to ``docs/``):

- ``reference/cli.md``: every ``grader`` command, from ``grader.cli.build_parser()``;
- ``reference/rubric.md``: every key a rubric may hold, walked from ``grader.rubric.RUBRIC_SCHEMA``,
  with the defaults of the dataclasses the rubric fills in;
- ``reference/results.md``: results.json's fields, from what ``GradeResult.to_json``, a TA's
  override (``apply_overrides``) and the Gradescope step actually write;
- ``reference/output-folder.md``: the files of an output folder, from the names the grader
  reserves there (``grader.intake.RESERVED_IDS``) and the per-submission file constants;
- ``reference/checks-api.md``: what a checks module uses, from docstrings and signatures;
- ``reference/modules.md``: every module of the ``grader`` package, from its docstring.

``on_page_markdown`` replaces a line ``<!-- generated: NAME ARGS -->`` of a hand-written page by
the piece ``INSERTS[NAME](*ARGS)`` generates: ``digests`` (which of the grader's files counts in
which digest) and ``items ASSIGNMENT`` (the items of an assignment's rubric).

The descriptions of results.json's fields and of the output folder's files are kept here, in
``RESULTS_FIELDS`` and ``OUTPUT_FILES``; the code decides which fields and files exist. One that
the code writes without a description here, or a description of one it no longer writes, is a
warning, and ``mkdocs build --strict`` (``make docs``, ``tests/test_docs.py``) fails on it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import inspect
import io
import logging
import re
import tempfile
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parent.parent
GRADER = REPO / "grader"
log = logging.getLogger("mkdocs.hooks.reference")   # under "mkdocs": --strict counts its warnings

GENERATED_NOTE = ("_Generated when the site is built, from {source}: edit the code, not this page._\n")


# ----------------------------------------------------------------------------- helpers

def _markdown(text: str) -> str:
    """Docstring prose as Markdown: reST's double backquotes as code spans, and the angle
    brackets outside code spans escaped (Markdown would take ``<name>`` for an HTML tag)."""
    parts = text.replace("``", "`").split("`")
    return "`".join(part if index % 2 else html.escape(part, quote=False) for index, part in enumerate(parts))


def _cell(text: str) -> str:
    """Prose as one Markdown table cell: on one line, its pipes escaped."""
    return _markdown(" ".join(str(text).split())).replace("|", "\\|")


def _code_cell(text: str) -> str:
    """Code as one table cell: a code element whose pipes cannot end the cell."""
    return f"<code>{html.escape(' '.join(str(text).split()), quote=False).replace('|', '&#124;')}</code>"


def _paragraphs(doc: str | None) -> list[str]:
    """A docstring's paragraphs, each on one line (for lists and table cells)."""
    return [" ".join(block.split()) for block in (doc or "").split("\n\n") if block.strip()]


def _docstring_block(doc: str | None) -> str:
    """A docstring as Markdown: prose through ``_markdown``, lines indented by four spaces or
    more (examples, tables) kept as they are, in a code block."""
    blocks: list[tuple[bool, list[str]]] = []   # (literal, lines), in order
    for line in inspect.cleandoc(doc or "").splitlines():
        literal = line.startswith("    ") or (not line.strip() and bool(blocks) and blocks[-1][0])
        if not blocks or blocks[-1][0] != literal:
            blocks.append((literal, []))
        blocks[-1][1].append(line)
    out = []
    for literal, lines in blocks:
        if literal:
            while lines and not lines[-1].strip():
                lines.pop()
            out += ["", "```text", *inspect.cleandoc("\n".join(lines)).splitlines(), "```", ""]
        else:
            out.append(_markdown("\n".join(lines)))
    return "\n".join(out).strip("\n")


def _trailing_comment(line: str) -> str:
    """The comment that ends a line of code ('' when none; a ``#`` inside a string is no comment)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return ""
    return next((t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT), "")


def _field_comments(cls: type) -> dict[str, str]:
    """The comments of each field in a class's source (the comment lines just above it, then the
    one ending its line): they document the fields of the dataclasses that have no docstring."""
    try:
        source = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    lines = source[next(i for i, line in enumerate(source) if line.lstrip().startswith("class ")) + 1:]
    body = next((line for line in lines if line.strip()), "")
    field = re.compile(rf"{re.escape(body[: len(body) - len(body.lstrip())])}(\w+)\s*:\s*\S")
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
            continue
        match = field.match(line)
        text = " ".join([*above, _trailing_comment(line)]).strip() if match else ""
        if text:
            comments[match[1]] = text
        above = []
    return comments


def _annotation(value: Any) -> str:
    """A type annotation as text."""
    return value if isinstance(value, str) else inspect.formatannotation(value)


class _Written(str):
    """An annotation as its source wrote it (``from __future__ import annotations`` keeps them
    as strings, which a signature would print quoted)."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj: Any, name: str, width: int = 90) -> str:
    """``name(parameters) -> returns`` as the source writes them; one parameter a line when long."""
    signature = inspect.signature(obj)
    parameters = [parameter.replace(annotation=_Written(_annotation(parameter.annotation)))
                  if parameter.annotation is not inspect.Parameter.empty else parameter
                  for parameter in signature.parameters.values()]
    returns = ("" if signature.return_annotation in (inspect.Signature.empty, None, "None")
               else f" -> {_annotation(signature.return_annotation)}")
    written = [str(parameter) for parameter in parameters]
    one_line = f"{name}({', '.join(written)}){returns}"
    if len(one_line) <= width:
        return one_line
    return f"{name}(\n" + "".join(f"    {parameter},\n" for parameter in written) + f"){returns}"


def _describe_object(name: str, obj: Any) -> list[str]:
    """A class or function: its signature, its docstring, and for a dataclass or protocol its
    fields with their types and comments."""
    if not inspect.isclass(obj):
        heading = f"def {_signature(obj, name)}"
    elif dataclasses.is_dataclass(obj):
        heading = f"class {_signature(obj, name)}"
    else:
        heading = f"class {name}({', '.join(base.__name__ for base in obj.__bases__)})"
    lines = [f"### {name}", "", "```python", heading, "```", ""]
    doc = obj.__doc__
    if doc and not (inspect.isclass(obj) and doc.startswith(f"{name}(")):   # not a dataclass's generated one
        lines += [_docstring_block(doc), ""]
    if inspect.isclass(obj):
        comments = _field_comments(obj)
        hints = getattr(obj, "__annotations__", {})
        if hints:
            lines += ["| field | type | what it holds |", "| --- | --- | --- |"]
            lines += [f"| `{field}` | {_code_cell(_annotation(hint))} | {_cell(comments.get(field, ''))} |"
                      for field, hint in hints.items()]
            lines.append("")
        methods = [(attr, member) for attr, member in vars(obj).items()
                   if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))]
        for attr, member in methods:
            function = member.fget if isinstance(member, property) else member
            label = f"{name}.{attr}" if isinstance(member, property) else _signature(function, f"{name}.{attr}", 10**6)
            lines += [f"- {_code_cell(label)}" + (f": {_cell(_paragraphs(function.__doc__)[0])}" if function.__doc__ else "")]
        if methods:
            lines.append("")
    return lines


def _source_docstring(path: Path, name: str | None = None) -> str | None:
    """The docstring of ``path`` (a module, read without importing it) or of its function ``name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if name is None:
        return ast.get_docstring(tree)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_docstring(node)


def _public_members(module: ModuleType) -> Iterator[tuple[str, Any]]:
    """The classes and functions ``module`` defines itself (not imports), in source order."""
    members = [(name, member) for name, member in vars(module).items()
               if not name.startswith("_") and (inspect.isclass(member) or inspect.isfunction(member))
               and getattr(member, "__module__", None) == module.__name__]
    yield from sorted(members, key=lambda pair: inspect.getsourcelines(pair[1])[1])


# ----------------------------------------------------------------------------- the CLI

USAGE_WIDTH = 100


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """How an argument is written: ``--llm {off,live,batch}``, ``PATH [PATH ...]``."""
    formatter = parser._get_formatter()   # argparse's own rendering, as --help shows it
    return formatter._format_action_invocation(action)


def _default(action: argparse.Action) -> str:
    """An argument's default as the table shows it: ``required``, nothing for none, or the value."""
    from grader.batch import default_workers

    if action.required:
        return "required"
    if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    if action.dest == "workers" and action.default == default_workers():   # the one default read from the machine
        return "the machine's cores"
    return f"`{action.default}`"


def cli_page() -> str:
    """Every command of ``grader``, its usage and arguments, walked from the argument parser."""
    from grader import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    lines = ["# Command line", "", GENERATED_NOTE.format(source="`grader.cli.build_parser()`"),
             _docstring_block(cli.__doc__), "",
             "`make install` puts the command at `.venv/bin/grader`: activate the venv "
             "(`source .venv/bin/activate`) or call it by that path.", "",
             "| command | what it does |", "| --- | --- |"]
    lines += [f"| [`grader {name}`](#grader-{name}) | {_cell(helps[name])} |" for name in commands.choices]
    lines.append("")
    for name, command in commands.choices.items():
        formatter = argparse.HelpFormatter(command.prog, width=USAGE_WIDTH)   # not the terminal's width
        formatter.add_usage(command.usage, command._actions, command._mutually_exclusive_groups, prefix="")
        usage = formatter.format_help().strip()
        lines += [f"## grader {name}", "", f"{helps[name][0].upper()}{helps[name][1:]}.", "",
                  "```text", usage, "```", ""]
        for group in command._action_groups:
            actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            lines += [f"**{group.title[0].upper()}{group.title[1:]}**", "",
                      "| argument | default | what it does |", "| --- | --- | --- |"]
            for action in actions:
                help_text = action.help or ""
                if action.choices and not isinstance(action.choices, dict):
                    help_text = help_text or f"one of {', '.join(map(str, action.choices))}"
                lines.append(f"| {_code_cell(_invocation(command, action))} | {_default(action)} | {_cell(help_text)} |")
            lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the rubric

def _shape(field: Any) -> str:
    if field.keys is not None:
        return "mapping"
    if field.entries is not None:
        return "list"
    if field.values is not None:
        return "mapping, any keys"
    return "value"


def _schema_rows(field: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """(path, shape, what it holds) for every key under ``field``, depth first; paths are written
    as the rubric loader's messages write them: ``items[]``, ``written.rerun.*``."""
    if field.keys is not None:
        for key, child in field.keys.items():
            where = f"{path}.{key}" if path else key
            yield where, _shape(child), child.doc
            yield from _schema_rows(child, where)
    elif field.entries is not None:
        entry = field.entries
        if entry.keys is not None or entry.values is not None or entry.entries is not None:
            yield from _schema_rows(entry, f"{path}[]")
    elif field.values is not None and (field.values.keys is not None or field.values.entries is not None):
        yield f"{path}.*", _shape(field.values), field.values.doc
        yield from _schema_rows(field.values, f"{path}.*")


def _element(field: Any) -> str:
    """What a list's entries or a free mapping's values are, for the shape column."""
    inner = field.entries or field.values
    if inner is None or inner.keys is not None:
        return ""
    return f" (each: {inner.doc})" if field.entries is not None else f" (each value: {inner.doc})"


def rubric_page() -> str:
    """Every key of a rubric file, from ``RUBRIC_SCHEMA``, then the defaults the loader fills in."""
    from grader import rubric

    def shape_of(path: str) -> Any:
        field = rubric.RUBRIC_SCHEMA
        for part in path.replace("[]", ".[]").split("."):
            field = {"[]": field.entries, "*": field.values}.get(part) or (field.keys or {}).get(part)
        return field

    lines = ["# Rubric keys", "", GENERATED_NOTE.format(source="`grader.rubric.RUBRIC_SCHEMA`"),
             "A rubric is `rubrics/<assignment>.yaml`. `grader.rubric.load_rubric` reads it and stops at the "
             "first problem, naming the entry; a key the schema has no place for stops it too, naming where it "
             "is, the closest valid key and, for a key that belongs elsewhere, where. `items[]` is every entry "
             "of the list `items`; `written.rerun.*` is every key of the mapping `written.rerun`.", "",
             "| key | shape | what it holds |", "| --- | --- | --- |"]
    for path, shape, doc in _schema_rows(rubric.RUBRIC_SCHEMA, ""):
        lines.append(f"| `{path}` | {shape}{_element(shape_of(path))} | {_cell(doc)} |")
    lines += ["", "## Defaults", "",
              "A key left out takes its default, from the dataclass the loader fills in.", ""]
    for title, cls in (("`limits`", rubric.Limits), ("`written`", rubric.LLMSettings),
                       ("`written.prices_per_mtok`", rubric.Prices)):
        lines += [f"### {title}: `{cls.__name__}`", "", _docstring_block(inspect.getdoc(cls)), "",
                  "| key | default |", "| --- | --- |"]
        lines += [f"| `{f.name}` | `{f.default}` |" for f in dataclasses.fields(cls)
                  if f.default is not dataclasses.MISSING]
        lines.append("")
    example = REPO / "bench" / "rubrics" / "small_questions.yaml"
    lines += ["## A small rubric", "",
              f"The bench's assignment (`{example.relative_to(REPO)}`), graded by the "
              "[assignment author's guide](../authoring.md):", "",
              "```yaml", example.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- results.json

#: What each field of results.json holds. The code decides which fields exist (see module doc).
RESULTS_FIELDS = {
    "score": "the points of every item, as graded (a pending item counts 0)",
    "output": "the grader's notes on the submission, one a line (`Graded.` when there are none)",
    "output_format": "`text`",
    "execution_time": "seconds the submission's grading took (wall clock)",
    "tests[]": "one entry per rubric item, in the rubric's order (Gradescope's tests)",
    "tests[].name": "the item's title",
    "tests[].score": "its points",
    "tests[].max_score": "its maximum",
    "tests[].status": "Gradescope's `passed` or `failed` (the grader's own state is `extra_data.state`)",
    "tests[].output": "what the student is told: what was checked and what differed; for an item a TA "
                      "decided, that decision; for one waiting for a person, that it waits",
    "tests[].output_format": "`text`",
    "tests[].visibility": "Gradescope's visibility, from the rubric: `visible`, `hidden`, `after_due_date`, "
                          "`after_published`",
    "tests[].tags": "the item's concerns, from the rubric",
    "tests[].extra_data": "the grader's own data on the item",
    "tests[].extra_data.id": "the item's stable id (the rubric's `name`): what overrides.yaml and the "
                             "gradebook's columns use",
    "tests[].extra_data.state": "`passed`, `failed`, `error` (the grader could not judge it) or `pending_review`",
    "tests[].extra_data.message": "the item's own message, when `output` shows a TA's decision or that it waits",
    "tests[].extra_data.override": "a TA's override (overrides.yaml, applied by `grader report`)",
    "tests[].extra_data.override.original_score": "the score before any override",
    "tests[].extra_data.override.original_state": "the state before any override",
    "tests[].extra_data.override.score": "the TA's score",
    "tests[].extra_data.override.comment": "the TA's comment, shown to the student",
    "tests[].extra_data.override.reviewer": "who decided",
    "tests[].extra_data.override.notebook_sha256": "the notebook reviewed: a later grade of a changed "
                                                   "notebook does not apply the override",
    "tests[].extra_data.override.time": "when the decision was made (UTC, ISO 8601)",
    "tests[].extra_data.details": "what the pages show beyond the text: a written answer's draft (points, "
                                  "rationale and quotes per criterion, confidence, flags, why it waits)",
    "submission_id": "the submission's safe id: its notebook's or folder's name, or a safe form of it",
    "assignment": "the assignment's name",
    "grader_version": "the grader's version",
    "submission_sha256": "the sha256 of the notebook, or of every file graded for a package-style submission",
    "cache_key": "what the result depends on; a rerun with the same key grades nothing",
    "extra_data": "the grader's own data on the submission: the five fields above again, and:",
    "extra_data.submission_id": "as above",
    "extra_data.assignment": "as above",
    "extra_data.grader_version": "as above",
    "extra_data.submission_sha256": "as above",
    "extra_data.cache_key": "as above",
    "extra_data.isolation": "how student code was isolated: `bubblewrap`, `unprivileged-user` or `none` "
                            "(absent when no code ran)",
    "extra_data.sources": "package-style submissions only: the file each part was graded from",
    "extra_data.grader_errors": "items whose check crashed (`*` for the whole submission); the next "
                                "`grader grade` grades them again",
    "extra_data.submitted_as": "the file or folder name as submitted, when the id had to differ",
    "extra_data.digests": "the grader's digests the result was graded under",
    "extra_data.digests.execution": "what runs and what comes back (see [Architecture](../architecture.md#digests))",
    "extra_data.digests.evaluation": "what judges the raw outputs",
    "extra_data.timings": "where the time went; decides nothing",
    "extra_data.timings.stages": "ordered `[name, seconds]` pairs: `sandbox_start`, `kernel_start`, each code "
                                 "cell that ran (`code cell 3 (In[3])`), `probe_start`, `probe_cases`, `checks`, "
                                 "`written`, `report`; a stage that did not happen is absent",
    "extra_data.timings.wall_s": "the grading's wall time",
    "extra_data.timings.peak_memory_mib": "the most memory the sandboxes used at once (PSS of their processes "
                                          "plus their tmpfs)",
    "extra_data.attempts[]": "attempts on the grader read from the student's code, for TAs (never on the "
                             "student's page; they change no score)",
    "extra_data.attempts[].kind": "what it tries: `library_patch`, `frame_access`, `code_replacement`, "
                                  "`comparison_override`, `traceback_silenced`, `process_control`, "
                                  "`grader_files`, `dynamic_code`",
    "extra_data.attempts[].where": "the code cell and line (`code cell 9, line 3`), or the package file",
    "extra_data.attempts[].code": "the line, cut at 160 characters",
    "extra_data.attempts[].detail": "the name, attribute or string that makes it one (`sets numpy.allclose`)",
    "extra_data.students[]": "Gradescope only: the submitters, as Gradescope names them",
    "extra_data.students[].name": "a submitter's name",
    "extra_data.students[].sid": "their student id",
    "extra_data.students[].email": "their email",
    "extra_data.error": "Gradescope only, when the submission could not be graded at all: why (score 0, "
                        "no tests)",
}
#: Fields whose content is described as a whole, not key by key.
OPAQUE_FIELDS = ("tests[].extra_data.details", "extra_data.sources", "extra_data.timings.stages",
                 "extra_data.grader_errors")


def _json_paths(value: Any, path: str = "") -> Iterator[str]:
    """Every field path of a JSON value, a list of objects written ``name[]``, down to the
    opaque fields (a list of plain values is one field)."""
    if isinstance(value, list) and (not value or isinstance(value[0], dict)):
        path, value = f"{path}[]", (value[0] if value else None)
    if path:
        yield path
    if path in OPAQUE_FIELDS or not isinstance(value, dict):
        return
    for key, inner in value.items():
        yield from _json_paths(inner, f"{path}.{key}" if path else key)


def _results_examples() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A results.json with every optional field set, through the code that writes each: a
    result's ``to_json`` after a real override; and what the Gradescope step adds or writes."""
    from grader import gradescope
    from grader.report.overrides import OVERRIDES_FILE, apply_overrides
    from grader.report.results import write_result
    from grader.score import GradeResult, ItemResult

    item = ItemResult("an_item", "An item", 1.0, 2.0, "failed", "what differed", ["a-tag"],
                      details={"criteria": []})
    result = GradeResult("alice", "an_assignment", "0", "0" * 64, [item], notes=["a note"], execution_time=1.0,
                         cache_key="0" * 64, isolation="bubblewrap", sources={"scaffold": "g2c/a.py"},
                         grader_errors=["an_item"], submitted_as="Alice's notebook.ipynb",
                         digests={"execution": "0" * 64, "evaluation": "0" * 64},
                         stages=[("sandbox_start", 0.5)], peak_memory_mib=100.0,
                         attempts=[{"kind": "library_patch", "where": "code cell 9, line 3",
                                    "code": "np.allclose = f", "detail": "sets numpy.allclose"}])
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        write_result(out, result)
        (out / OVERRIDES_FILE).write_text("alice:\n  an_item:\n    score: 2\n    comment: fine\n    reviewer: jdoe\n")
        apply_overrides([result], out)
    graded = result.to_json()
    graded["extra_data"]["students"] = gradescope.submitters({"users": [{"name": "A", "sid": "1", "email": "a@b"}]})
    return graded, [gradescope.failure_results("a reason")]


def results_page() -> str:
    """results.json's fields: which exist comes from the code, what each holds from ``RESULTS_FIELDS``."""
    graded, others = _results_examples()
    found = list(dict.fromkeys(path for data in (graded, *others) for path in _json_paths(data)))
    for path in found:
        if path not in RESULTS_FIELDS:
            log.warning(f"docs/hooks.py: results.json field `{path}` has no description in RESULTS_FIELDS")
    for path in RESULTS_FIELDS:
        if path not in found:
            log.warning(f"docs/hooks.py: RESULTS_FIELDS describes `{path}`, which results.json no longer has")
    lines = ["# results.json", "", GENERATED_NOTE.format(
                 source="what `GradeResult.to_json`, a TA's override and the Gradescope step write"),
             "One file per submission, `DIR/<id>/results.json`, in Gradescope's autograder format (upload it as "
             "it is; the tests check it against a JSON Schema written from Gradescope's specification), with "
             "the grader's own data in the `extra_data` fields: a test's `status` can only be `passed` or "
             "`failed` there, so the grader's own state and the item's stable id are in its `extra_data`. "
             "`tests[]` is every entry of the list `tests`.", "",
             "| field | what it holds |", "| --- | --- |"]
    lines += [f"| `{path}` | {_cell(RESULTS_FIELDS.get(path, ''))} |" for path in found]
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the output folder

#: What each file of an output folder holds; ``<id>/...`` are a submission's own files.
OUTPUT_FILES = {
    "gradebook.csv": "one row per submission: `submission_id`, `total` (the points graded so far), `max`, "
                     "`pending` (items still waiting for a person), then one column per item; a pending item's "
                     "cell is empty, never 0",
    "summary.html": "the class page for TAs: the review queue, attempts on the grader, histogram, pass rate per "
                    "item, common failure causes, timings, LLM cost, overrides, score changes, the groups of "
                    "submissions similarity flagged",
    "similarity.json": "every pair of submissions whose code or written answer is alike at or above the reporting "
                       "floor, `flagged` above the threshold, with the matching passages, the thresholds and the "
                       "method ([similarity](../similarity.md)); not written with `--similarity off`",
    "similarity.html": "that comparison for TAs: each flagged pair's passages side by side, then every reported pair",
    "published.json": "what `grader publish --apply` posted to Canvas, per target and student: the score and a "
                      "digest of the comment and page, so a rerun posts only what changed",
    "queue": "the review queue: `queue/<item>-<n>.html`, one page set per written question and per errored "
             "item, 25 rows a page",
    "overrides.yaml": "yours: a TA's scores (the grader only reads it)",
    "overrides_applied.json": "the overrides applied, with the original scores and the notebook reviewed",
    "score_changes.json": "scores that a regrade changed: old and new per item, and why",
    "release.json": "what students' pages show (`none`, `due`, `published`), kept until `--release` changes it, and the assignment root of an assignment graded with `--assignment-root`",
    "llm_usage.json": "with `--llm`: tokens, confirmations and the estimated cost",
    "llm_batch.json": "with `--llm batch`: the Message Batch in flight, so a rerun collects it",
    ".llm-cache": "with `--llm`: the model's drafts and confirmations, so an unchanged answer costs nothing again",
    "canvas_import.csv": "what `grader export` writes by default",
    "<id>/results.json": "the result, in Gradescope's format: see [results.json](results.md)",
    "<id>/report.html": "the student's page: released items only",
    "<id>/review.html": "the same for TAs: every item, the written answers with the model's draft, the flags",
    "<id>/executed.ipynb": "the graded run of the notebook, with its outputs",
    "<id>/executed.html": "that run as a page (no script), linked from review.html",
    "<id>/written_inputs.json": "what the written-answer stage reads: each answer and its grounding values",
    "<id>/scaffold.py": "the student's code as graded (the cells or package file the probe imported)",
    "<id>/raw_outputs.bin": "the kept run: what the sandboxed stages returned, so that a change to the checks "
                            "alone regrades without running anything",
    "<id>/screening.json": "the grade-time screening's flags on the written answers",
    "<id>/grader_errors.txt": "only when a check crashed: its traceback, for the grader's maintainers",
}


def output_folder_page() -> str:
    """An output folder's files: the top-level names the grader reserves, and a submission's own."""
    from grader import intake, pipeline
    from grader.report import executed, pages, results
    from grader.written import WRITTEN_INPUTS

    top = sorted(intake.RESERVED_IDS)
    own = sorted(f"<id>/{name}" for name in (
        results.RESULTS_FILE, pages.REPORT_PAGE, pages.REVIEW_PAGE, executed.EXECUTED_PAGE, WRITTEN_INPUTS,
        pipeline.EXECUTED_NOTEBOOK, pipeline.SCAFFOLD_SOURCE, pipeline.RAW_OUTPUTS, pipeline.SCREENING,
        pipeline.GRADER_ERRORS))
    for name in [*top, *own]:
        if name not in OUTPUT_FILES:
            log.warning(f"docs/hooks.py: the output folder's `{name}` has no description in OUTPUT_FILES")
    for name in OUTPUT_FILES:
        if name not in top and name not in own:
            log.warning(f"docs/hooks.py: OUTPUT_FILES describes `{name}`, which the grader no longer writes")
    lines = ["# The output folder", "", GENERATED_NOTE.format(
                 source="`grader.intake.RESERVED_IDS` and the file names of `grader.pipeline` and `grader.report`"),
             "`grader grade PATH... --out DIR` writes DIR; `make grade` writes `out/<assignment>/`. "
             "Results are written as each submission finishes, so an interrupted run resumes where it "
             "stopped. No submission may take a name listed here: such a name gets a safe id of its own.", "",
             "| file | what it holds |", "| --- | --- |"]
    written = [name for name in OUTPUT_FILES if name in top or name in own]
    lines += [f"| `{name}` | {_cell(OUTPUT_FILES.get(name, ''))} |"
              for name in [*written, *(name for name in [*top, *own] if name not in OUTPUT_FILES)]]
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the checks API

def checks_api_page() -> str:
    """What a checks module uses: the contract, verdicts, the probe's cases, the comparison rules,
    the harness's ``call`` handler, and the bench's checks module as a complete small example."""
    import grader.checks as checks
    from grader import probe
    from grader.checks import compare

    harness = GRADER / "harness" / "probe_harness.py"
    example = REPO / "bench" / "checks" / "small_questions_checks.py"
    lines = ["# Checks API", "", GENERATED_NOTE.format(source="the docstrings and signatures of `grader.checks`, "
                                                               "`grader.checks.compare`, `grader.checks.inline`, "
                                                               "`grader.probe` and the probe harness"),
             "A checks module decides an assignment's autograded items; the rubric names it (`checks:`). "
             "The [assignment author's guide](../authoring.md) walks through writing one.", "",
             "## grader.checks", "", _docstring_block(checks.__doc__), ""]
    for name, member in _public_members(checks):
        lines += _describe_object(name, member)
    lines += ["## Probe cases: grader.probe", "", _docstring_block(probe.__doc__), ""]
    for name in ("ProbeCase", "Segments", "CaseOutput", "ProbeResult"):
        lines += _describe_object(name, getattr(probe, name))
    lines += ["## The harness's `call` handler", "",
              "A case of kind `call` needs no driver file. Its `config`:", "",
              _docstring_block(_source_docstring(harness, "case_call")), "",
              "Each argument is one of:", "", _docstring_block(_source_docstring(harness, "_argument")), "",
              "Other kinds are handlers of the checks module's driver file (`PROBE_DRIVER`):", "",
              _docstring_block(_source_docstring(harness, "load_handlers")), "",
              "## Comparing: grader.checks.compare", "", _docstring_block(compare.__doc__), ""]
    for name, member in _public_members(compare):
        lines += _describe_object(name, member)
    from grader.checks import inline
    lines += ["## Test cells: grader.checks.inline", "", _docstring_block(inline.__doc__), "",
              "What crosses from the sandbox (the harness's side of a test cell):", "",
              _docstring_block(_source_docstring(harness, "_as_data")), ""]
    lines += ["## A complete checks module", "",
              f"`{example.relative_to(REPO)}`, the bench's small assignment: three functions, each called by "
              "the `call` handler and compared with a reference computed here.", "",
              "```python", example.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the modules

def modules_page() -> str:
    """Every module of the grader package with the first paragraph of its docstring (read from
    the source: the harness's modules run only inside the sandbox)."""
    lines = ["# The grader's modules", "", GENERATED_NOTE.format(source="each module's docstring"),
             "| module | what it is |", "| --- | --- |"]
    for path in sorted(GRADER.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        doc = _source_docstring(path)
        lines.append(f"| `{name}` | {_cell(_paragraphs(doc)[0]) if doc else ''} |")
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- pieces of pages

def digests_table() -> str:
    """Which of the grader's files counts in the execution digest, which in the evaluation
    digest, and which in neither (with why), from ``grader.digests``."""
    from grader import digests

    rows = [*((pattern, "execution", "") for pattern in digests.EXECUTION_FILES),
            *((pattern, "evaluation", "") for pattern in digests.EVALUATION_FILES),
            *((pattern, "neither", why) for pattern, why in digests.NEITHER.items())]
    lines = ["| files of `grader/` | digest | why neither |", "| --- | --- | --- |"]
    lines += [f"| `{pattern}` | {digest} | {_cell(why)} |" for pattern, digest, why in rows]
    lines += ["", f"The execution digest also covers the versions of Python and of "
                  f"{', '.join(f'`{name}`' for name in digests.LIBRARIES)}."]
    return "\n".join(lines)


def items_table(assignment: str) -> str:
    """An assignment's autograded items and written questions, from its rubric."""
    from grader.assignment import Assignment

    rubric = Assignment(assignment).rubric
    lines = [f"{len(rubric.items)} autograded items and {len(rubric.questions)} written questions, "
             f"{rubric.max_score:g} points (`rubrics/{assignment}.yaml`):", "",
             "| item | points | tags | what it checks | visibility |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{item.name}` | {item.points:g} | {', '.join(item.tags)} | {_cell(item.title)} | {item.visibility} |"
              for item in rubric.items]
    lines += [f"| `{question.item_name}` | {question.points:g} | written | {len(question.criteria)} criteria | "
              f"{rubric.llm.visibility} |" for question in rubric.questions]
    return "\n".join(lines)


INSERTS: dict[str, Callable[..., str]] = {"digests": digests_table, "items": items_table}
INSERT_LINE = re.compile(r"^<!-- generated: (?P<name>\S+)(?P<args>(?: \S+)*) -->$", re.MULTILINE)


# ----------------------------------------------------------------------------- the hook

PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/rubric.md": rubric_page,
    "reference/results.md": results_page,
    "reference/output-folder.md": output_folder_page,
    "reference/checks-api.md": checks_api_page,
    "reference/modules.md": modules_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages to the build."""
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace each ``<!-- generated: NAME ARGS -->`` line by the piece it names."""
    def piece(match: re.Match[str]) -> str:
        make = INSERTS.get(match["name"])
        if make is None:
            log.warning(f"{page.file.src_uri}: no generated piece named {match['name']!r} (known: {sorted(INSERTS)})")
            return match[0]
        return make(*match["args"].split())

    return INSERT_LINE.sub(piece, markdown)
