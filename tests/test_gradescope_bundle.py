"""The Gradescope bundle, unpacked into a folder laid out like ``/autograder`` and run there.

The fixture builds ``autograder.zip`` with the CLI, unpacks it into ``ROOT/source`` next to a
submission (the reference notebook), a metadata file naming a fake student and an empty
``results/``, makes the virtualenv setup.sh would make, and runs the bundle's own
``lock_down.sh``, the permission step of setup.sh (the rest of setup.sh, apt and pip, cannot
run here). The tests then run ``run_autograder`` as Gradescope does, as root. A second fixture
does the same for an imported assignment with a requirement, built offline, and runs setup.sh's
own line that installs it before ``lock_down.sh``.

Three things differ from Gradescope, each on purpose:

- ROOT is a fresh folder of the host's temporary directory, not under pytest's ``tmp_path``:
  pytest's base folder is readable by root only, which would hide every file from the
  sandbox user whatever lock_down.sh does and prove nothing. It is removed afterwards.
- The virtualenv (``ROOT/venv``) is built on a Python the sandbox user can run (this repo's
  may live in root's home), with this repo's installed packages hard-linked into it (never
  copied, except files not readable by all, so lock_down.sh changes nothing of the repo's
  venv) and the bundle's ``grader`` copied in, as ``pip install`` (not editable) would.
- The repo's own venv has ``grader`` as an editable install pointing into the repository,
  which the sandbox user can read: the checks below are about the unpacked bundle only.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from grader import requirements
from grader.assignment import Assignment
from grader.cli import main as grader_main
from grader.gradescope import OUT_FOLDER, Layout
from grader.intake import find_submission

from conftest import (ROOT as REPO, gradescope_valid, leased_sandbox_uid, otter_master_requiring_g2c_tiny,
                      venv_for_other_users)

BASH = shutil.which("bash") or "/bin/bash"
PYTHON_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
STUDENT = {"name": "Ada Lovelace", "sid": "S0042", "email": "ada@example.edu"}
METADATA = {"id": 4242, "created_at": "2025-01-01T12:00:00.000000-08:00",
            "assignment": {"id": 77, "title": "Linear attention", "total_points": "108.0"},
            "submission_method": "upload", "users": [{**STUDENT, "id": 1}], "previous_submissions": []}

# Run as a sandbox uid: tries to open every path of stdin (a JSON list), then imports torch.
READ_PROBE = """\
import json, sys
opened, other_errors = [], []
for path in json.load(sys.stdin):
    try:
        open(path, "rb").close()
        opened.append(path)
    except PermissionError:
        pass
    except OSError as exc:
        other_errors.append(f"{path}: {exc!r}")
import torch
print(json.dumps({"opened": opened, "other_errors": other_errors, "torch": torch.__version__}))
"""


@dataclass(frozen=True)
class Autograder:
    root: Path
    names: list[str]                # the zip's entries
    zip_bytes: bytes
    hidden_before_lock_down: list[str]   # hidden_files() once unpacked, before lock_down.sh ran
    readable_before_lock_down: dict      # what READ_PROBE could open of them then

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def installed_grader(self) -> Path:
        return self.root / "venv" / "lib" / PYTHON_VERSION / "site-packages" / "grader"

    def hidden_files(self) -> list[str]:
        """Every file the sandbox user must not read: checks (bundle and installed copy),
        solutions, rubrics, the grade run's output folder, the metadata."""
        folders = [self.root / "source" / "grader" / "checks", self.root / "source" / "solutions",
                   self.root / "source" / "rubrics", self.installed_grader / "checks", self.root / OUT_FOLDER]
        files = [str(Path(d) / f) for folder in folders for d, _, names in os.walk(folder) for f in names]
        return files + [str(self.root / "submission_metadata.json")]

    def run(self, **env: str) -> tuple[dict, str]:
        """run_autograder as Gradescope runs it (as root): the results.json it left, its log."""
        proc = subprocess.run([BASH, str(self.root / "source" / "run_autograder")], capture_output=True,
                              text=True, timeout=600, cwd=self.root,
                              env={**os.environ, "AUTOGRADER_ROOT": str(self.root), **env})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = self.root / "results" / "results.json"
        assert results.is_file(), proc.stdout + proc.stderr
        assert gradescope_valid(self.root, {"results"}) == 1
        return json.loads(results.read_text()), proc.stdout + proc.stderr

    @property
    def without_namespaces(self) -> dict[str, str]:
        """The environment of a container where nothing can make namespaces: neither bwrap
        nor unshare on PATH (the grader looks them up there), only what run_autograder runs."""
        return {"PATH": str(self.root / "bin")}

    def install_requirements(self, **env: str) -> subprocess.CompletedProcess:
        """setup.sh's step that installs the assignment's requirements: its own line, run by bash
        with setup.sh's ROOT and VENV (the rest of setup.sh, apt and pip, cannot run here)."""
        setup = (self.root / "source" / "setup.sh").read_text().splitlines()
        lines = [text for text in setup if "--install-requirements" in text]
        assert len(lines) == 1, f"setup.sh has {len(lines)} lines that install the requirements, not one"
        line = lines[0]
        return subprocess.run([BASH, "-c", f'set -euo pipefail; ROOT="$1"; VENV="$2"; {line}', "setup.sh",
                               str(self.root), str(self.root / "venv")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, **env})

    def read_as_sandbox_user(self, paths: list[str]) -> dict:
        """READ_PROBE as a sandbox uid, a real process without any capability."""
        with leased_sandbox_uid() as uid:
            proc = subprocess.run([str(self.python), "-c", READ_PROBE], input=json.dumps(paths), capture_output=True,
                                  text=True, timeout=120, cwd="/", user=uid, group=uid, extra_groups=[],
                                  env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def autograder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Autograder]:
    bundle = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    assert grader_main(["gradescope-bundle", "--assignment", "linear_attention", "--out", str(bundle)]) == 0
    root = Path(tempfile.mkdtemp(prefix="g2c-autograder-"))
    try:
        names = _unpack(bundle, root, REPO / "examples" / "submissions" / "linear_attention" / "reference.ipynb")
        unlocked = Autograder(root, names, bundle.read_bytes(), [], {})
        hidden = unlocked.hidden_files()
        before = unlocked.read_as_sandbox_user(hidden)
        _lock_down(root)
        yield Autograder(root, names, unlocked.zip_bytes, hidden, before)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _unpack(bundle: Path, root: Path, submission: Path, venv: Path | None = None) -> list[str]:
    """Lay out ``root`` as Gradescope's /autograder before setup.sh's lock_down.sh: ``bundle``
    unpacked in source/, ``submission`` in submission/, the metadata, an empty results/, bin/
    (see ``without_namespaces``) and the virtualenv setup.sh would make, or a link to ``venv``,
    one made for a bundle of the same grader. Returns the zip's entries."""
    os.chmod(root, 0o755)   # as /autograder: lock_down.sh closes it
    with zipfile.ZipFile(bundle) as archive:
        names = archive.namelist()
        for info in archive.infolist():
            archive.extract(info, root / "source")
            os.chmod(root / "source" / info.filename, info.external_attr >> 16 & 0o777)
    (root / "submission").mkdir()
    shutil.copy(submission, root / "submission")
    (root / "submission_metadata.json").write_text(json.dumps(METADATA))
    (root / "results").mkdir()
    (root / "bin").mkdir()
    for tool in ("mkdir", "rm"):
        os.symlink(shutil.which(tool), root / "bin" / tool)
    if venv is None:
        venv_for_other_users(root / "venv", grader=root / "source" / "grader")
    else:
        os.symlink(venv, root / "venv")
    return names


def _lock_down(root: Path) -> None:
    """The bundle's own lock_down.sh, as setup.sh runs it last."""
    subprocess.run(["bash", str(root / "source" / "lock_down.sh")], check=True,
                   env={**os.environ, "AUTOGRADER_ROOT": str(root)})


def _autograded_points(assignment: Assignment) -> float:
    return sum(item.points for item in assignment.rubric.items)


def test_bundle_holds_the_grader_and_the_assignment_only(autograder: Autograder, tmp_path: Path) -> None:
    names = autograder.names
    assert names == sorted(names)
    for required in ("setup.sh", "run_autograder", "lock_down.sh", "pyproject.toml", "README.md",
                     "grader/sandbox/__init__.py", "grader/gradescope.py", "grader/harness/probe_harness.py",
                     "grader/checks/linear_attention/items.py", "assignments/linear_attention/linear_attention.ipynb",
                     "solutions/linear_attention/linear_attention.ipynb", "rubrics/linear_attention.yaml"):
        assert required in names, required
    assert [n for n in names if n.startswith("rubrics/")] == ["rubrics/linear_attention.yaml",
                                                               "rubrics/linear_attention_calibration.yaml"]
    assert {n.split("/")[1] for n in names if n.startswith(("solutions/", "assignments/"))} == {"linear_attention"}
    assert not [n for n in names if n.startswith(("tests/", "examples/", "out/", ".venv/", "gradescope/"))
                or "__pycache__" in n or n.endswith(".pyc")]
    run_autograder = (autograder.root / "source" / "run_autograder").read_text()
    assert 'ASSIGNMENT="linear_attention"' in run_autograder
    # The same repository gives the same bytes.
    again = tmp_path / "again.zip"
    assert grader_main(["gradescope-bundle", "--assignment", "linear_attention", "--out", str(again)]) == 0
    assert again.read_bytes() == autograder.zip_bytes


def test_reference_gets_full_autograded_marks_and_names_the_student(autograder: Autograder,
                                                                   assignment: Assignment) -> None:
    results, _ = autograder.run()   # isolation auto: bubblewrap works on this machine
    autograded = [t for t in results["tests"] if "written" not in t["tags"]]
    written = [t for t in results["tests"] if "written" in t["tags"]]
    assert [t for t in autograded if t["score"] != t["max_score"]] == []
    assert results["score"] == _autograded_points(assignment)
    assert written and all(t["score"] == 0 and t["extra_data"]["state"] == "pending_review" for t in written)
    assert results["extra_data"]["students"] == [STUDENT]
    assert results["extra_data"]["isolation"] == "bubblewrap"
    assert "Isolation: bubblewrap" in results["output"]
    assert results["submission_id"] == "4242"


def test_unprivileged_user_isolation_grades_and_hides_the_bundle(autograder: Autograder,
                                                                 assignment: Assignment) -> None:
    # No namespaces at all, as in a Gradescope container: neither bwrap nor a PID or network
    # namespace from unshare; the probe's supervisor then kills its workers by process group.
    results, _ = autograder.run(G2C_ISOLATION="unprivileged-user", **autograder.without_namespaces)
    assert results["extra_data"]["isolation"] == "unprivileged-user"
    assert "Isolation: unprivileged user without bubblewrap (chosen explicitly)" in results["output"]
    assert results["score"] == _autograded_points(assignment), results["output"]
    assert results["extra_data"]["students"] == [STUDENT]

    hidden = autograder.hidden_files()
    assert any("/grader-out/4242/" in path for path in hidden)   # the run's outputs are walked too
    # Before lock_down.sh the sandbox user could read all of the bundle (so this check can fail)...
    assert autograder.readable_before_lock_down["opened"] == autograder.hidden_before_lock_down
    # ...after it, nothing hidden, while the runtime the student's code needs still works.
    seen = autograder.read_as_sandbox_user(hidden)
    assert seen["opened"] == [] and seen["other_errors"] == []
    assert seen["torch"]


def test_auto_isolation_falls_back_to_the_unprivileged_user_without_bubblewrap(autograder: Autograder) -> None:
    # Without a notebook nothing runs, so this takes seconds: the sandbox is chosen all the same.
    notebook = autograder.root / "submission" / "reference.ipynb"
    aside = autograder.root / "reference.ipynb"
    notebook.rename(aside)
    try:
        results, log = autograder.run(**autograder.without_namespaces)
    finally:
        aside.rename(notebook)
    assert "Isolation: unprivileged user without bubblewrap (bubblewrap is not installed" in log
    assert results["score"] == 0 and "the folder holds no .ipynb notebook and no g2c/linear_attention/attention.py" in results["output"]
    assert results["extra_data"]["students"] == [STUDENT]


def test_a_grading_step_that_crashes_still_leaves_valid_results(autograder: Autograder) -> None:
    proc = subprocess.run([str(autograder.python), "-m", "grader.gradescope", "--assignment", "no_such_assignment",
                           "--root", str(autograder.root)], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert gradescope_valid(autograder.root, {"results"}) == 1
    results = json.loads((autograder.root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == []
    assert "could not grade" in results["output"] and "no_such_assignment" in results["output"]
    assert results["extra_data"]["students"] == [STUDENT]

    broken, _ = autograder.run(AUTOGRADER_VENV=str(autograder.root / "no-venv"))   # Python cannot even start
    assert broken["score"] == 0 and "failed before it could grade" in broken["output"]


PACKAGE = "g2c/linear_attention/attention.py"


def _upload(root: Path, *files: str) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    return root


def test_an_upload_is_found_as_one_notebook_and_or_the_package_files(tmp_path: Path) -> None:
    """What find_submission makes of Gradescope uploads (zip uploads nest their files)."""
    def found(*files: str):
        root = _upload(tmp_path / str(len(list(tmp_path.iterdir()))), *files)
        got = find_submission("s", root, [PACKAGE])
        rel = (lambda p: p.relative_to(root).as_posix() if p else None)
        return rel(got.path), rel(got.folder) if got.folder else None, got.problem

    assert found("hw.ipynb") == ("hw.ipynb", None, None)
    assert found("zip/hw.ipynb", f"zip/{PACKAGE}", "__MACOSX/zip/x.ipynb") == ("zip/hw.ipynb", "zip", None)
    assert found(f"zip/{PACKAGE}") == (None, "zip", None)
    assert found(PACKAGE) == (None, ".", None)
    assert found("a.ipynb", "b.ipynb")[2] == "the folder holds 2 notebooks (a.ipynb, b.ipynb); submit exactly one"
    assert found("notes.txt")[2] == f"the folder holds no .ipynb notebook and no {PACKAGE}"
    assert "one copy of the package files" in found(f"a/{PACKAGE}", f"b/{PACKAGE}")[2]
    assert "side by side" in found("other/hw.ipynb", f"zip/{PACKAGE}")[2]


# ----------------------------------------------------------------------------- an assignment's requirements

TINY_REQUIREMENTS = ["g2c_tiny==0.1"]


@pytest.fixture(scope="module")
def tiny_autograder(tmp_path_factory: pytest.TempPathFactory, wheels: Path,
                    autograder: Autograder) -> Iterator[Autograder]:
    """An imported otter assignment whose provided cell imports its one requirement, g2c_tiny
    (built offline: ``wheels``), bundled and unpacked with its master as the submission, then set
    up as setup.sh sets it up: its requirements' step (pip offline, from ``wheels``), lock_down.sh.
    Its virtualenv is ``autograder``'s, linked: both bundles carry this checkout's grader, and a
    second copy would take seconds to make and more to remove (tens of thousands of files)."""
    course = tmp_path_factory.mktemp("course")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in offline.items():
            patch.setenv(name, value)
        assert grader_main(["import", "otter", str(otter_master_requiring_g2c_tiny(course / "src")),
                            "--out", str(course / "root"), "--name", "tiny"]) == 0
    bundle = course / "autograder.zip"
    assert grader_main(["gradescope-bundle", "--assignment", "tiny", "--assignment-root", str(course / "root"),
                        "--out", str(bundle)]) == 0
    root = Path(tempfile.mkdtemp(prefix="g2c-autograder-"))
    try:
        names = _unpack(bundle, root, course / "root" / "solutions" / "tiny" / "tiny.ipynb", autograder.root / "venv")
        tiny = Autograder(root, names, bundle.read_bytes(), [], {})
        installed = tiny.install_requirements(**offline)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        _lock_down(root)
        yield tiny
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_setup_installs_the_requirements_where_the_grading_step_looks(tiny_autograder: Autograder) -> None:
    with zipfile.ZipFile(io.BytesIO(tiny_autograder.zip_bytes)) as archive:
        rubric = yaml.safe_load(archive.read("rubrics/tiny.yaml"))
    assert rubric["settings"]["requirements"] == TINY_REQUIREMENTS   # what setup.sh installs from
    assert [n for n in tiny_autograder.names if n.startswith(("envs/", "requirements/"))] == []
    envs = Layout(tiny_autograder.root).envs
    site = requirements.installed(TINY_REQUIREMENTS, envs)   # the grading step's own check
    assert site == envs / requirements.digest(TINY_REQUIREMENTS) / requirements.SITE
    assert sorted(p.name for p in envs.iterdir()) == [site.parent.name], "one environment, no partial install"
    assert (site / "g2c_tiny" / "__init__.py").read_text() == "ANSWER = 42\n"
    # lock_down.sh: the environment readable by the sandbox user (student code imports it),
    # the bundle it was installed from not.
    seen = tiny_autograder.read_as_sandbox_user([str(site / "g2c_tiny" / "__init__.py"),
                                                 str(tiny_autograder.root / "source" / "rubrics" / "tiny.yaml")])
    assert seen["opened"] == [str(site / "g2c_tiny" / "__init__.py")] and seen["other_errors"] == [], seen


def test_the_grading_step_imports_the_requirements_and_names_them(tiny_autograder: Autograder) -> None:
    # As on Gradescope: no namespaces, the unprivileged user, which checks first that it can
    # read nothing of the locked bundle; the notebook's and the probe's runs import g2c_tiny
    # from the environment, as that user, and the grader's process runs the master with it.
    envs = Layout(tiny_autograder.root).envs
    installed = sorted((p.name, p.stat().st_mtime_ns) for p in envs.iterdir())
    results, log = tiny_autograder.run(G2C_ISOLATION="unprivileged-user", **tiny_autograder.without_namespaces)
    assert results["extra_data"]["isolation"] == "unprivileged-user", log
    assert {t["name"]: t["status"] for t in results["tests"]}["q1"] == "passed", \
        [(t["name"], t["status"], t.get("output")) for t in results["tests"]]
    assert results["score"] == 1, results["output"]
    assert "requirements were installed for your code: g2c_tiny==0.1" in results["output"], results["output"]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in envs.iterdir()) == installed, "grading installed something"


def test_a_missing_environment_gives_valid_results_saying_the_autograder_is_misconfigured(
        tiny_autograder: Autograder, wheels: Path) -> None:
    envs = Layout(tiny_autograder.root).envs
    aside = envs.with_name("envs-aside")
    envs.rename(aside)   # as if setup.sh's install had failed or been skipped
    try:
        # pip could install it from here: grading must not
        results, _ = tiny_autograder.run(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
                                         **tiny_autograder.without_namespaces)
        assert not envs.exists(), "the grading step installed the requirements"
    finally:
        aside.rename(envs)
    assert results["score"] == 0 and results["tests"] == [], results
    reason = (f"the autograder is misconfigured: the assignment's requirements (g2c_tiny==0.1) are not installed in "
              f"{envs / requirements.digest(TINY_REQUIREMENTS)} (setup.sh installs them")
    assert reason in results["output"], results["output"]
    assert results["extra_data"]["students"] == [STUDENT]


def test_setup_installs_nothing_for_an_assignment_without_requirements(autograder: Autograder) -> None:
    done = autograder.install_requirements()
    assert done.returncode == 0 and "the assignment has no requirements" in done.stderr, done.stdout + done.stderr
    assert not Layout(autograder.root).envs.exists()
