"""The documentation cannot rot: the site builds in strict mode (a broken link, page or anchor, or
a reference table that no longer matches the code, fails), and every command that a page marks
runnable is run and must exit as the mark says (docs/contributing.md: the convention).

Runnable blocks run as in a checkout after ``make grade``, on one folder per page: copies of
``assignments/`` and ``examples/``, links to ``solutions/``, ``rubrics/`` and ``bench/``, and
``out/linear_attention_hyena/`` holding that assignment's example ``reference``, graded once here
through the command line (about 15 s; grading every example, as ``make grade`` does, takes
minutes). The pages' blocks run side by side, each page's in order. ``make grade`` itself is
checked cheaply: the pages the README's quickstart opens are those a graded folder holds, at the
paths the Makefile's grade target writes.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
GRADED = "linear_attention_hyena"   # out/<GRADED>/ holds its graded example `reference`
COPIED = ("assignments", "examples")   # a block may write there: copies
LINKED = ("solutions", "rubrics", "bench")   # read only: links
MARKER = re.compile(r"<!-- runnable(?::\s*(?P<how>exit|file)\s+(?P<arg>\S+))?\s*-->")
BLOCK_TIMEOUT_S = 300
README_MAX_LINES = 150
ROLE_GUIDES = ("student.md", "ta.md", "instructor.md", "authoring.md", "dask.md")


@dataclass(frozen=True)
class Block:
    """A code block that a page marks runnable: a script to run, or a file's text to write."""

    page: str
    line: int             # of its marker, counted from 1
    text: str
    exit_status: int = 0
    file: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def runnable_blocks(page: Path) -> list[Block]:
    """The blocks of ``page`` marked runnable, in order: a marker line, then a code fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for index, line in enumerate(lines):
        marker = MARKER.fullmatch(line.strip())
        if marker is None:
            continue
        where = f"{page.relative_to(ROOT)}:{index + 1}"
        opening = lines[index + 1] if index + 1 < len(lines) else ""
        fence = re.match(r"`{3,}|~{3,}", opening)
        assert fence, f"{where}: a runnable marker must be on the line just before a code fence"
        end = next((i for i in range(index + 2, len(lines)) if lines[i].strip() == fence.group(0)), None)
        assert end is not None, f"{where}: the code block is not closed"
        text = "\n".join(lines[index + 2:end]) + "\n"
        how, argument = marker["how"], marker["arg"]
        found.append(Block(page.name, index + 1, text, int(argument) if how == "exit" else 0,
                           argument if how == "file" else None))
    return found


PAGES = sorted(DOCS.glob("*.md"))
BLOCKS = [block for page in PAGES for block in runnable_blocks(page)]


def docs_env() -> dict[str, str]:
    """The environment of an activated venv in this checkout: its bin first on PATH, this
    checkout's grader imported, nothing of the test run's own settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("LA_NOTEBOOK", "PYTEST_ADDOPTS", "PYTHONPATH")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               PYTHONDONTWRITEBYTECODE="1", NO_MKDOCS_2_WARNING="1")
    return env


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    """out/linear_attention_hyena/ with its example `reference` graded, by the command line."""
    out = tmp_path_factory.mktemp("graded") / "out" / GRADED
    done = subprocess.run(["grader", "grade", str(ROOT / "examples" / "submissions" / GRADED / "reference.ipynb"),
                           "--assignment", GRADED, "--out", str(out), "--workers", "1"],
                          cwd=ROOT, env=docs_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, done.stdout
    return out


def checkout_after_make_grade(folder: Path, graded: Path) -> Path:
    """A folder laid out as a checkout after ``make grade`` (see the module's docstring)."""
    folder.mkdir(parents=True)
    for name in COPIED:
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    shutil.copytree(graded, folder / "out" / GRADED)
    return folder


def run_page(blocks: list[Block], folder: Path) -> dict[str, tuple[int | None, str]]:
    """Each block of one page, in order, in ``folder``: block name -> (exit status, output).
    A file block writes its text and exits with 0."""
    outcomes = {}
    for block in blocks:
        if block.file is not None:
            target = folder / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
            outcomes[block.name] = (0, f"wrote {target}")
            continue
        try:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=folder, env=docs_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S)
            outcomes[block.name] = (done.returncode, done.stdout)
        except subprocess.TimeoutExpired as exc:
            outcomes[block.name] = (None, f"{exc.output or ''}\n[stopped after {BLOCK_TIMEOUT_S} s]")
    return outcomes


@dataclass
class PagesRun:
    """What running every page's blocks left: each block's (exit status, output), by name, and
    the folder each page ran in."""

    outcomes: dict[str, tuple[int | None, str]]
    folders: dict[str, Path]


@pytest.fixture(scope="module")
def pages_run(tmp_path_factory, graded) -> PagesRun:
    """Every page's runnable blocks, run; the pages side by side."""
    work = tmp_path_factory.mktemp("pages")
    folders = {page: checkout_after_make_grade(work / page.removesuffix(".md"), graded)
               for page in sorted({block.page for block in BLOCKS})}
    with ThreadPoolExecutor(max_workers=len(folders)) as pool:
        futures = [pool.submit(run_page, [b for b in BLOCKS if b.page == page], folder)
                   for page, folder in folders.items()]
        outcomes = {name: outcome for future in futures for name, outcome in future.result().items()}
    return PagesRun(outcomes, folders)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_runnable_block_runs(block, pages_run):
    status, output = pages_run.outcomes[block.name]
    assert status == block.exit_status, (f"docs/{block.name}: exit status {status}, the page says "
                                         f"{block.exit_status}\n$ {block.text}\n{output[-4000:]}")


def test_the_guides_run_the_check_an_override_and_an_assignment_root():
    """The student's check, a TA's override and re-render, and an assignment graded from an
    assignment root are among the runnable blocks."""
    def scripts(page: str) -> str:
        return "\n".join(b.text for b in BLOCKS if b.page == page and b.file is None)

    assert "python check.py" in scripts("student.md") and "--run" in scripts("student.md")
    assert [b.file for b in BLOCKS if b.page == "ta.md" and b.file] == [f"out/{GRADED}/overrides.yaml"]
    assert f"grader report out/{GRADED}" in scripts("ta.md")
    assert "--assignment-root bench" in scripts("authoring.md")


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`, as `make docs` runs it: broken links, missing pages and anchors,
    and the reference generator's warnings fail it; every generated reference page is there."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          env=docs_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, done.stdout
    hooks = load_hooks()
    for uri in hooks.PAGES:
        assert (site / uri.removesuffix(".md") / "index.html").is_file(), uri
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    from grader import cli

    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert all(f'id="grader-{name}"' in cli_page for name in commands), sorted(commands)
    for page in PAGES:
        html = (site / ("" if page.stem == "index" else page.stem) / "index.html").read_text(encoding="utf-8")
        assert "<!-- generated:" not in html, f"{page.name}: a generated piece was not replaced"


def load_hooks() -> ModuleType:
    """docs/hooks.py as a module (MkDocs loads it by path too)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("table, page", [("RESULTS_FIELDS", "results_page"), ("OUTPUT_FILES", "output_folder_page")])
def test_a_description_table_out_of_step_with_the_code_warns(monkeypatch, caplog, table, page):
    """A field or file the code writes without a description, or a description of one it does
    not write, is a warning, which fails a strict build."""
    hooks = load_hooks()
    described = dict(getattr(hooks, table))
    first = next(iter(described))
    monkeypatch.setattr(hooks, table, {**{k: v for k, v in described.items() if k != first}, "gone": "no longer"})
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.reference"):
        getattr(hooks, page)()
    warned = [record.getMessage() for record in caplog.records]
    assert any(f"`{first}` has no description" in message for message in warned), warned
    assert any("`gone`" in message and "no longer" in message for message in warned), warned
    caplog.clear()
    monkeypatch.setattr(hooks, table, described)
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.reference"):
        getattr(hooks, page)()
    assert not caplog.records, [record.getMessage() for record in caplog.records]


def test_the_graded_folder_holds_only_described_files(pages_run):
    """Every file of a graded folder, after a TA's override and re-render, is described on the
    output folder's page (its top level, and a submission's own files as `<id>/...`)."""
    hooks = load_hooks()
    folder = pages_run.folders["ta.md"] / "out" / GRADED
    assert (folder / "overrides_applied.json").is_file()
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        name = relative.parts[0] if len(relative.parts) == 1 or relative.parts[0] == "queue" else \
            f"<id>/{'/'.join(relative.parts[1:])}"
        if path.is_file():
            assert name in hooks.OUTPUT_FILES, f"{relative} is not described in docs/hooks.py's OUTPUT_FILES"


def test_the_quickstart_opens_pages_that_make_grade_writes(graded):
    """The README's quickstart opens out/<assignment>/...: the Makefile's grade target writes each
    assignment's examples to out/<assignment>/, and a graded folder holds those pages."""
    readme = README.read_text(encoding="utf-8")
    opened = re.findall(r"`out/([\w-]+)/([\w./-]+\.html)`", readme)
    assert opened, "the README's quickstart names no page to open"
    assignments = re.search(r"^ASSIGNMENTS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split()
    dry_run = subprocess.run(["make", "-n", "grade"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=60)
    assert dry_run.returncode == 0, dry_run.stdout
    assert "grade examples/submissions/$name --assignment $name --out out/$name" in dry_run.stdout, dry_run.stdout
    for assignment, page in opened:
        assert assignment in assignments, f"make grade does not grade {assignment}"
        assert (graded / page).is_file(), f"a graded folder has no {page}"


def headings(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as the site's table of contents makes them."""
    return {slugify(line.lstrip("#").strip(), "-") for line in page.read_text(encoding="utf-8").splitlines()
            if re.match(r"#{1,6} ", line)}


def test_the_readme_is_a_first_page():
    """At most 150 lines; every relative link resolves (anchors included); each role's guide is
    one click away."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.is_file(), f"README links to {link}, which does not exist"
        assert not anchor or anchor in headings(path), f"README links to {link}: no such heading"
    assert {f"docs/{guide}" for guide in ROLE_GUIDES} <= {link.partition("#")[0] for link in links}


def test_the_authoring_guide_names_every_cell_tag():
    """The tags grader/cells.py defines (its docstring's list) are all in the authors' guide."""
    from grader import cells

    tags = re.findall(r"^``(\w+)``\s{2,}", cells.__doc__, re.MULTILINE)
    assert len(tags) >= 6, tags
    guide = (DOCS / "authoring.md").read_text(encoding="utf-8")
    assert [tag for tag in tags if f"`{tag}`" not in guide] == []
