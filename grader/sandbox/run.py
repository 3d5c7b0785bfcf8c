"""The sandbox: :class:`Sandbox` chooses an isolation level once, then runs each command at it
(bubblewrap, the unprivileged user, or none), watches it (wall clock, CPU, idleness, memory,
disk) until it ends or is stopped, takes its whole tree down, and explains how it ended in
:attr:`SandboxResult.stopped` (``_explain``: the limits it visibly ran into)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from grader.harness.cpu_time import IdleWatch, backstop_message, cpu_limit_message, cpu_seconds, idle_message
from grader.sandbox import levels, mounts
from grader.sandbox.levels import ISOLATION_LEVELS, SandboxUnavailable
from grader.sandbox.limits import Limits, MemoryShare, SandboxResult, _size
from grader.sandbox.mounts import _bwrap_argv, _environment, _is_within, _launcher_argv, _unshare_prefix
from grader.sandbox.readers import _CappedReader, _feed
from grader.sandbox.uids import _give_to, _lend_read_only, _remove_leftovers, _UidLease
from grader.sandbox.watch import (_address_space_peak, _disk_problem, _ExitWatch, _kill_processes, _memory_in_use,
                                  _sandbox_pids, _tmpfs_in_use)


_WATCH_INTERVAL = 0.25  # seconds between two memory checks of the whole sandbox
_DISK_WATCH_INTERVAL = 1.0  # seconds between two walks of scratch (up to max_files stat calls)


class Sandbox:
    """Runs commands for an untrusted submission (see the docstring of grader.sandbox).

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
                 isolation: str = "auto", protected_paths: Sequence[Path] = (),
                 python_paths: Sequence[Path] = ()) -> None:
        if isolation != "auto" and isolation not in ISOLATION_LEVELS:
            raise ValueError(f"unknown isolation {isolation!r}: auto or one of {', '.join(ISOLATION_LEVELS)}")
        self.limits = limits
        #: Folders every run imports from (an assignment's installed requirements): mounted
        #: read-only and put on each run's PYTHONPATH.
        self.python_paths = tuple(Path(p).resolve() for p in python_paths)
        self.read_only_paths = tuple(Path(p).resolve() for p in (*read_only_paths, *python_paths))
        for path in self.read_only_paths:
            if _is_within(mounts._package_dir(), path):
                raise ValueError(f"read_only_paths would expose the grader's checks: {path}")
        self.protected_paths = (mounts._package_dir(), *(Path(p).resolve() for p in protected_paths))
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
            problem = levels.check_bubblewrap()
            if problem is None:
                return "bubblewrap", None
            if wanted == "bubblewrap":
                raise SandboxUnavailable(problem)
            problems.append(problem)
        problem = levels.check_unprivileged_user(self.protected_paths)
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
        if self.python_paths:
            env = {"PYTHONPATH": os.pathsep.join(map(str, self.python_paths)), **(env or {})}
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


def _address_space_slack(memory_bytes: int) -> int:
    """How far below ``memory_bytes`` (RLIMIT_AS) a process's peak address space may stay and
    still have run into the limit: an allocation fails when it would cross the limit, so the
    peak stops short of it by up to one request. An eighth of the limit plus 16 MiB covers
    requests of 256 MiB at a 2 GiB limit; a process with torch loaded peaks under 1 GiB."""
    return memory_bytes // 8 + 16 * 2**20
