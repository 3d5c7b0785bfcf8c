"""What one sandboxed run may use and what it reports: :class:`Limits`, :class:`MemoryShare`
(one memory limit for a submission's runs at once), :class:`SandboxResult`, and the one-thread
environment every run gets."""
from __future__ import annotations

import threading
from dataclasses import dataclass


# One compute thread per process (torch, OpenBLAS, MKL). CPU limits sum over threads, and an
# idle OpenMP thread spins while it waits for a core: on a busy machine a second thread
# multiplied a probe case's CPU seconds several times over and cost correct code its items.
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
