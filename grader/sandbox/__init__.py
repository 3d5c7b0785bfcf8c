"""Run one command for an untrusted submission, isolated and bounded.

Everything the grader executes on behalf of a student (the notebook kernel, the probe
harness) goes through :class:`Sandbox`. The trust model (DESIGN.md) says the student's code
may try to read the hidden checks, reach the network, fork without bound, eat memory or
disk, flood output or hang; the sandbox makes each of those fail or stop, and says what it
stopped in :attr:`SandboxResult.stopped`.

Isolation levels
----------------
:attr:`Sandbox.isolation` names how commands are isolated, strongest first. It is chosen
once, when the ``Sandbox`` is made (``isolation="auto"``: bubblewrap if it works here, else
unprivileged-user if it is safe here, else ``"none"`` if the caller allows it), and the
results of a submission record it:

* ``"bubblewrap"``: namespaces and an empty filesystem with only Python bound in (below).
* ``"unprivileged-user"``: for containers where bubblewrap cannot create namespaces (the
  Gradescope image): the grader runs as root, the command as a dedicated unprivileged uid,
  and the hidden material is hidden by its file permissions only (see below).
* ``"none"``: rlimits only, for trusted code (the unsandboxed fallback, below).

How a command is isolated (bubblewrap, ``bwrap``)
-------------------------------------------------
* **Namespaces**: new mount, PID, network, IPC, UTS and (when possible) cgroup namespaces.
  The network namespace has only its own loopback: nothing outside can be reached, while a
  Jupyter kernel and its client that *both* run inside still talk over 127.0.0.1. In the
  PID namespace the command sees only its own processes; bubblewrap's reaper is PID 1
  there, and when it dies the kernel kills every process of the namespace.
* **Filesystem**: an empty root with read-only binds of only what running Python needs:
  ``/usr`` (with the ``/bin``, ``/lib``... symlinks or directories), a few files of ``/etc``
  (dynamic-loader cache, time zone, nsswitch), the Python installation
  (``sys.base_prefix``), the virtualenv (``sys.prefix``) and the caller's
  ``read_only_paths``. Nothing else of the host is visible: not the repository (the venv
  may live inside it; only that folder is bound), not the hidden checks, not
  ``/work/shared``, not other submissions, not the host's ``/tmp``. If the ``grader``
  package itself lies inside a bound folder (a non-editable install in the venv), its
  folder is masked by an empty, inaccessible tmpfs. The directories made to hold the binds
  (``/root``, ``/work``...) are mode 0711: traversable, not listable. ``/proc`` and
  ``/dev`` are fresh; ``/tmp`` and ``/dev/shm`` are private tmpfs of a quarter of the
  memory limit each.
* **Scratch**: the caller's ``scratch`` directory is bound read-write *at its own host
  path* and the command starts there (cwd and ``HOME``), so argv can name files in scratch
  by their host paths. Everything in scratch is handed to the sandbox user before each run
  (ownership changed, symlinks not followed), and back to the grader before that uid is
  free again: whatever is found there afterwards was possibly written by the student, and
  the trusted side must read it as such.
* **An unprivileged user**: ``RLIMIT_NPROC`` is not enforced for root, nor for a user
  namespace's user mapped onto host root (the kernel exempts kuid 0), and bwrap run by root
  keeps every capability in the sandbox. So when the grader runs as root, bwrap gets *no*
  user namespace and a tiny trusted launcher drops to a dedicated uid/gid
  (``SANDBOX_UID_BASE + slot``), one per concurrent run, reserved with a lock file. That
  uid owns no file outside scratch and has no capabilities (bwrap also sets no-new-privs);
  the kernel counts its processes, so a fork bomb stops at ``max_processes`` and
  ``kill(-1)`` reaches only the submission's own processes. When the grader is not root,
  bwrap makes a user namespace instead and the limit counts the processes inside it.
* **Resource limits** (set by the launcher, inherited by all descendants): ``RLIMIT_AS`` =
  ``memory_bytes`` per process (a single-process memory bomb gets a ``MemoryError``;
  ``import torch`` and a matmul need under 1 GiB of address space), ``RLIMIT_CPU`` (SIGXCPU
  at the limit, SIGKILL 5 s later), ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_CORE`` = 0,
  and an OOM score of 1000 so that the kernel's OOM killer picks the sandbox before the
  grader. The memory of the *whole* sandbox is watched too: every 0.25 s the watchdog adds
  up the proportional set sizes of its processes and what its private ``/tmp`` and
  ``/dev/shm`` hold (RAM too), and kills them all above ``memory_bytes`` (many processes
  each under the per-process limit). A process that runs into ``RLIMIT_AS`` is not killed: its
  allocation fails (``MemoryError``) and it may go on, print nothing, or catch the error. The
  watchdog therefore also keeps the highest address space (``VmPeak``) a process of the run
  reached, read at every check and once more before the run's processes are killed; a peak
  within :func:`_address_space_slack` of ``memory_bytes`` says "memory limit reached", with
  or without a ``MemoryError`` on stderr. Runs of one submission that run at the same time (its
  notebook and its probe) share that limit through a :class:`MemoryShare`: their sum is
  held to it, and the run holding the most is stopped. Each has its own uid and scratch:
  neither can signal the other's processes or change (under bubblewrap: see) its files.
  Once a second it also walks scratch, the only host disk the command can write: above
  ``disk_bytes`` or ``max_files`` in total, everything is killed (``RLIMIT_FSIZE`` alone
  bounds one file, not how many). cgroups are not used: they are not reliably delegated to
  the grader, so instead of CPU shares the command runs at nice 10, which keeps the grader
  itself responsive on a busy machine.
* **Watchdog**: after the wall-clock timeout, or once the run's processes together have used
  ``cpu_limit`` CPU seconds (when the caller sets one: the wall-clock timeout is then only its
  backstop, for a command that sleeps or hangs), the whole tree is killed (bwrap, whose
  ``--die-with-parent`` takes the PID namespace down, its session, and every process of the
  sandbox uid) and the result has ``timed_out=True``, ``returncode=None``. With an
  ``idle_limit``, a run whose processes make no CPU progress while they could run (asleep,
  blocked, stopped: ``cpu_time.IdleWatch`` reads their threads' states, so a run starved by a
  busy machine is not idle) is killed as hung after that long (``hung=True``). The CPU is read
  every 0.25 s from /proc (``grader.harness.cpu_time``): each process's own and what it
  reaped, so processes that exited in between count too; at the levels without a PID
  namespace, a process whose parent exits is reparented out of the run and, once it exits,
  its CPU is no longer counted (``RLIMIT_CPU`` still bounds each process). Nothing of a run
  outlives it, timed out or not, nor when the watch is cut short (an exception in the
  grader's thread, such as its worker told to stop). Nothing outlives the grader either:
  bwrap dies with the thread that started it (``--die-with-parent``), and a :class:`Guard`
  kills what a grader that died left of the unprivileged level, where no PID namespace
  may hold the run's processes. stdout and stderr are read concurrently; beyond
  ``output_bytes`` each, output is read and discarded, so the child never blocks on a full
  pipe and the grader's memory stays bounded.

The unprivileged-user level (no namespaces)
-------------------------------------------
Docker containers usually may not create namespaces, so bubblewrap fails there. When the
grader runs as root, the same trusted launcher then drops to a sandbox uid of its own
(``SANDBOX_UID_BASE + slot``, leased as above) with the same rlimits, nice level, watchdog
(per-uid memory, scratch disk, wall clock) and output caps, and new network and PID
namespaces only if ``unshare`` can still make them. Scratch is handed to that uid (or, for
``read_only``, made readable but not writable by it), HOME and TMPDIR point into it. After
the run, once every process of the uid is killed, scratch is given back to the grader and
everything the uid left in the shared temporary folders (``/tmp``, ``/var/tmp``,
``/dev/shm``, ``/run/lock``) is deleted: the next run on that uid, another student's,
finds nothing of this one. The kernel keeps the command from the grader's files only
through their permissions: before choosing this level, :func:`check_unprivileged_user`
runs a process as a sandbox uid that must start Python, import what the harness needs,
and fail to open every file and list every folder under ``protected_paths`` (always
including this package, the hidden checks); otherwise the level is refused. The Gradescope bundle's ``lock_down.sh``
sets those permissions (root-only bundle and installed ``grader`` package, world-readable
virtualenv).

What it does NOT protect: the host filesystem is visible (world-readable files, such as
``/etc/passwd`` or other software, can be read); world-writable folders can be written
during the run (so ``read_only`` cannot keep the probe's workers from leaving each other
files there, as bubblewrap's read-only ``/tmp`` does); memory held in ``/dev/shm`` is not
counted. Without ``unshare``: the network and the host's loopback services are reachable,
``/proc`` shows the host's processes (not their memory or environment), and the probe's
supervisor can kill only a worker's process group (see :attr:`Sandbox.own_pid_namespace`),
so a worker process that leaves its group lives on until the run ends. Hidden material
stays hidden only as long as nothing makes it readable to all again.

The unsandboxed fallback
------------------------
Where neither level works (bubblewrap unusable, and not root or the permissions not locked
down) and the caller explicitly allows it, the command runs as a plain subprocess with the
same limits, watchdog and output caps, in a new session, in new network and PID namespaces
when ``unshare`` (util-linux) can make them, as the grader's own user. It hides nothing of
the host, and the process limit does not bind root, so results say ``sandboxed=False``: it
is for trusted code and for machines where nothing else is possible, not for grading real
submissions.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from grader.harness import SANDBOX_IMPORTS
from grader.harness.cpu_time import IdleWatch, backstop_message, cpu_limit_message, cpu_seconds, idle_message, processes

__all__ = [
    "Limits",
    "MemoryShare",
    "SandboxResult",
    "SandboxUnavailable",
    "Sandbox",
    "check_bubblewrap",
    "check_unprivileged_user",
    "kill_orphans",
    "Guard",
    "GUARD_GRACE",
    "ISOLATION_LEVELS",
    "SANDBOX_UID_BASE",
    "SANDBOX_UID_SLOTS",
]

#: First uid (and gid) of the range the sandbox runs as when the grader runs as root:
#: far above regular users (1000-59999) and the usual subordinate-uid ranges.
SANDBOX_UID_BASE = 1_900_000_000
#: How many sandboxes may run at the same time on one machine (one uid each).
SANDBOX_UID_SLOTS = 256
#: :attr:`Sandbox.isolation`'s values, strongest first (see the module docstring).
ISOLATION_LEVELS = ("bubblewrap", "unprivileged-user", "none")

_WATCH_INTERVAL = 0.25  # seconds between two memory checks of the whole sandbox
_DISK_WATCH_INTERVAL = 1.0  # seconds between two walks of scratch (up to max_files stat calls)
_CPU_KILL_GRACE = 5  # seconds between SIGXCPU (soft CPU limit) and SIGKILL (hard limit)
_BWRAP_INSTALL_HINT = "bubblewrap is not installed: apt-get install bubblewrap"
# One compute thread per process (torch, OpenBLAS, MKL). CPU limits sum over threads, and an
# idle OpenMP thread spins while it waits for a core: on a busy machine a second thread
# multiplied a probe case's CPU seconds several times over and cost correct code its items.
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# --------------------------------------------------------------------------------------
# Public types
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command."""

    memory_bytes: int = 4 * 2**30  # address space of each process; memory of the whole sandbox
    cpu_seconds: int = 900  # CPU time per process
    max_processes: int = 64  # processes/threads the submission may create
    file_size_bytes: int = 256 * 2**20  # largest file it may write
    disk_bytes: int = 2 * 2**30  # all it may keep in scratch (checked by the watchdog)
    max_files: int = 100_000  # files and folders it may keep in scratch
    output_bytes: int = 2**20  # stdout/stderr captured, each; the rest is dropped with a note
    wall_seconds: float = 900.0  # whole command; then the process tree is killed


@dataclass
class SandboxResult:
    """What happened to one command."""

    returncode: int | None  # None when killed by us; -N when the command died of signal N
    stdout: str  # decoded with errors="replace", truncated to output_bytes with a note
    stderr: str
    timed_out: bool  # killed at its time limit: the CPU limit, or the wall-clock timeout
    wall_seconds: float
    stopped: list[str]  # human-readable reasons for anything the sandbox stopped
    sandboxed: bool  # False when run via the unsandboxed fallback (isolation "none")
    stdout_bytes: bytes = b""  # stdout as received (up to the cap), for binary protocols
    started: float = 0.0  # time.monotonic() when the command was launched (the clock inside is the same)
    peak_memory_bytes: int = 0  # the most the watchdog saw in use: PSS of its processes + its tmpfs
    hung: bool = False  # killed as idle: no CPU progress for idle_limit seconds while it could run
    peak_address_space_bytes: int = 0  # the highest VmPeak the watchdog saw of one process of the run


class MemoryShare:
    """One memory limit for several runs at once (one submission's notebook and probe).

    Each run's watchdog reports what its run holds; the runs are stopped as their sum passes
    ``memory_bytes``, the run holding the most first, so the limit binds the submission as a
    whole wherever its memory is. Also keeps the peak of the sum, the submission's peak.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_use: dict[int, int] = {}
        self.peak_bytes = 0

    def over(self, run: int, in_use: int, limit: int) -> int | None:
        """Record that ``run`` holds ``in_use`` bytes; the sum of all runs when it passes
        ``limit`` and ``run`` holds the most (so ``run`` is the one to stop), else None."""
        with self._lock:
            self._in_use[run] = in_use
            total = sum(self._in_use.values())
            self.peak_bytes = max(self.peak_bytes, total)
            return total if total > limit and in_use == max(self._in_use.values()) else None

    def ended(self, run: int) -> None:
        """``run`` holds nothing any more."""
        with self._lock:
            self._in_use.pop(run, None)


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


# --------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------


class Sandbox:
    """Runs commands for an untrusted submission (see the module docstring).

    ``isolation`` is ``"auto"`` or one of :data:`ISOLATION_LEVELS`; a level that is asked for
    by name and cannot work here raises :class:`SandboxUnavailable` with the reason.
    ``"auto"`` takes bubblewrap, else the unprivileged user, else, only with
    ``allow_unsandboxed``, no isolation (a plain subprocess with the same limits), else
    raises. ``force_unsandboxed`` is ``isolation="none"`` (tests, debugging).
    ``protected_paths`` (and always this package) must stay unreadable to the unprivileged
    user, which is checked before that level is chosen. One ``Sandbox`` may run several
    commands at once, from several threads.
    """

    def __init__(self, limits: Limits = Limits(), *, allow_unsandboxed: bool = False,
                 read_only_paths: Sequence[Path] = (), force_unsandboxed: bool = False,
                 isolation: str = "auto", protected_paths: Sequence[Path] = ()) -> None:
        if isolation != "auto" and isolation not in ISOLATION_LEVELS:
            raise ValueError(f"unknown isolation {isolation!r}: auto or one of {', '.join(ISOLATION_LEVELS)}")
        self.limits = limits
        self.read_only_paths = tuple(Path(p).resolve() for p in read_only_paths)
        for path in self.read_only_paths:
            if _is_within(_package_dir(), path):
                raise ValueError(f"read_only_paths would expose the grader's checks: {path}")
        self.protected_paths = (_package_dir(), *(Path(p).resolve() for p in protected_paths))
        #: One of ISOLATION_LEVELS, and why bubblewrap is not used (None when it is).
        self.isolation, self.unsandboxed_reason = self._choose(
            "none" if force_unsandboxed else isolation, allow_unsandboxed)
        #: False only without any isolation (the unsandboxed fallback).
        self.sandboxed = self.isolation != "none"

    def _choose(self, wanted: str, allow_unsandboxed: bool) -> tuple[str, str | None]:
        if wanted == "none":
            return "none", "chosen explicitly"
        problems = []
        if wanted in ("auto", "bubblewrap"):
            problem = check_bubblewrap()
            if problem is None:
                return "bubblewrap", None
            if wanted == "bubblewrap":
                raise SandboxUnavailable(problem)
            problems.append(problem)
        problem = check_unprivileged_user(self.protected_paths)
        if problem is None:
            return "unprivileged-user", problems[0] if problems else "chosen explicitly"
        if wanted == "unprivileged-user":
            raise SandboxUnavailable(f"the unprivileged-user isolation cannot work here: {problem}")
        problems.append(f"no unprivileged-user fallback: {problem}")
        if allow_unsandboxed:
            return "none", "; ".join(problems)
        raise SandboxUnavailable("; ".join(problems))

    @property
    def own_pid_namespace(self) -> bool:
        """Whether a command runs in a PID namespace of its own, where ``kill(-1)`` reaches its
        own processes only and fails with ESRCH once none is left (outside one it succeeds
        as long as any other process exists on the host, signalled or not)."""
        return self.isolation == "bubblewrap" or "--pid" in _unshare_prefix()

    @property
    def note(self) -> str:
        """How student code was isolated, in a line for the submission's results."""
        if self.isolation == "bubblewrap":
            return "Isolation: bubblewrap sandbox."
        if self.isolation == "unprivileged-user":
            return (f"Isolation: unprivileged user without bubblewrap ({self.unsandboxed_reason}); "
                    "the grader's files were hidden by their permissions.")
        return f"WARNING: graded WITHOUT isolation ({self.unsandboxed_reason})"

    def run(self, argv: Sequence[str], *, scratch: Path, env: Mapping[str, str] | None = None,
            timeout: float | None = None, stdin: bytes | None = None, read_only: bool = False,
            output_bytes: int | None = None, cpu_limit: float | None = None,
            idle_limit: float | None = None, share: MemoryShare | None = None) -> SandboxResult:
        """Run ``argv`` in ``scratch`` (bound at its own path; cwd and HOME there).

        ``env`` is laid over the sandbox's defaults (PATH to the venv first, HOME,
        LANG=C.UTF-8, TMPDIR, PYTHONDONTWRITEBYTECODE=1, cache and config dirs in the
        private /tmp): nothing of the grader's environment leaks in. ``timeout`` (seconds)
        overrides ``limits.wall_seconds``; ``output_bytes`` overrides ``limits.output_bytes``.
        ``cpu_limit``: CPU seconds the run's processes may use together; the wall-clock
        timeout is then its backstop, and the reasons say which of the two stopped the run.
        ``idle_limit``: seconds after which a run whose processes make no CPU progress while
        they could run (``cpu_time.IdleWatch``: sleeping, waiting, stopped) is killed as hung
        (``SandboxResult.hung``), long before a backstop would.
        ``read_only`` binds scratch read-only and mounts ``/tmp`` and ``/dev/shm`` read-only:
        the command can then write nowhere at all, so its processes cannot leave each other
        anything in files (the other isolation levels cannot do this; the unprivileged user
        gets a scratch it cannot write, but the host's shared temporary folders stay
        writable). With ``share``, the memory limit binds this run and the other runs of that
        share together (see :class:`MemoryShare`). Whatever the command does, this returns a result.
        """
        if not argv:
            raise ValueError("empty argv")
        scratch = Path(scratch).resolve()
        if not scratch.is_dir():
            raise ValueError(f"scratch is not a directory: {scratch}")
        if any(_is_within(path, scratch) for path in self.protected_paths):
            raise ValueError(f"scratch would expose the grader's checks: {scratch}")
        timeout = self.limits.wall_seconds if timeout is None else timeout

        if self.isolation == "none":
            tmp = scratch / ".tmp"
            tmp.mkdir(exist_ok=True)
            command = [*_unshare_prefix(), *_launcher_argv(self.limits, -1, argv)]
            return self._supervise(command, _environment(scratch, str(tmp), env), scratch,
                                   None, timeout, stdin, output_bytes, cpu_limit, idle_limit, share)
        lease = _UidLease() if os.geteuid() == 0 else None
        try:
            uid = lease.uid if lease else None
            if self.isolation == "unprivileged-user":
                assert uid is not None, "chosen only for a grader running as root"
                return self._run_as_user(argv, scratch, uid, env, timeout, stdin, read_only, output_bytes,
                                         cpu_limit, idle_limit, share)
            if uid is not None:
                _give_to(scratch, uid)
            command = _bwrap_argv(self.limits, self.read_only_paths, scratch,
                                  -1 if uid is None else uid, argv, read_only)
            try:
                return self._supervise(command, _environment(scratch, "/tmp", env), scratch,
                                       uid, timeout, stdin, output_bytes, cpu_limit, idle_limit, share)
            finally:
                if uid is not None:
                    # Back to the grader before the uid is free: the next run on it may be at the
                    # unprivileged level, which deletes all the uid owns in the shared temporary
                    # folders, this scratch included while the caller still reads it.
                    _give_to(scratch, os.geteuid())
        finally:
            if lease:
                lease.release()

    def _run_as_user(self, argv: Sequence[str], scratch: Path, uid: int, env: Mapping[str, str] | None,
                     timeout: float, stdin: bytes | None, read_only: bool,
                     output_bytes: int | None, cpu_limit: float | None, idle_limit: float | None,
                     share: MemoryShare | None) -> SandboxResult:
        """The unprivileged-user level: no bwrap, the launcher drops to ``uid`` on the host."""
        tmp = scratch / ".tmp"
        if read_only:
            _lend_read_only(scratch)
        else:
            tmp.mkdir(exist_ok=True)
            _give_to(scratch, uid)
        command = [*_unshare_prefix(), *_launcher_argv(self.limits, uid, argv)]
        try:
            return self._supervise(command, _environment(scratch, str(tmp), env), scratch,
                                   uid, timeout, stdin, output_bytes, cpu_limit, idle_limit, share)
        finally:
            # Every process of the uid is gone. The next run on this uid is another
            # student's: it must find nothing of this one, in scratch or anywhere else.
            _give_to(scratch, os.geteuid())
            _remove_leftovers(uid)

    def _supervise(self, command: list[str], env: dict[str, str], scratch: Path, uid: int | None,
                   timeout: float, stdin: bytes | None, output_bytes: int | None,
                   cpu_limit: float | None, idle_limit: float | None, share: MemoryShare | None) -> SandboxResult:
        """Start ``command``, watch it, take its whole tree down, and report."""
        limits = self.limits
        output_cap = limits.output_bytes if output_bytes is None else output_bytes
        stopped: list[str] = []
        start = time.monotonic()
        proc = subprocess.Popen(
            command, cwd=scratch, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        out = _CappedReader(proc.stdout, output_cap)
        err = _CappedReader(proc.stderr, limits.output_bytes)
        if stdin is not None:
            assert proc.stdin is not None
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()

        watch = _ExitWatch(proc.pid)
        share = share or MemoryShare()   # alone: a share of one run, its own peak
        killed = timed_out = hung = False
        idle = IdleWatch(idle_limit, _WATCH_INTERVAL) if idle_limit is not None else None
        peak = address_peak = 0
        deadline = start + timeout
        next_disk_check = start
        try:
            while not watch.wait(max(0.0, min(_WATCH_INTERVAL, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    timed_out = killed = True
                    stopped.append(f"killed after {timeout:g} s wall-clock timeout" if cpu_limit is None
                                   else f"{backstop_message(timeout)}; killed")
                    break
                pids = _sandbox_pids(uid, proc.pid)
                address_peak = max(address_peak, _address_space_peak(pids))
                # Read only when a limit needs it: a run with neither is watched for memory and disk alone.
                used = cpu_seconds(pids) if cpu_limit is not None or idle is not None else 0.0
                if cpu_limit is not None and used > cpu_limit:
                    timed_out = killed = True
                    stopped.append(f"{cpu_limit_message(cpu_limit)} (all its processes together); killed")
                    break
                if idle is not None and idle.hung(used, pids):
                    hung = killed = True
                    stopped.append(f"{idle_message(idle.limit)}; killed")
                    break
                in_use = _memory_in_use(pids) + _tmpfs_in_use(pids)
                peak = max(peak, in_use)
                total = share.over(proc.pid, in_use, limits.memory_bytes)
                if total is not None:
                    killed = True
                    others = f", with the submission's other sandbox run {_size(total - in_use)}" \
                        if total > in_use else ""
                    stopped.append(f"memory limit {_size(limits.memory_bytes)} reached "
                                   f"({_size(in_use)} in use by the sandbox's processes and its /tmp "
                                   f"and /dev/shm{others}); killed")
                    break
                if time.monotonic() >= next_disk_check:
                    next_disk_check = time.monotonic() + _DISK_WATCH_INTERVAL
                    disk_problem = _disk_problem(scratch, limits)
                    if disk_problem:
                        killed = True
                        stopped.append(disk_problem)
                        break
        finally:
            # Also when the watch is cut short (the grader's worker told to stop): nothing of a
            # run outlives it. Not reaped yet, so its pid, process group and session are still ours.
            # A last look at the address spaces first: a process that ran into RLIMIT_AS and
            # went on (or waits to be killed) says so only while it lives.
            try:
                address_peak = max(address_peak, _address_space_peak(_sandbox_pids(uid, proc.pid)))
            except Exception:   # the kill below must happen whatever reading /proc does
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _kill_processes(uid, proc.pid)
            share.ended(proc.pid)
            watch.close()
            proc.wait()
        out.join(timeout=5)
        err.join(timeout=5)
        elapsed = time.monotonic() - start

        returncode = None if killed else proc.returncode
        if returncode is not None and self.isolation == "bubblewrap" and 128 < returncode <= 128 + 64:
            returncode = 128 - returncode  # bwrap reports "died of signal N" as 128+N
        stderr = err.text()
        stopped += self._explain(returncode, stderr, address_peak)
        for name, reader in (("stdout", out), ("stderr", err)):
            if reader.dropped:
                stopped.append(f"{name} output truncated at {_size(reader.cap)} "
                               f"({reader.dropped} bytes dropped)")
        return SandboxResult(returncode=returncode, stdout=out.text(), stderr=stderr,
                             timed_out=timed_out, wall_seconds=elapsed, stopped=stopped,
                             sandboxed=self.sandboxed, stdout_bytes=out.data(), started=start,
                             peak_memory_bytes=peak, hung=hung, peak_address_space_bytes=address_peak)

    def _explain(self, returncode: int | None, stderr: str, address_peak: int = 0) -> list[str]:
        """Readable reasons for the limits the command visibly ran into (best effort).
        ``address_peak``: the highest address space (VmPeak) one of its processes reached."""
        limits, reasons = self.limits, []
        stderr_says = "MemoryError" in stderr or "Cannot allocate memory" in stderr
        at_limit = address_peak >= limits.memory_bytes - _address_space_slack(limits.memory_bytes)
        if at_limit and stderr_says:
            reasons.append(f"memory limit {_size(limits.memory_bytes)} reached (MemoryError; a process's "
                           f"address space reached {_size(address_peak)})")
        elif at_limit:
            # The process raised MemoryError itself (a notebook shows it in the cell's output,
            # not on stderr) and was not killed: only its address space tells.
            reasons.append(f"memory limit {_size(limits.memory_bytes)} reached (a process's address space "
                           f"reached {_size(address_peak)}: an allocation beyond it fails with MemoryError)")
        elif stderr_says:
            reasons.append(f"memory limit {_size(limits.memory_bytes)} reached (MemoryError)")
        elif returncode == -signal.SIGKILL:
            reasons.append(f"killed by SIGKILL (out of memory at {_size(limits.memory_bytes)}, "
                           "or killed by the submission's own code)")
        if returncode == -signal.SIGXCPU:
            reasons.append(f"CPU time limit {limits.cpu_seconds} s reached")
        if returncode == -signal.SIGXFSZ or "File too large" in stderr:
            reasons.append(f"file size limit {_size(limits.file_size_bytes)} reached")
        if "Resource temporarily unavailable" in stderr or "can't start new thread" in stderr:
            reasons.append(f"process limit {limits.max_processes} reached")
        return reasons


# --------------------------------------------------------------------------------------
# The command line: bwrap, the launcher, the environment
# --------------------------------------------------------------------------------------


def _bwrap_argv(limits: Limits, read_only_paths: Sequence[Path], scratch: Path, uid: int,
                argv: Sequence[str], read_only: bool = False) -> list[str]:
    """bwrap ... -- launcher ... argv, for ``scratch`` and sandbox ``uid`` (-1: keep ours)."""
    tmp_size = str(max(limits.memory_bytes // 4, 16 * 2**20))
    plan = _MountPlan()
    for path in sorted({*_python_paths(), *read_only_paths}, key=lambda p: len(p.parts)):
        plan.bind("--ro-bind", path)
    plan.mask(_package_dir())
    plan.bind("--ro-bind" if read_only else "--bind", scratch)
    frozen = ["--remount-ro", "/tmp", "--remount-ro", "/dev/shm"] if read_only else []
    return [
        shutil.which("bwrap") or "bwrap", *_namespace_flags(),
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
        *_system_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", tmp_size, "--tmpfs", "/tmp",
        "--perms", "1777", "--size", tmp_size, "--tmpfs", "/dev/shm",
        *plan.args, *frozen,
        "--chdir", str(scratch),
        "--", *_launcher_argv(limits, uid, argv),
    ]


def _namespace_flags() -> list[str]:
    """bwrap's namespace options for the user the grader runs as (see module docstring)."""
    if os.geteuid() == 0:
        # No user namespace: the launcher drops to a real unprivileged uid instead.
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try"]
    return ["--unshare-all"]


# Run as ``python -I -S -c _LAUNCHER UID LIMITS ARGV...``: the last trusted code before the
# command. Brings loopback up (a network namespace made by ``unshare`` starts with it down,
# and a Jupyter kernel needs it; bwrap's is up already), sets the rlimits, volunteers for the
# OOM killer, lowers its priority, drops to UID (if >= 0), execs.
_LAUNCHER = """\
import fcntl, os, resource, socket, struct, sys
uid, limits, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
except OSError:
    pass
for item in limits.split(","):
    name, values = item.split("=")
    soft, hard = map(int, values.split(":"))
    resource.setrlimit(getattr(resource, name), (soft, hard))
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
os.nice(10)
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
os.execvp(argv[0], argv)
"""


def _launcher_argv(limits: Limits, uid: int, argv: Sequence[str]) -> list[str]:
    rlimits = {
        "RLIMIT_AS": (limits.memory_bytes, limits.memory_bytes),
        "RLIMIT_CPU": (limits.cpu_seconds, limits.cpu_seconds + _CPU_KILL_GRACE),
        "RLIMIT_NPROC": (limits.max_processes, limits.max_processes),
        "RLIMIT_FSIZE": (limits.file_size_bytes, limits.file_size_bytes),
        "RLIMIT_CORE": (0, 0),
    }
    spec = ",".join(f"{name}={soft}:{hard}" for name, (soft, hard) in rlimits.items())
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(uid), spec, *argv]


def _environment(scratch: Path, tmp: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The command's whole environment: sandbox defaults, then the caller's ``env``."""
    defaults = {
        "PATH": f"{Path(sys.prefix).resolve()}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "LANG": "C.UTF-8",
        "USER": "sandbox",  # no passwd entry is needed: getpass.getuser() reads these
        "LOGNAME": "sandbox",
        "TMPDIR": tmp,
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": f"{tmp}/matplotlib",
        "XDG_CACHE_HOME": f"{tmp}/cache",
        "IPYTHONDIR": f"{tmp}/ipython",
        "JUPYTER_RUNTIME_DIR": f"{tmp}/jupyter-runtime",
        **ONE_THREAD_ENV,
    }
    return {**defaults, **(env or {})}


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
    """The strongest ``unshare`` wrapper that works here, for the levels without bwrap."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in (("--net", "--pid", "--fork", "--kill-child"), ("--net",)):
        try:
            ok = subprocess.run([unshare, *flags, "true"], stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return (unshare, *flags, "--")
    return ()


# --------------------------------------------------------------------------------------
# The filesystem the sandbox sees
# --------------------------------------------------------------------------------------

_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
              "nsswitch.conf", "alternatives")
_ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _system_binds() -> list[str]:
    """Read-only ``/usr``, the ``/bin``-style entries of ``/`` and a minimal ``/etc``."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_ENTRIES:
        host = Path("/") / name
        if host.is_symlink():  # merged /usr (Debian): /bin -> usr/bin
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in _ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python_paths() -> list[Path]:
    """The Python installation and the virtualenv the grader runs, outside ``/usr``."""
    paths = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(sys.executable).resolve().parent.parent]
    return [p for p in paths if not _is_within(p, Path("/usr"))]


def _package_dir() -> Path:
    """The grader package's folder: it holds the hidden checks and must never be visible."""
    return Path(__file__).resolve().parent.parent


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class _MountPlan:
    """bwrap arguments for binds at their host paths, with tidy parent directories.

    bwrap would create the missing parents of a bind as mode 0700 directories, which the
    unprivileged sandbox user could not traverse. They are created first as 0711
    (traversable, not listable), except where a parent comes from a bind already.
    """

    def __init__(self) -> None:
        self.args: list[str] = []
        self._binds: list[Path] = [Path("/usr")]
        self._made: set[Path] = set()

    def _in_bind(self, path: Path) -> bool:
        return any(_is_within(path, bound) for bound in self._binds)

    def bind(self, option: str, path: Path) -> None:
        if self._in_bind(path):
            if option == "--ro-bind":
                return  # visible already, read-only, through an enclosing bind
        else:
            for parent in reversed(path.parents):
                if parent != Path("/") and parent not in self._made and not self._in_bind(parent):
                    self.args += ["--perms", "0711", "--dir", str(parent)]
                    self._made.add(parent)
        self.args += [option, str(path), str(path)]
        self._binds.append(path)

    def mask(self, path: Path) -> None:
        """Hide ``path`` behind an empty, inaccessible tmpfs if a bind shows it."""
        if self._in_bind(path) and path.is_dir():
            self.args += ["--perms", "0000", "--tmpfs", str(path)]


# --------------------------------------------------------------------------------------
# Sandbox uids (grader running as root)
# --------------------------------------------------------------------------------------


#: The lock files of the uid leases. The uids are the whole machine's, so every grader must use
#: the same folder whatever its TMPDIR; /run is root's, as the leases are.
_UID_LOCK_DIR = Path("/run/g2c-grader-sandbox-uids")


class _UidLease:
    """Reserve a uid of the sandbox range for one run (a lock file is held meanwhile)."""

    def __init__(self) -> None:
        lock_dir = _lock_dir()
        for slot in range(SANDBOX_UID_SLOTS):
            if self._take(lock_dir, slot):
                return
        raise RuntimeError(f"all {SANDBOX_UID_SLOTS} sandbox uids are in use")

    @classmethod
    def of_slot(cls, slot: int) -> _UidLease | None:
        """The lease of that one slot, or None while a run holds it."""
        lease = cls.__new__(cls)
        return lease if lease._take(_lock_dir(), slot) else None

    def _take(self, lock_dir: Path, slot: int) -> bool:
        fd = os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        self._fd = fd
        self.uid = SANDBOX_UID_BASE + slot
        _kill_processes(self.uid, None)  # leftovers of a grader that crashed
        return True

    def release(self) -> None:
        os.close(self._fd)


def _lock_dir() -> Path:
    lock_dir = _UID_LOCK_DIR
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    info = lock_dir.lstat()
    if lock_dir.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{lock_dir} is not a private directory of this user")
    return lock_dir


def kill_orphans() -> None:
    """SIGKILL every process of a sandbox uid that no run holds (its lease free): what a
    grader that died left, wherever it was reparented. A no-op unless root (no uids then)."""
    if os.geteuid() != 0:
        return
    for uid in sorted({p.uid for p in processes()
                       if SANDBOX_UID_BASE <= p.uid < SANDBOX_UID_BASE + SANDBOX_UID_SLOTS}):
        lease = _UidLease.of_slot(uid - SANDBOX_UID_BASE)   # kills them as it is taken
        if lease:
            lease.release()


def _give_to(scratch: Path, uid: int) -> None:
    """chown scratch and everything in it to ``uid``, never following a symlink."""
    os.chown(scratch, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(scratch, followlinks=False):
        for name in dirnames + filenames:
            try:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
            except FileNotFoundError:
                pass


def _lend_read_only(scratch: Path) -> None:
    """Make scratch readable, not writable, by any sandbox uid (unprivileged-user level):
    everything owned by the grader, folders 0755, files without write bits for others.
    Symlinks are left as they are (their mode means nothing; they are never followed)."""
    me = os.geteuid()
    os.chown(scratch, me, me)
    os.chmod(scratch, 0o755)
    for dirpath, dirnames, filenames in os.walk(scratch, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    continue
                os.chown(path, me, me, follow_symlinks=False)
                mode = 0o755 if stat.S_ISDIR(info.st_mode) else stat.S_IMODE(info.st_mode) & 0o755 | 0o444
                os.chmod(path, mode)
            except FileNotFoundError:
                pass


#: World-writable folders of a usual host: without a mount namespace the sandbox uid can
#: leave files there (and in world-writable folders inside them).
_SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _remove_leftovers(uid: int) -> None:
    """Delete what ``uid`` left in the shared temporary folders (unprivileged-user level, its
    scratch given back to the grader already). Only world-writable folders are searched: the
    uid can create nothing elsewhere but in its own folders, which go whole. Symlinks are
    removed, never followed."""
    pending = sorted({*_SHARED_TMP, tempfile.gettempdir()})
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid == uid and stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                elif info.st_uid == uid:
                    os.unlink(entry.path)
                elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                    pending.append(entry.path)
            except OSError:
                continue


# --------------------------------------------------------------------------------------
# The processes of a run: find, measure, kill
# --------------------------------------------------------------------------------------


def _sandbox_pids(uid: int | None, root_pid: int | None) -> set[int]:
    """Live processes of a run: those of its ``uid``, and the descendants and session of
    ``root_pid`` (the process we started in a session of its own, not yet reaped)."""
    procs = [p for p in processes() if not p.zombie or p.pid == root_pid]
    found = {p.pid for p in procs if p.uid == uid or (root_pid and p.session == root_pid)}
    if root_pid is not None:
        children: dict[int, list[int]] = {}
        for p in procs:
            children.setdefault(p.ppid, []).append(p.pid)
        todo = [root_pid]
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo += children.get(pid, [])
    found.discard(os.getpid())
    return found


def _memory_in_use(pids: set[int]) -> int:
    """Proportional set size (bytes) of ``pids`` together: shared pages are split."""
    return sum(_proc_bytes(pid, "smaps_rollup", b"Pss:") for pid in pids)


def _proc_bytes(pid: int, name: str, field: bytes) -> int:
    """The kB figure of ``field`` in ``/proc/<pid>/<name>``, in bytes (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _address_space_slack(memory_bytes: int) -> int:
    """How far below ``memory_bytes`` (RLIMIT_AS) a process's peak address space may stay and
    still have run into the limit: an allocation fails when it would cross the limit, so the
    peak stops short of it by up to one request. An eighth of the limit plus 16 MiB covers
    requests of 256 MiB at a 2 GiB limit; a process with torch loaded peaks under 1 GiB."""
    return memory_bytes // 8 + 16 * 2**20


def _address_space_peak(pids: set[int]) -> int:
    """The highest peak address space (``VmPeak``, bytes) of one of ``pids`` (0 if none is readable)."""
    return max((_proc_bytes(pid, "status", b"VmPeak:") for pid in pids), default=0)


def _tmpfs_in_use(pids: set[int]) -> int:
    """Bytes held in the sandbox's private /tmp and /dev/shm: RAM that no process's PSS shows.
    Read through the root of a process inside the sandbox's mount namespace (0 if none)."""
    own = os.readlink("/proc/self/ns/mnt")
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == own:
                continue
            used = 0
            for folder in ("tmp", "dev/shm"):
                info = os.statvfs(f"/proc/{pid}/root/{folder}")
                used += (info.f_blocks - info.f_bfree) * info.f_frsize
            return used
        except OSError:
            continue
    return 0


def _kill_processes(uid: int | None, root_pid: int | None, *, settle: float = 5.0) -> None:
    """SIGKILL the run's processes until none is left (or ``settle`` seconds passed).

    ``root_pid`` must not be reaped yet, so that neither its pid nor its session id can
    belong to an unrelated process.
    """
    deadline = time.monotonic() + settle
    while True:
        alive = False
        for pid in _sandbox_pids(uid, root_pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            alive = alive or pid != root_pid
        if not alive or time.monotonic() > deadline:
            return
        time.sleep(0.01)


class _ExitWatch:
    """Wait for a child to exit *without reaping it*, so its pid stays reserved."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # Linux < 5.3
            self._fd = None

    def wait(self, timeout: float) -> bool:
        """True once the child has exited (waits at most ``timeout`` seconds)."""
        if self._fd is not None:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            return bool(ready) or self._exited()
        end = time.monotonic() + timeout
        while not self._exited() and time.monotonic() < end:
            time.sleep(0.01)
        return self._exited()

    def _exited(self) -> bool:
        return os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


# --------------------------------------------------------------------------------------
# A grader that dies: the guard
# --------------------------------------------------------------------------------------

#: Seconds a watched process has to clean up after SIGTERM before the guard sends SIGKILL.
GUARD_GRACE = 4.0


class Guard:
    """A process apart from the grader's own tree that stops the grader's workers and every
    sandbox they leave once the grader closes it *or dies* (``kill -9`` included): the
    kernel closes the pipe it reads, whatever killed the grader.

    It runs in a session of its own, so neither Ctrl-C on the terminal nor a signal to the
    grader's process group reaches it. On end of input it sends SIGTERM to each watched
    process still alive (a worker then cleans up its sandbox run), SIGKILL after
    :data:`GUARD_GRACE` to those still alive, then, unless the grader closed it saying all
    had ended (``close(clean=True)``), :func:`kill_orphans`: a sandbox uid's processes need
    not descend from anything of the grader's (the unprivileged level may have no PID
    namespace to hold them). Watched processes are held by pidfd, so a pid reused meanwhile
    is never signalled. Last, it removes the folders it was given (:meth:`remove`): the
    coordinator's own temporary ones, which a ``kill -9`` would otherwise leave behind.
    """

    def __init__(self) -> None:
        # -I -S: this module needs only the standard library; the package is found by path.
        code = (f"import sys; sys.path.insert(0, {str(_package_dir().parent)!r}); "
                "from grader.sandbox import _guard_main; _guard_main()")
        self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", code], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, start_new_session=True)

    def watch(self, pid: int) -> None:
        """Stop ``pid`` (alive now) when the guard closes or the grader dies."""
        self._tell(f"{pid} {_start_time(pid)}\n".encode())

    def remove(self, folder: Path) -> None:
        """Remove ``folder`` and everything in it when the guard closes or the grader dies."""
        path = os.fsencode(folder.resolve())
        if b"\n" in path:
            raise ValueError(f"the guard reads one folder per line: {folder!r}")
        self._tell(b"remove " + path + b"\n")

    def _tell(self, line: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line)
            self._proc.stdin.flush()
        except (OSError, ValueError):   # the guard is gone: nothing to tell
            pass

    def close(self, clean: bool = False) -> None:
        """Stop what is watched, kill the orphans (unless ``clean``: every watched process ended
        and cleaned up after itself), and wait for the guard to finish."""
        assert self._proc.stdin is not None
        try:
            if clean:
                self._proc.stdin.write(b"clean\n")
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=GUARD_GRACE + 30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _guard_main() -> None:
    """The guard process (see :class:`Guard`): pid and start time, or ``remove`` and a folder,
    per line, until end of input."""
    watched: list[int] = []
    folders: list[bytes] = []
    clean = False
    for line in sys.stdin.buffer:
        if line.startswith(b"remove ") and line.endswith(b"\n"):
            folders.append(line[len(b"remove "):-1])
            continue
        clean = line == b"clean\n"
        try:
            pid, start = map(int, line.split())
            fd = os.pidfd_open(pid)
        except (ValueError, OSError):
            continue
        if _start_time(pid) == start:   # the process we were told of, not a new one on its pid
            watched.append(fd)
        else:
            os.close(fd)
    ended = _stop(watched)
    if not (clean and ended):   # swept only after a failure: a free uid's processes are leftovers then
        kill_orphans()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _stop(pidfds: list[int]) -> bool:
    """SIGTERM, then after :data:`GUARD_GRACE` SIGKILL, until every process is gone; True when
    all had exited already."""
    ready, _, _ = select.select(pidfds, [], [], 0)
    ended = len(ready) == len(pidfds)
    for sig, wait_for in ((signal.SIGTERM, GUARD_GRACE), (signal.SIGKILL, 10.0)):
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:   # exited already
                pass
        deadline = time.monotonic() + wait_for
        while pidfds and time.monotonic() < deadline:
            ready, _, _ = select.select(pidfds, [], [], max(0.0, deadline - time.monotonic()))
            for fd in ready:
                os.close(fd)
            pidfds = [fd for fd in pidfds if fd not in ready]
        if not pidfds:
            break
    return ended


def _start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot), -1 if it is gone: with the pid, a process's identity."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def _disk_problem(scratch: Path, limits: Limits) -> str | None:
    """Why scratch holds too much (bytes on disk, or entries), or None. The walk stops as
    soon as a limit is passed, so a folder of millions of files costs one limit's worth."""
    used, entries, pending = 0, 0, [scratch]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
                    if used > limits.disk_bytes:
                        return f"disk limit {_size(limits.disk_bytes)} reached in scratch; killed"
                    if entries > limits.max_files:
                        return f"file count limit {limits.max_files} reached in scratch; killed"
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------------------
# Output capture
# --------------------------------------------------------------------------------------


class _CappedReader(threading.Thread):
    """Read a pipe to its end, keeping the first ``cap`` bytes and counting the rest."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self._pipe, self.cap = pipe, cap
        self._chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0
        self.start()

    def run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, 1 << 16):
                keep = chunk[: max(0, self.cap - self.kept)]
                if keep:
                    self._chunks.append(keep)
                    self.kept += len(keep)
                self.dropped += len(chunk) - len(keep)
        except OSError:
            pass
        finally:
            self._pipe.close()

    def data(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        text = self.data().decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... truncated {self.dropped} bytes]\n"
        return text


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write ``data`` to the command's stdin, then close it (the command may not read)."""
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
