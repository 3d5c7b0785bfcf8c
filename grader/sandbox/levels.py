"""Which isolation levels work here: :func:`check_bubblewrap` runs ``true`` through a real
run's command line; :func:`check_unprivileged_user` runs a process as a sandbox uid that must
import what the harness needs and read nothing protected. A level asked for that cannot work
raises :class:`SandboxUnavailable`."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from grader.harness import SANDBOX_IMPORTS
from grader.sandbox.limits import Limits
from grader.sandbox.mounts import _bwrap_argv, _environment, _launcher_argv
from grader.sandbox.uids import _give_to, _UidLease


#: :attr:`Sandbox.isolation`'s values, strongest first (see the docstring of grader.sandbox).
ISOLATION_LEVELS = ("bubblewrap", "unprivileged-user", "none")
_BWRAP_INSTALL_HINT = "bubblewrap is not installed: apt-get install bubblewrap"


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot isolate commands on this machine (the message says why)."""


@functools.cache
def check_bubblewrap() -> str | None:
    """None when bwrap can create the namespaces here, else a readable reason (cached).

    Runs ``true`` through the very command line a sandboxed run uses, uid switch included.
    """
    if shutil.which("bwrap") is None:
        return _BWRAP_INSTALL_HINT
    with tempfile.TemporaryDirectory(prefix="g2c-sandbox-check-") as tmp:
        scratch = Path(tmp).resolve()
        lease = _UidLease() if os.geteuid() == 0 else None
        try:
            if lease:
                _give_to(scratch, lease.uid)
            argv = _bwrap_argv(Limits(), (), scratch, lease.uid if lease else -1, ["true"])
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=60, env=_environment(scratch, "/tmp", None))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot run here: {exc}"
        finally:
            if lease:
                lease.release()
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        return f"bubblewrap cannot create the sandbox here: {detail}"
    return None


def check_unprivileged_user(protected_paths: Sequence[Path]) -> str | None:
    """None when the unprivileged-user level is safe here, else a readable reason.

    That level hides nothing by itself, so it is only as good as the file permissions. A
    process started like a real run (launcher, sandbox uid) must start the grader's Python,
    import what the harness needs (:data:`~grader.harness.SANDBOX_IMPORTS`: a virtualenv
    under a folder closed to other users would otherwise fail every submission's run, a
    fault of the machine charged to the student), and then fail to open every file and list
    every folder under ``protected_paths``, and to reach a protected path that does not
    exist yet (its parent must be closed, or what the grader writes there later would be
    readable). Not cached: permissions change.
    """
    if os.geteuid() != 0:
        return "the grader does not run as root, so it cannot run student code as another user"
    targets: list[tuple[str, str]] = []
    for root in protected_paths:
        if not root.exists():
            targets.append(("missing", str(root)))
            continue
        targets.append(("dir" if root.is_dir() else "file", str(root)))
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            targets += [("dir", os.path.join(dirpath, n)) for n in dirnames
                        if not os.path.islink(os.path.join(dirpath, n))]
            targets += [("file", os.path.join(dirpath, n)) for n in filenames
                        if not os.path.islink(os.path.join(dirpath, n))]
    with tempfile.TemporaryDirectory(prefix="g2c-sandbox-check-") as tmp:
        scratch = Path(tmp).resolve()
        lease = _UidLease()
        try:
            _give_to(scratch, lease.uid)
            argv = _launcher_argv(Limits(), lease.uid, [sys.executable, "-I", "-c", _ACCESS_CHECK])
            request = {"targets": targets, "imports": list(SANDBOX_IMPORTS)}
            proc = subprocess.run(argv, input=json.dumps(request).encode(), capture_output=True,
                                  timeout=120, cwd=scratch, env=_environment(scratch, tmp, None))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run a process as the sandbox user: {exc}"
        finally:
            lease.release()
    try:
        found = json.loads(proc.stdout)
        readable, unimportable = found["readable"], found["unimportable"]
    except (ValueError, TypeError, KeyError):
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        return (f"the sandbox user cannot run {sys.executable} (it and its virtualenv must be "
                f"readable by all): {detail[-1] if detail else f'exit status {proc.returncode}'}")
    if unimportable:
        name, error = next(iter(unimportable.items()))
        return (f"the sandbox user cannot import {', '.join(unimportable)} with {sys.executable} "
                f"({name}: {error}): the virtualenv and every folder above it must be readable "
                "by all")
    if readable:
        return (f"the sandbox user can read {len(readable)} protected file(s) or folder(s), such as "
                f"{readable[0]}: make them readable by root only (the Gradescope bundle's "
                "lock_down.sh does)")
    return None


# Run as the sandbox uid by check_unprivileged_user: reads the modules to import and
# [kind, path] pairs on stdin, and prints the modules it could not import and the paths it
# could read (a file opened, a folder listed, a missing path reached).
_ACCESS_CHECK = """\
import importlib, json, os, sys
request = json.load(sys.stdin)
unimportable = {}
for name in request["imports"]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        unimportable[name] = f"{type(exc).__name__}: {exc}"
readable = []
for kind, path in request["targets"]:
    try:
        if kind == "file":
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW))
        elif kind == "dir":
            os.listdir(path)
        else:
            os.stat(path)
    except FileNotFoundError:
        if kind != "missing":
            continue
    except OSError:
        continue
    readable.append(path)
print(json.dumps({"readable": readable, "unimportable": unimportable}))
"""
