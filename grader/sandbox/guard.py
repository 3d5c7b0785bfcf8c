"""The guard: a process apart from the grader's tree that stops the grader's workers, the
orphans of the sandbox uids and the folders it was given once the grader closes it or dies
(``kill -9`` included). It runs on the standard library alone (``python -I -S``)."""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from grader.sandbox.mounts import _package_dir
from grader.sandbox.uids import kill_orphans


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
                "from grader.sandbox.guard import _guard_main; _guard_main()")
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
