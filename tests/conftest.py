"""Shared fixtures: the assignment, a real bubblewrap sandbox, notebook builders, and one
graded batch that several test modules assert things about."""
from __future__ import annotations

import ast
import copy
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jsonschema

import nbformat
import pytest

from grader import cells
from grader.assignment import Assignment
from grader.batch import BatchOutcome, grade_batch
from grader.intake import discover
from grader.sandbox.factory import make_sandbox
from grader.pipeline import SubmissionGrader
from grader.sandbox import ONE_THREAD_ENV, Sandbox, _UidLease

# torch on one thread in the test processes and in every process they start (grading workers,
# `grader` commands), as in the sandbox (ONE_THREAD_ENV): the two test processes already fill the
# two cores, and on a busy machine torch's idle threads spin (a fresh process's first grading,
# the checks' reference outputs, took 2.1 to 2.8 CPU s beside two busy processes, 0.35 on one
# thread). Set before any test module imports torch, which reads it once.
os.environ.update(ONE_THREAD_ENV)

ROOT = Path(__file__).resolve().parent.parent
SCAFFOLDS = Path(__file__).parent / "scaffolds"
SWEEPS = Path(__file__).parent / "sweeps"
PYTHON_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


@contextmanager
def leased_sandbox_uid() -> Iterator[int]:
    """A sandbox uid for a test's own process, leased as a grading run leases one: while the
    test runs it, no grader (in this or another test process) takes the uid or sweeps it."""
    lease = _UidLease()
    try:
        yield lease.uid
    finally:
        lease.release()


@pytest.fixture(scope="session")
def assignment() -> Assignment:
    return Assignment("linear_attention")


@pytest.fixture(scope="session")
def sandbox(assignment: Assignment) -> Sandbox:
    """The real sandbox; fails (never skips) when bubblewrap is unusable."""
    return make_sandbox(assignment.rubric.limits, allow_unsandboxed=False)


@pytest.fixture(scope="session")
def submission_grader(assignment: Assignment, sandbox: Sandbox) -> SubmissionGrader:
    return SubmissionGrader(assignment, sandbox)


def notebook_with_scaffold(master: nbformat.NotebookNode, scaffold_source: str) -> nbformat.NotebookNode:
    """The master notebook with its first scaffold cell's (the layer's) source replaced."""
    notebook = copy.deepcopy(master)
    next(cell for cell in notebook.cells if cells.SCAFFOLD in cells.tags(cell)).source = scaffold_source
    return notebook


def write_notebook(notebook: nbformat.NotebookNode, path: Path) -> Path:
    nbformat.write(notebook, str(path))
    return path


def scaffold_cell(master: nbformat.NotebookNode, written: str) -> str:
    """A whole scaffold cell from a file of tests/scaffolds/: the master's class with the
    methods the file writes in place of the master's (a mutant writes only its buggy one),
    after the file's own imports and helpers."""
    reference = next(cells.source(c) for c in master.cells if cells.SCAFFOLD in cells.tags(c))
    tree = ast.parse(reference)
    master_class = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    student = ast.parse(written)
    student_class = next(n for n in student.body if isinstance(n, ast.ClassDef))
    own = {n.name: n for n in student_class.body if isinstance(n, ast.FunctionDef)}
    master_class.body = [own.pop(n.name) if isinstance(n, ast.FunctionDef) and n.name in own else n
                         for n in master_class.body] + list(own.values())
    helpers = [n for n in student.body if n is not student_class]
    return ast.unparse(ast.Module(body=helpers + tree.body, type_ignores=[]))


def as_scaffolds(master: nbformat.NotebookNode, source: str) -> dict[str, str]:
    """``source`` as the student's cell for the master's first scaffold cell (the layer's), as
    load finds it, with the master's own code for the others (Exercise 1's sweep)."""
    found = {c.id: cells.source(c) for c in master.cells if cells.SCAFFOLD in cells.tags(c)}
    return {**found, cells.scaffolds(master)[0].cell_id: source}


GRADESCOPE_SCHEMA = json.loads((Path(__file__).parent / "gradescope_results.schema.json").read_text())


def gradescope_valid(folder: Path, ids: set[str] | None = None) -> int:
    """Validate each DIR/<id>/results.json under ``folder`` (of ``ids`` only, if given)
    against Gradescope's schema; returns how many there were."""
    paths = sorted(p for p in folder.glob("*/results.json") if ids is None or p.parent.name in ids)
    for path in paths:
        jsonschema.validate(json.loads(path.read_text()), GRADESCOPE_SCHEMA)
    return len(paths)


def items_by_id(results_json: dict) -> dict[str, dict]:
    """A results.json's tests by stable item id, with the grader's own state as ``status``."""
    return {t["extra_data"]["id"]: {**t, "status": t["extra_data"]["state"]} for t in results_json["tests"]}


# Exercise 1's cells, and the functions of Exercises 3 and 4 (defined, not run: their run cells train).
EXERCISE_CODE = ("ex1-helpers", "ex1-benchmark", "ex1-run", "ex3-recall", "ex4-decay")


def model_only(master: nbformat.NotebookNode, sweep: str | None = None) -> nbformat.NotebookNode:
    """The master's cells up to the hybrid model and the exercises' functions: fast to execute,
    full scaffold credit. ``sweep``: Exercise 1's cell instead of the master's."""
    notebook = copy.deepcopy(master)
    end = next(i for i, c in enumerate(notebook.cells) if c.get("id") == "hybrid-model")
    notebook.cells = notebook.cells[: end + 1] + [c for c in notebook.cells if c.get("id") in EXERCISE_CODE]
    if sweep is not None:
        next(c for c in notebook.cells if c.get("id") == "ex1-benchmark").source = sweep
    return notebook


# What a student may write to make a TA's terminal act, one class of control each, and what a
# terminal must show instead: the text around it (tests of grader.report.terminal.plain and of
# check.py's copy of it).
TERMINAL_ATTACKS = {
    "osc52_clipboard_bel": ("\x1b]52;c;cm0gLXJmIH4=\x07copied", "copied"),
    "osc52_clipboard_st": ("\x1b]52;c;cm0gLXJmIH4=\x1b\\copied", "copied"),
    "osc0_title": ("\x1b]0;pwned\x07title", "title"),
    "osc_unterminated": ("text\x1b]0;pwned", "text"),
    "csi_clear_screen": ("\x1b[2J\x1b[Hcleared", "cleared"),
    "csi_green": ("\x1b[32mgreen\x1b[0m", "green"),
    "dcs_tmux_passthrough": ("\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\after", "after"),
    "two_char_reset": ("\x1bcreset \x1b7saved\x1b8", "reset saved"),
    "lone_esc": ("a\x1b", "a"),
    "carriage_return_overwrite": ("NOT READY\r\x1b[32mREADY: all checks passed", "NOT READYREADY: all checks passed"),
    "c0_controls": ("a\x00b\x07c\x08d\x0be\x0cf\x1fg", "abcdefg"),
    "del": ("a\x7fb", "ab"),
    "c1_8bit_csi": ("\x9b2Jcleared", "2Jcleared"),
    "c1_controls": ("\x80a\x85b\x9dc\x9f", "abc"),
    "bidi_override": ("invoice\u202egpj.exe\u202c", "invoicegpj.exe"),
    "bidi_isolates_and_marks": ("\u2066a\u2067b\u2068c\u2069\u200ed\u200fe\u061cf", "abcdef"),
}
# Text a terminal shows as it is, which the sanitizer must leave alone.
HONEST_TEXT = ("naïve café, Ωμέγα, 中文, עברית, العربية", "columns\tby\ttabs\nand lines\n",
               "emoji 🎉 👩\u200d💻 (the joiner stays)", "[bold]markup[/bold] and [31m are text", "")


# Session fixtures that cost minutes, each built once: ``make test``'s test processes run the files
# that use one in the same process (see pytest_xdist_make_scheduler).
SHARING = {"batch": ("test_grading.py", "test_hostile_inputs.py", "test_pages.py", "test_timings.py"),
           "scaffold_corpus": ("test_hidden_checks.py", "test_isolated_concerns.py")}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (``make test``), with the files sharing a fixture of SHARING as one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling
    group = {file: f"the files sharing {fixture}" for fixture, files in SHARING.items() for file in files}

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return group.get(Path(path).name, path)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep SHARING complete: a file missing from it would build its fixture again."""
    for fixture, files in SHARING.items():
        missing = {item.path.name for item in items if fixture in getattr(item, "fixturenames", ())} - set(files)
        if missing:
            raise pytest.UsageError(f"tests/conftest.py: add {sorted(missing)} to SHARING[{fixture!r}]")


@pytest.fixture(scope="session")
def scaffold_corpus() -> dict:
    """Every scaffold of tests/scaffolds graded in process (``test_hidden_checks.grade_corpus``):
    name -> (verdicts of the corpus items, deviation from the reference)."""
    from test_hidden_checks import grade_corpus
    return grade_corpus()


@pytest.fixture(scope="session")
def batch(tmp_path_factory, assignment, sandbox) -> tuple[Path, Path, BatchOutcome]:
    """(submissions folder, output folder, outcome) of one real batch: an untouched template,
    broken JSON, a raising cell, warnings on stderr (and Exercise 1 timed as a teacher-forced
    pass), a folder with two notebooks. Tests that
    change the output folder restore it, or work on a copy."""
    folder = tmp_path_factory.mktemp("submissions")
    write_notebook(assignment.template, folder / "untouched.ipynb")
    (folder / "broken_json.ipynb").write_text('{"cells": [ {"cell_type": ')
    raising = model_only(assignment.master)
    raising.cells.insert(3, nbformat.v4.new_code_cell("raise RuntimeError('student bug in a cell')"))
    write_notebook(raising, folder / "raises.ipynb")
    warns = model_only(assignment.master, (SWEEPS / "mistake_teacher_forced.py").read_text())
    warns.cells.append(nbformat.v4.new_code_cell(
        "import sys, warnings\nwarnings.warn('a UserWarning like PyTorch prints')\n"
        "print('noise on stderr', file=sys.stderr)\n"
        "torch.allclose = lambda *args, **kwargs: True   # an attempt on the grader, neutralised"))
    write_notebook(warns, folder / "warns.ipynb")
    two = folder / "two_notebooks"
    two.mkdir()
    write_notebook(assignment.template, two / "a.ipynb")
    write_notebook(assignment.template, two / "b.ipynb")
    out = tmp_path_factory.mktemp("out")
    outcome = grade_batch(discover([folder]), assignment, sandbox, assignment.rubric, out, workers=2,
                          progress=io.StringIO())
    return folder, out, outcome


def finish_all(started: dict[str, subprocess.Popen], timeout: float) -> dict[str, tuple[int | None, str]]:
    """Wait for processes started together (stdout piped as text): name -> (exit status, output).
    One that outlives ``timeout`` is killed, and its output says so."""
    finished = {}
    for name, proc in started.items():
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            output += f"\n[killed after {timeout} s]"
        finished[name] = (proc.returncode, output)
    return finished


def _reachable_python() -> str:
    """A Python of this version that the sandbox user can run (as a container's python3 is)."""
    candidates = [str(Path(getattr(sys, "_base_executable", sys.executable)).resolve()),
                  shutil.which(PYTHON_VERSION, path="/usr/local/bin:/usr/bin") or ""]
    for candidate in filter(None, candidates):
        try:
            with leased_sandbox_uid() as uid:
                subprocess.run([candidate, "-c", "pass"], capture_output=True, check=True, user=uid,
                               group=uid, extra_groups=[], cwd="/")
            return candidate
        except (OSError, subprocess.CalledProcessError):
            continue
    pytest.fail(f"no {PYTHON_VERSION} that an unprivileged user can run among {candidates}")


def _link_or_copy(source: str, target: str) -> None:
    """Hard-link a file readable by all (permission changes to the copy, such as lock_down.sh's,
    leave such files alone); copy the rest."""
    if os.stat(source).st_mode & 0o004:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another filesystem
    shutil.copy2(source, target)


def venv_for_other_users(venv: Path, grader: Path | None = None) -> Path:
    """Make, at ``venv`` (whose parents the sandbox user must be able to enter), a virtualenv any
    user can run: on a Python an unprivileged uid can start, with this checkout's installed
    packages hard-linked into it and without its editable install of ``grader`` (a copy of
    ``grader`` goes in when given, as ``pip install`` would put it). This checkout's own venv
    may sit in a folder other users cannot enter (a clone in a ``mktemp -d`` folder does).
    Returns its python."""
    subprocess.run([_reachable_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / PYTHON_VERSION / "site-packages"
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.startswith(("__editable__", "g2c_grader")) or entry.name == "grader":
            continue   # this repo's editable install
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, site / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(entry), str(site / entry.name))
    shutil.copytree(Path(sys.prefix) / "share" / "jupyter", venv / "share" / "jupyter", symlinks=True,
                    copy_function=_link_or_copy)   # the python3 kernel spec
    if grader is not None:
        shutil.copytree(grader, site / "grader")
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def user_python() -> Iterator[str]:
    """The python of a virtualenv that any user can run (see venv_for_other_users), for runs at
    the unprivileged-user level; the grader comes from PYTHONPATH."""
    folder = Path(tempfile.mkdtemp(prefix="g2c-user-venv-"))
    try:
        os.chmod(folder, 0o755)
        yield str(venv_for_other_users(folder / "venv"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one wheel, g2c_tiny 0.1 (``ANSWER = 42``), built here from a local
    package: pip's only index (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``) in the requirements' tests."""
    base = tmp_path_factory.mktemp("wheels")
    package = base / "g2c_tiny"
    (package / "g2c_tiny").mkdir(parents=True)
    (package / "g2c_tiny" / "__init__.py").write_text("ANSWER = 42\n")
    (package / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                            'build-backend = "setuptools.build_meta"\n\n'
                                            '[project]\nname = "g2c_tiny"\nversion = "0.1"\n')
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                           "--no-build-isolation", "-w", str(base / "dist"), str(package)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return base / "dist"


def otter_master_requiring_g2c_tiny(folder: Path, requirements: str = "g2c_tiny==0.1\n") -> Path:
    """An otter master named tiny whose provided cell imports g2c_tiny, and whose one question's
    answer is g2c_tiny.ANSWER; its config names ``requirements`` (a requirements.txt beside it)."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_raw_cell("# ASSIGNMENT CONFIG\nname: tiny\nrequirements: requirements.txt\n"),
        nbformat.v4.new_code_cell("import g2c_tiny"),
        nbformat.v4.new_raw_cell("# BEGIN QUESTION\nname: q1\npoints: 1"),
        nbformat.v4.new_code_cell("def answer():\n    return g2c_tiny.ANSWER  # SOLUTION"),
        nbformat.v4.new_raw_cell("# BEGIN TESTS"), nbformat.v4.new_code_cell("assert answer() == 42"),
        nbformat.v4.new_raw_cell("# END TESTS"), nbformat.v4.new_raw_cell("# END QUESTION")])
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(folder / "tiny.ipynb"))
    (folder / "requirements.txt").write_text(requirements)
    return folder / "tiny.ipynb"
