"""The processes of a run, found, measured and killed: which live processes belong to it (its
uid, its session and descendants), their memory (PSS) and its private tmpfs, their peak address
space, their scratch on disk; killing them all, and waiting for the first one's exit without
reaping it."""
from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

from grader.harness.cpu_time import processes
from grader.sandbox.limits import Limits, _size


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
