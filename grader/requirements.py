"""An assignment's own requirements: Python packages its notebooks import beyond the grader's.

The rubric names them (``settings.requirements``, one pip requirement each; ``grader import``
writes it from otter's ``requirements`` or a ``requirements.txt`` beside the master). They are
installed once per content into ``ROOT/envs/<digest>/site`` (``pip install --target``, pip's
index settings taken from the environment as usual: ``PIP_INDEX_URL``, ``PIP_NO_INDEX``,
``PIP_FIND_LINKS``), and the sandbox mounts that folder read-only on every run's ``PYTHONPATH``
(``Sandbox(python_paths=...)``), the notebook's and the probe's alike; the grader's own process,
which runs the master's code as the trusted model, imports from it too (``importable``). A
package that cannot be installed stops the command that asked for it (import, validate, grade,
check) with pip's reason, before any submission is graded. Gradescope's bundle installs them
once, when its image is built (``grader.gradescope``), and its grading step only checks that they
are there (``installed``).
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ENVS = "envs"                    # ROOT/envs/<digest>/: an assignment's installed requirements
SITE = "site"                    # ROOT/envs/<digest>/site: what the runs import
COMPLETE = ".complete"           # written last into an environment: a finished install
PIP_TIMEOUT_S = 900


class RequirementsError(ValueError):
    """The requirements cannot be installed: every submission would fail, so nothing is graded."""


def declared(settings: dict[str, Any]) -> list[str]:
    """The requirements a rubric's ``settings`` name (none when it names none)."""
    found = settings.get("requirements") or []
    if not isinstance(found, list) or not all(isinstance(r, str) and r.strip() for r in found):
        raise RequirementsError("settings.requirements must be a list of pip requirements, one string each")
    return [r.strip() for r in found]


def digest(requirements: list[str]) -> str:
    """What names an environment: the requirements' content and the Python that installs them."""
    text = "\n".join(requirements) + f"\n# python {sys.version_info.major}.{sys.version_info.minor}\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def importable(settings: dict[str, Any], root: Path) -> None:
    """Let this process import an assignment's requirements installed under ``root``: it runs
    the master's code, which imports them."""
    found = declared(settings)
    import_from(root / ENVS / digest(found) / SITE if found else None)


def import_from(site: Path | None) -> None:
    """Let this process import from ``site``, a folder of installed requirements (after its own
    packages, which they never shadow); nothing when None or not there."""
    if site is not None and site.is_dir() and str(site) not in sys.path:
        sys.path.append(str(site))


def installed(requirements: list[str], envs: Path) -> Path | None:
    """The folder the requirements are importable from (``<envs>/<digest>/site``) when a finished
    install is there; None when there are none. Raises RequirementsError when it is not there: for
    a step that must never install them itself (Gradescope's grading of one submission)."""
    if not requirements:
        return None
    target = envs / digest(requirements)
    if not (target / COMPLETE).is_file():
        raise RequirementsError(f"the assignment's requirements ({', '.join(requirements)}) are not installed "
                                f"in {target}")
    return target / SITE


def install(requirements: list[str], envs: Path) -> Path | None:
    """The folder the requirements are importable from (``<envs>/<digest>/site``), installed
    there once per content; None when there are none. Raises RequirementsError with pip's reason."""
    try:
        return installed(requirements, envs)
    except RequirementsError:
        pass   # not there yet: installed below
    target = envs / digest(requirements)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    listing = partial / "requirements.txt"
    listing.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-input", "--target", str(partial / SITE), "-r", str(listing)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise RequirementsError(f"the assignment's requirements cannot be installed ({', '.join(requirements)}): "
                                + " ".join(said[-3:]).strip())
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / COMPLETE).write_text("\n".join(requirements) + "\n", encoding="utf-8")
    return target / SITE
