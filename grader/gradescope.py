"""Gradescope: the autograder bundle (``grader gradescope-bundle``) and its grading step.

Gradescope builds an image from ``autograder.zip``: the zip is unpacked in
``/autograder/source`` and its ``setup.sh`` runs once, as root. For every submission it then
runs ``run_autograder`` as root, with the student's files in ``/autograder/submission`` and
the submitters in ``/autograder/submission_metadata.json``, and shows
``/autograder/results/results.json``. The scripts live in the repository's ``gradescope/``
folder; ``run_autograder`` calls ``python -m grader.gradescope`` (:func:`main`), which grades
the upload (one notebook and/or the assignment's package files, ``intake.find_submission``) with
the pipeline of ``grader grade`` and names the submitters in the
results' top-level ``extra_data`` (``students``: name, sid, email each).

Gradescope's containers usually cannot create namespaces, so bubblewrap fails there and the
sandbox falls back to its unprivileged-user isolation (see grader/sandbox/), which hides
the hidden checks, solutions and rubrics by file permissions only. ``lock_down.sh`` (run by
``setup.sh``) sets those on the bundle and the virtualenv; the grading step closes the
per-submission files (its output folder, the results folder, the metadata, which holds the
previous results with their hidden tests) before any student code runs, and the sandbox
checks, as the unprivileged user, that it can read none of them before it is used.

An assignment's own requirements (its rubric's ``settings.requirements``, ``grader.requirements``)
are installed once, when the image is built: ``setup.sh`` runs ``python -m grader.gradescope
--install-requirements`` (:func:`install_requirements`) into ``/autograder/envs``, beside the
virtualenv and outside the locked source, so that ``lock_down.sh`` can leave them readable by the
sandbox user, who imports them. The grading step only checks that they are there
(:func:`_requirements_site`) and never installs them: without them the student's results say the
autograder is misconfigured.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import requirements
from grader.assignment import PROJECT_ROOT, Assignment
from grader.batch import grade_batch
from grader.checks import CHECKS_FOLDER
from grader.intake import find_submission
from grader.load import package_files
from grader.report.results import RESULTS_FILE
from grader.sandbox import ISOLATION_LEVELS
from grader.sandbox.factory import NoSandbox, make_sandbox

SCRIPTS_DIR = PROJECT_ROOT / "gradescope"
#: At the top of the zip: Gradescope needs setup.sh and run_autograder there.
BUNDLE_SCRIPTS = ("lock_down.sh", "run_autograder", "setup.sh")
ASSIGNMENT_PLACEHOLDER = "@ASSIGNMENT@"   # in run_autograder, replaced by the assignment's name
OUT_FOLDER = "grader-out"                 # under the autograder root: the grade run's output folder
_SKIPPED = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)         # every entry's timestamp: the same inputs give the same bytes


class CannotGrade(Exception):
    """The upload cannot be graded here (the bundle's assignment files are incomplete): the
    message is the reason the student and the staff read."""


# ----------------------------------------------------------------------------- the bundle

def bundle_files(assignment: Assignment) -> dict[str, Path]:
    """Archive name -> file, besides the scripts: the grader's source and packaging (what
    ``pip install`` needs), and the assignment's files the grader reads (template and public
    tests, master notebook, rubric and its calibration samples). Nothing else of the
    repository: no tests, examples, outputs, venv."""
    files = {name: PROJECT_ROOT / name for name in ("pyproject.toml", "README.md")}
    files.update(_tree(PROJECT_ROOT, PROJECT_ROOT / "grader"))
    own_checks = assignment.root / CHECKS_FOLDER   # an assignment root's own checks modules
    for folder in (assignment.template_path.parent, assignment.master_path.parent,
                   *([own_checks] if assignment.root != PROJECT_ROOT and own_checks.is_dir() else [])):
        files.update(_tree(assignment.root, folder))
    calibration = assignment.rubric_path.with_name(f"{assignment.name}_calibration.yaml")
    for rubric in (assignment.rubric_path, calibration):   # not another assignment's that shares the prefix
        if rubric.is_file():
            files[rubric.relative_to(assignment.root).as_posix()] = rubric
    return files


def _tree(root: Path, folder: Path) -> dict[str, Path]:
    """The regular files under ``folder``, named relative to ``root``, without caches,
    compiled files or hidden files."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED and not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if not name.startswith(".") and path.suffix != ".pyc" and path.is_file() and not path.is_symlink():
                found[path.relative_to(root).as_posix()] = path
    return found


def write_bundle(assignment: Assignment, target: Path) -> list[str]:
    """Write ``autograder.zip`` for ``assignment`` to ``target``; returns the archive's names.

    Entries are sorted, with fixed timestamps and modes (scripts 0755, the rest 0644), so the
    same files always give the same zip and a rebuilt bundle can be compared with the one
    uploaded.
    """
    problem = assignment.check_files()
    if problem:
        raise ValueError(problem)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", assignment.name):
        raise ValueError(f"assignment name {assignment.name!r} must be letters, digits, - and _ (it goes in a script)")
    entries = {name: path.read_bytes() for name, path in bundle_files(assignment).items()}
    for script in BUNDLE_SCRIPTS:
        text = (SCRIPTS_DIR / script).read_text()
        entries[script] = text.replace(ASSIGNMENT_PLACEHOLDER, assignment.name).encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = (0o100755 if name in BUNDLE_SCRIPTS else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, entries[name])
    return sorted(entries)


# ----------------------------------------------------------------------------- grading on Gradescope

@dataclass(frozen=True)
class Layout:
    """Gradescope's ``/autograder`` folder, under any root (tests unpack a bundle elsewhere)."""

    root: Path

    @property
    def source(self) -> Path:
        return self.root / "source"

    @property
    def submission(self) -> Path:
        return self.root / "submission"

    @property
    def metadata(self) -> Path:
        return self.root / "submission_metadata.json"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def out(self) -> Path:
        return self.root / OUT_FOLDER

    @property
    def envs(self) -> Path:
        """The assignment's installed requirements: outside ``source``, which is root's only."""
        return self.root / requirements.ENVS


def read_metadata(path: Path) -> dict[str, Any]:
    """Gradescope's submission metadata; empty when missing or unreadable (grading goes on,
    without the submitters' names)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"grader: no usable submission metadata ({exc}); grading without it", file=sys.stderr)
        return {}
    return data if isinstance(data, dict) else {}


def submitters(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The submitters (several for a group submission): name, sid and email of each, as
    Gradescope gives them (None where it gives nothing)."""
    users = metadata.get("users")
    return [{key: user.get(key) for key in ("name", "sid", "email")}
            for user in (users if isinstance(users, list) else []) if isinstance(user, dict)]


def failure_results(reason: str) -> dict[str, Any]:
    """A valid results.json for a submission the grader could not grade at all: without it
    Gradescope would show the student nothing."""
    return {"score": 0.0, "tests": [], "output_format": "text",
            "output": f"The autograder could not grade this submission: {reason}. Your score is 0 until "
                      "the course staff fixes it: please tell them.",
            "extra_data": {"error": reason}}


def grade(layout: Layout, assignment_name: str, isolation: str) -> dict[str, Any]:
    """Grade the submission in ``layout``; the results.json to show, whatever happens."""
    metadata = read_metadata(layout.metadata)
    try:
        data = _grade(layout, assignment_name, isolation, str(metadata.get("id", "submission")))
    except Exception as exc:  # noqa: BLE001 - the student must get results, the staff the reason
        traceback.print_exc()  # into Gradescope's log of this run, which only instructors see
        data = failure_results(str(exc) if isinstance(exc, (CannotGrade, NoSandbox)) else f"{type(exc).__name__}: {exc}")
    data.setdefault("extra_data", {})["students"] = submitters(metadata)
    return data


def _grade(layout: Layout, assignment_name: str, isolation: str, submission_id: str) -> dict[str, Any]:
    _close_run_files(layout)
    assignment = Assignment(assignment_name, root=layout.source)
    problem = assignment.check_files()
    if problem:
        raise CannotGrade(problem)
    rubric = assignment.rubric
    site = _requirements_site(layout, rubric.settings)
    submission = find_submission(submission_id, layout.submission, package_files(assignment.template))
    protected = [p for p in (layout.source, layout.out, layout.results, layout.metadata) if p.exists()]
    sandbox = make_sandbox(rubric.limits, False, isolation, protected, [site] if site else [])
    grade_batch([submission], assignment, sandbox, rubric, layout.out, workers=1)
    return json.loads((layout.out / submission.submission_id / RESULTS_FILE).read_text())


def install_requirements(layout: Layout, assignment_name: str) -> Path | None:
    """Install the bundled assignment's requirements into ``layout.envs`` (``setup.sh``, once, at
    the image's build); the folder they are importable from, None when it declares none. Raises
    RequirementsError with pip's reason."""
    settings = Assignment(assignment_name, root=layout.source).rubric.settings
    return requirements.install(requirements.declared(settings), layout.envs)


def _requirements_site(layout: Layout, settings: dict[str, Any]) -> Path | None:
    """The folder the assignment's requirements are importable from (None when it declares
    none), imported by this process too, which runs the master's code. Never installs them: a
    submission's grading would otherwise depend on the network and on pip, once per submission.
    Raises CannotGrade when setup.sh did not install them."""
    try:
        site = requirements.installed(requirements.declared(settings), layout.envs)
    except requirements.RequirementsError as exc:
        raise CannotGrade(f"the autograder is misconfigured: {exc} (setup.sh installs them when Gradescope "
                          "builds the autograder; its build log says why it did not)") from exc
    requirements.import_from(site)
    return site


def _close_run_files(layout: Layout) -> None:
    """Before any student code runs: a fresh output folder, and it, the results folder and
    the metadata readable by root only (the sandbox checks that they are)."""
    shutil.rmtree(layout.out, ignore_errors=True)
    layout.out.mkdir(mode=0o700, parents=True)
    layout.results.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.results, 0o700)
    if layout.metadata.exists():
        os.chmod(layout.metadata, 0o600)


def write_results(layout: Layout, data: dict[str, Any]) -> Path:
    """Write results.json whole or not at all (run_autograder writes its own if it is missing)."""
    target = layout.results / RESULTS_FILE
    layout.results.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """The grading step of ``run_autograder``: exit status 0 once results.json is written. With
    ``--install-requirements``, ``setup.sh``'s install of the assignment's requirements instead:
    0 once they are installed (or there are none), 1 with pip's reason."""
    parser = argparse.ArgumentParser(prog="python -m grader.gradescope",
                                     description="grade the submission of a Gradescope /autograder folder")
    parser.add_argument("--assignment", required=True)
    parser.add_argument("--root", type=Path, default=Path("/autograder"), help="Gradescope's folder")
    parser.add_argument("--isolation", choices=("auto", *ISOLATION_LEVELS), default="auto")
    parser.add_argument("--install-requirements", action="store_true",
                        help="instead of grading, install the assignment's requirements into ROOT/envs "
                             "(setup.sh, when Gradescope builds the image)")
    args = parser.parse_args(argv)
    layout = Layout(args.root)
    if args.install_requirements:
        try:
            site = install_requirements(layout, args.assignment)
        except requirements.RequirementsError as exc:
            print(f"grader: {exc}", file=sys.stderr)
            return 1
        print(f"grader: requirements importable from {site}" if site else "grader: the assignment has no requirements",
              file=sys.stderr)
        return 0
    data = grade(layout, args.assignment, args.isolation)
    print(f"wrote {write_results(layout, data)}: {data.get('score', 0):g} points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
