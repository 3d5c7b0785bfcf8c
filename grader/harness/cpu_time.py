"""CPU seconds used by a group of processes, read from /proc: the one measure behind every
time limit on student code (the sandbox's whole run, the notebook driver's cells, the probe's
cases), and the words their messages use.

A process's CPU is its own ``utime + stime`` (all its threads) plus ``cutime + cstime``: what
the children it has reaped used, each with what *they* reaped. So adding up those four
fields over the live processes of a tree counts the processes that exited between two
readings too, as long as whoever reaped them is in the tree; a zombie not reaped yet still
shows its own times. A process reparented out of the tree escapes, so the harnesses make
themselves child subreapers: orphans come back to them.

Code that sleeps or waits uses no CPU, so a CPU limit never stops it: :class:`IdleWatch`
does, telling it apart from code starved by a busy machine by the states of its threads. Once
a run (the notebook's cells, the probe's cases) has stopped one as hung, each later one is
stopped after ``AFTER_HUNG_S`` idle seconds: the submission is known to wait somewhere, so a
sleeping function costs one idle limit, not one per cell and case that calls it, and honest
code slow under load is never idle, so nothing it does is cut short.

Standard library only: this file is copied next to the harness scripts into the sandbox,
where the ``grader`` package cannot be imported, and the sandbox imports it from here.
"""
import os
import time
from collections import deque
from typing import Callable, Iterable, List, NamedTuple, Optional, Tuple

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
BACKSTOP = "stopped by the wall-clock backstop"   # how every backstop message begins
IDLE = "stopped as hung"                          # how every idle stop's message begins
AFTER_HUNG_S = 2.0   # the idle limit of a run's later cells or cases once one was stopped as hung


def cpu_limit_message(limit: float) -> str:
    """What a CPU limit's stop says: ``used more than 120 CPU seconds``."""
    return f"used more than {limit:g} CPU seconds"


def backstop_message(seconds: float) -> str:
    """What a wall-clock backstop's stop says (the code used little CPU: it slept or waited)."""
    return f"{BACKSTOP} after {seconds:g} s (sleeping or waiting?)"


def idle_message(seconds: float, first: Optional[float] = None) -> str:
    """What an idle stop says (``IdleWatch``): the code waited, it was not starved; ``first``:
    the limit of the run's earlier stop, when this one came at ``AFTER_HUNG_S``."""
    said = f"{IDLE}: it made no CPU progress for {seconds:g} s while it could have run (sleeping or waiting?)"
    return said if first is None else f"{said}, as an earlier call was stopped after {first:g} s"


def idle_limits(limit: float, hung_before: bool) -> Tuple[float, Optional[float]]:
    """(the idle limit, the earlier stop's limit or None) of a cell or case, once ``hung_before``
    (an earlier one of the run was stopped as hung) or not."""
    return (min(limit, AFTER_HUNG_S), limit) if hung_before and limit > AFTER_HUNG_S else (limit, None)


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

    def _total(self, pids: Optional[List[int]] = None) -> float:
        listed = processes()
        children: dict = {}
        for process in listed:
            children.setdefault(process.ppid, []).append(process)
        own = next((p for p in listed if p.pid == self.pid), None)
        total = own.reaped if own else 0.0
        pending = list(children.get(self.pid, []))
        while pending:
            process = pending.pop()
            if pids is not None:
                pids.append(process.pid)
            total += process.cpu + process.reaped
            pending += children.get(process.pid, [])
        return total

    def used(self) -> float:
        """CPU seconds since the meter was made."""
        return self._total() - self.start

    def reading(self) -> Tuple[float, List[int]]:
        """CPU seconds since the meter was made, and the pids of the descendants it counted."""
        pids: List[int] = []
        return self._total(pids) - self.start, pids


def runnable(pids: Iterable[int]) -> bool:
    """Whether a thread of ``pids`` is running or waiting for a core (``R``), or for the disk
    (``D``): such a process is not waiting on anything of its own choosing."""
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if stat[stat.rfind(b")") + 2:][:1] in (b"R", b"D"):
                return True
    return False


class IdleWatch:
    """Tells code that waits (sleeps, blocks on a pipe or a lock nobody releases) from code that
    a busy machine starves, from readings taken every ``interval`` seconds.

    Processes are *hung* when, over the last ``limit`` seconds, they used under
    ``CPU_SHARE`` of one core and a thread of theirs was runnable in under half of the
    readings. A starved process is runnable (state ``R``: it waits for a core, however long
    the machine's run queue is), so load never makes it hung; a process that sleeps between
    short bursts is runnable only during them. A reading that comes late (the watcher itself
    waited for a core that long) restarts the window: the machine was too busy to tell.
    """

    CPU_SHARE = 0.1
    LATE_FACTOR = 4   # a reading this many intervals after the previous one comes late

    def __init__(self, limit: float, interval: float) -> None:
        self.limit, self.interval = limit, interval
        self._readings: deque = deque()   # (monotonic time, CPU seconds, runnable)

    def hung(self, cpu: float, pids: Iterable[int], now: Optional[float] = None) -> bool:
        """Record a reading (``cpu``: the processes' CPU seconds so far, ``pids``: who they are
        now); whether they have been hung for ``limit`` seconds."""
        return self.judge(time.monotonic() if now is None else now, cpu, lambda: runnable(pids))

    def judge(self, now: float, cpu: float, is_runnable: Callable[[], bool]) -> bool:
        """``hung`` on a reading taken at ``now``; ``is_runnable`` is asked only when the CPU
        alone does not show the processes at work."""
        readings = self._readings
        if readings and now - readings[-1][0] > self.LATE_FACTOR * self.interval:
            readings.clear()
        busy = bool(readings) and cpu - readings[-1][1] > self.CPU_SHARE * (now - readings[-1][0])
        readings.append((now, cpu, busy or is_runnable()))
        while len(readings) > 1 and now - readings[1][0] >= self.limit:
            readings.popleft()   # keep one reading at or before the window's start
        start, first_cpu, _ = readings[0]
        span = now - start
        if span < self.limit:
            return False
        waiting = sum(1 for _, _, running in readings if not running)
        return cpu - first_cpu < self.CPU_SHARE * span and 2 * waiting > len(readings)
