"""CPU seconds used by a group of processes, read from /proc: the one measure behind every
time limit on student code (the sandbox's whole run, the notebook driver's cells, the probe's
cases), and the words their messages use.

A process's CPU is its own ``utime + stime`` (all its threads) plus ``cutime + cstime``: what
the children it has reaped used, each with what *they* reaped. So adding up those four
fields over the live processes of a tree counts the processes that exited between two
readings too, as long as whoever reaped them is in the tree; a zombie not reaped yet still
shows its own times. A process reparented out of the tree escapes, so the harnesses make
themselves child subreapers: orphans come back to them.

Standard library only: this file is copied next to the harness scripts into the sandbox,
where the ``grader`` package cannot be imported, and the sandbox imports it from here.
"""
import os
from typing import Iterable, List, NamedTuple, Optional

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
BACKSTOP = "stopped by the wall-clock backstop"   # how every backstop message begins


def cpu_limit_message(limit: float) -> str:
    """What a CPU limit's stop says: ``used more than 120 CPU seconds``."""
    return f"used more than {limit:g} CPU seconds"


def backstop_message(seconds: float) -> str:
    """What a wall-clock backstop's stop says (the code used little CPU: it slept or waited)."""
    return f"{BACKSTOP} after {seconds:g} s (sleeping or waiting?)"


class Process(NamedTuple):
    pid: int
    ppid: int
    session: int
    uid: int
    zombie: bool
    cpu: float      # seconds: its own utime + stime
    reaped: float   # seconds: cutime + cstime, what the children it reaped used


def read_process(pid: int) -> Optional[Process]:
    """``pid`` as /proc shows it now, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain anything; fields from the
    # state (field 3) on: ppid 4, session 6, utime 14, stime 15, cutime 16, cstime 17.
    fields = stat[stat.rfind(b")") + 2:].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return Process(pid, int(fields[1]), int(fields[3]), uid, fields[0] == b"Z",
                   (utime + stime) / TICKS_PER_SECOND, (cutime + cstime) / TICKS_PER_SECOND)


def processes() -> List[Process]:
    """Every process this /proc shows (the host's, or a PID namespace's own)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            process = read_process(int(entry.name))
            if process is not None:
                found.append(process)
    return found


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds ``pids`` used, with everything the children they reaped used."""
    total = 0.0
    for pid in pids:
        process = read_process(pid)
        if process is not None:
            total += process.cpu + process.reaped
    return total


class ChildrenMeter:
    """CPU seconds used since it was made by everything this process started: its live and
    zombie descendants, and those it reaped (its own CPU is not counted).

    Two readings race with a process being reaped in between; the error is that one
    process's CPU, once, and the limits it measures are tens of seconds.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.start = self._total()

    def _total(self) -> float:
        listed = processes()
        children: dict = {}
        for process in listed:
            children.setdefault(process.ppid, []).append(process)
        own = next((p for p in listed if p.pid == self.pid), None)
        total = own.reaped if own else 0.0
        pending = list(children.get(self.pid, []))
        while pending:
            process = pending.pop()
            total += process.cpu + process.reaped
            pending += children.get(process.pid, [])
        return total

    def used(self) -> float:
        """CPU seconds since the meter was made."""
        return self._total() - self.start

