"""Lifecycle of ``grader grade``: nothing it started outlives it, however it ends.

Real ``grader grade`` commands on a small batch, at both isolation levels: bubblewrap, and
the unprivileged user (as root, on a root-only copy of the grader and the assignment, which
that level requires; without ``unshare`` on PATH, so without a PID namespace to hold the
sandbox's processes, as in a Gradescope container; from a virtualenv of a Python the sandbox
uid can run, which this checkout's need not be). The batch is one submission graded without
running anything and slow ones whose first cell waits for a file the test puts in the run's
scratch (so how long a run takes never depends on how busy the machine is), after starting
a process that leaves the kernel's tree (double fork, new session): only its uid says whose
it is.

A ``--executor dask`` run (a LocalCluster of worker processes) is killed and interrupted the
same way.

Every process of the run is recorded while it runs, by ancestry from the command and by the
sandbox uids seen among them; after the command is killed or stopped, none may be left.
The pieces (the sandbox run cut short, scratch given back, the guard) are tested in process
at the end.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from grader.sandbox import GUARD_GRACE, SANDBOX_UID_BASE, SANDBOX_UID_SLOTS, Guard, Sandbox, _UidLease

from conftest import ROOT, write_notebook

ASSIGNMENT = "linear_attention_hyena"
RELEASE = "release"   # the slow cell waits until this file is in its working folder
ESCAPEE = "g2c-escapee"   # the name of the process the slow cell leaves behind
TICKS = os.sysconf("SC_CLK_TCK")
SLOW_CELL = f"""\
import ctypes, os, time
# A process that leaves the kernel's tree at once: its parent exits, it is in a session of its own.
# A fork (the kernel runs no program), named so that the test finds it.
child = os.fork()
if child == 0:
    if os.fork() == 0:
        os.setsid()
        ctypes.CDLL(None).prctl(15, b"{ESCAPEE}", 0, 0, 0)   # PR_SET_NAME
        time.sleep(3600)
    os._exit(0)
os.waitpid(child, 0)
while not os.path.exists({RELEASE!r}):
    time.sleep(0.1)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uids exist only for a grader run as root")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int
    start: int   # clock ticks since boot: with the pid, a process's identity
    zombie: bool
    command: str   # its name (comm), then its command line


def processes() -> dict[int, Proc]:
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            uid = entry.stat().st_uid
            command = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        name = stat[stat.find(b"(") + 1:stat.rfind(b")")].decode(errors="replace")
        found[int(entry.name)] = Proc(int(entry.name), int(fields[1]), uid, int(fields[19]), fields[0] == b"Z",
                                      f"{name} {command}"[:160])
    return found


def now_ticks() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * TICKS)


def is_sandbox_uid(uid: int) -> bool:
    return SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SLOTS


def orphaned(proc: Proc, procs: dict[int, Proc]) -> bool:
    """Whether no process of root's is above ``proc`` but init: a sandbox process that left
    its run's tree. One under a root process runs in some grader's sandbox, maybe another's on
    the same uid (once a run ends its uid is free for the next)."""
    parent = procs.get(proc.ppid)
    while parent is not None and parent.pid != 1:
        if parent.uid == 0:
            return False
        parent = procs.get(parent.ppid)
    return True


def _as_from_a_terminal() -> None:
    """Ctrl-C and hangup as an interactive shell leaves them to a command it starts: pytest may
    itself have been started where they are ignored (a background job), which a child inherits."""
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


STARTED: list[subprocess.Popen] = []   # every grader grade command the tests start, stopped after each test


class Run:
    """One ``grader grade`` command in a session of its own, its processes recorded as it runs,
    and the slow cells of its submissions released while ``release`` is set."""

    def __init__(self, root: Path, isolation: str, workers: int, name: str, python: str = sys.executable,
                 executor: str = "local") -> None:
        self.root, self.name = root, name
        self.seen: dict[tuple[int, int], Proc] = {}
        self.uids: set[int] = set()
        self.release = False
        self.released: set[Path] = set()
        self.log = root / f"{name}.log"
        # As on an instructor's machine: not the MPLCONFIGDIR an earlier test's import of matplotlib
        # left in this process's environment, so a temporary folder of the coordinator shows here.
        env = {**{k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}, "PYTHONPATH": str(root),
               "TMPDIR": str(root.parent / "tmp")}
        if isolation == "unprivileged-user":
            env["PATH"] = str(root / "no-unshare")   # neither unshare nor bwrap: no namespaces at all
        command = [python, "-c", "import sys; from grader.cli import main; sys.exit(main())", "grade",
                   str(root / "subs"), "--assignment", ASSIGNMENT, "--out", str(root / "out"),
                   "--workers", str(workers), "--isolation", isolation, "--executor", executor,
                   "--cell-timeout", "300", "--notebook-timeout", "600",
                   "--idle-timeout", "600"]   # the slow cell waits on the test, as code that hangs would
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_as_from_a_terminal)
        STARTED.append(self.proc)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            procs = processes()
            children: dict[int, list[int]] = {}
            for p in procs.values():
                children.setdefault(p.ppid, []).append(p.pid)
            tree, todo = [], [self.proc.pid]
            while todo:
                pid = todo.pop()
                if pid in procs:
                    tree.append(procs[pid])
                todo += children.get(pid, [])
            self.uids |= {p.uid for p in tree if is_sandbox_uid(p.uid)}
            for p in [*tree, *(p for p in procs.values() if p.uid in self.uids and orphaned(p, procs))]:
                if not p.zombie:
                    self.seen[p.pid, p.start] = p
            if self.release:   # each folder once: touched again, it could refill one its run is removing
                for folder in set((self.root.parent / "tmp").glob("g2c-*/execute")) - self.released:
                    (folder / RELEASE).touch()
                    self.released.add(folder)
            self._stop.wait(0.1)

    def alive(self, command: str) -> list[Proc]:
        procs = processes()
        return [p for key, p in list(self.seen.items())
                if key[0] in procs and procs[key[0]].start == key[1] and not procs[key[0]].zombie
                and command in p.command]

    def wait_until(self, condition, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name}: grader grade exited ({self.proc.returncode}) before {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: no {what} after {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def left(self, since: int) -> list[Proc]:
        """What is still running of the run: recorded processes alive, and any orphaned process
        of its sandbox uids started before ``since`` (a later one may be another grader's run)."""
        procs = processes()
        alive = [procs[pid] for pid, start in self.seen if pid in procs and procs[pid].start == start]
        alive += [p for p in procs.values() if p.uid in self.uids and p.start <= since and orphaned(p, procs)]
        return sorted({p.pid: p for p in alive if not p.zombie}.values(), key=lambda p: p.pid)

    def assert_nothing_left(self, since: int, within: float) -> None:
        deadline = time.monotonic() + within
        while (left := self.left(since)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._stop.set()
        assert not left, f"{self.name}: left running:\n" + "\n".join(
            f"  {p.pid} uid {p.uid}: {p.command}" for p in left)

    def stopped(self, timeout: float = 60, after: str = "its signal") -> int:
        """The exit status of a run told to stop; if it does not, why (its signal dispositions,
        what it wrote) rather than a bare timeout. The ``base`` fixture kills what is left."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
            signals = "\n".join(line for line in status.splitlines() if line.startswith(("Sig", "ShdPnd", "State")))
            pytest.fail(f"{self.name}: still running {timeout} s after {after}:\n{signals}\n{self.output()}")

    def finish(self, timeout: float = 240) -> int:
        self.release = True
        status = self.stopped(timeout, after="its slow cells were released")
        self._stop.set()
        return status

    def output(self) -> str:
        errors = [f"{p}:\n{p.read_text(errors='replace')}" for p in (self.root / "out").glob("*/grader_errors.txt")]
        return "\n".join([self.log.read_text(errors="replace"), *errors])

    def results(self) -> dict[str, int]:
        """submission id -> results.json's mtime (ns)."""
        return {p.parent.name: p.stat().st_mtime_ns for p in (self.root / "out").glob("*/results.json")}


def make_batch(base: Path, name: str, slow: int) -> Path:
    """A root-only copy of the grader and the assignment (what the unprivileged-user level
    needs), with ``a_done`` (graded without running anything) and ``slow`` slow submissions."""
    root = base / name
    root.mkdir(mode=0o700)
    for folder in ("grader", "assignments", "solutions", "rubrics"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "no-unshare").mkdir()
    subs = root / "subs"
    subs.mkdir()
    (subs / "a_done.ipynb").write_text('{"nbformat": 4, "metadata": {}}')   # no cells: graded at once
    for k in range(slow):
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(SLOW_CELL + f"# slow {k}\n")]
        write_notebook(notebook, subs / f"{chr(ord('b') + k)}_slow.ipynb")
    return root


def python_for(level: str, user_python: str) -> str:
    return user_python if level == "unprivileged-user" else sys.executable


@pytest.fixture
def base():
    """Outside pytest's 0700 basetemp: the sandbox uid must reach its scratch (in base/tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="g2c-lifecycle-"))
    os.chmod(folder, 0o711)
    (folder / "tmp").mkdir(mode=0o711)
    yield folder
    # A test that failed part-way leaves its commands running: kill -9 each session (their
    # guards stop the rest), so that nothing outlives the test.
    for proc in STARTED:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    STARTED.clear()
    shutil.rmtree(folder, ignore_errors=True)


def kernels_running(run: Run, count: int) -> bool:
    return len(run.alive("kernel_launcher.py")) >= count and "a_done" in run.results()


def test_kill_9_leaves_nothing_running_no_late_result_and_the_rerun_grades_the_rest(base, user_python):
    # name -> (batch, isolation level, workers, executor): both levels on the pool, and a
    # dask-executor run (a LocalCluster's worker processes, their kernels and sandboxes).
    batches = {"bubblewrap": (make_batch(base, "bwrap", 2), "bubblewrap", 2, "local"),
               "unprivileged-user": (make_batch(base, "user", 1), "unprivileged-user", 1, "local"),
               "dask": (make_batch(base, "dask", 2), "bubblewrap", 2, "dask")}

    def start(prefix: str) -> dict[str, Run]:
        return {name: Run(root, level, workers, f"{prefix}-{name}", python_for(level, user_python), executor)
                for name, (root, level, workers, executor) in batches.items()}
    runs = start("kill9")
    for name, run in runs.items():
        run.wait_until(lambda: kernels_running(run, batches[name][2]), "kernels running")
    assert runs["unprivileged-user"].uids, "the unprivileged-user run showed no process of a sandbox uid"
    # the kernel is up before its cell starts the process that leaves the tree
    runs["unprivileged-user"].wait_until(lambda: runs["unprivileged-user"].alive(ESCAPEE),
                                         "process that leaves the tree", timeout=60)
    assert len([p for p in runs["dask"].alive("spawn_main") if p.ppid == runs["dask"].proc.pid]) == 2, \
        "the dask run showed no 2 worker processes"

    written, killed_at = {}, {}
    for name, run in runs.items():
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        killed_at[name] = now_ticks()
        written[name] = run.results()
        assert set(written[name]) == {"a_done"}, run.output()
    for name, run in runs.items():
        run.assert_nothing_left(killed_at[name], within=10)
    # Were a worker still grading, these would let its slow cell finish and a result follow: the
    # rest of a hyena submission (its last cells, the probe, the checks) takes about 3 s here.
    for folder in (base / "tmp").glob("g2c-*/execute"):
        (folder / RELEASE).touch()
    time.sleep(10)
    for name, run in runs.items():
        assert run.results() == written[name], f"{name}: a result was written after the kill"
    # A Dask worker process exits at once when its parent is gone (distributed's own watch), so
    # the folders of its runs cut short stay in TMPDIR (the pool's workers removed theirs).
    left = {p for p in (base / "tmp").iterdir()}

    reruns = start("rerun")
    for name, rerun in reruns.items():
        assert rerun.finish() == 0, rerun.output()
        total = 1 + batches[name][2]
        assert f"1 of {total} submissions already graded (unchanged); skipping them" in rerun.output()
        graded = {line.split(":")[0] for line in rerun.output().splitlines() if line.endswith(" s)")}
        assert graded == set(rerun.results()) - {"a_done"} == {f"{chr(ord('b') + k)}_slow" for k in range(total - 1)}
        assert rerun.results()["a_done"] == written[name]["a_done"]   # kept, not rewritten
    # Nothing new; a rerun at the unprivileged level may remove what the killed runs left on the
    # uid it leases (everything of that uid in TMPDIR goes after its run).
    new = set((base / "tmp").iterdir()) - left
    assert not new, f"the reruns left scratch folders behind: {sorted(new)}"
    # The dask run's only: its cluster's folder and, of a worker that exited before its SIGTERM
    # handler ran (which of the two races wins is the kernel's), the rebuilt submission and scratch.
    kinds = sorted(p.name.split("-")[1] for p in left)
    assert "dask" in kinds and kinds.count("parcel") <= 2 and set(kinds) <= {"b_slow", "c_slow", "dask", "parcel"}, left
    assert kinds.count("parcel") == kinds.count("b_slow") + kinds.count("c_slow"), left


def test_sigterm_and_ctrl_c_stop_cleanly_and_say_how_to_resume(base, user_python):
    # One of each level, and Ctrl-C to a dask-executor coordinator (whose LocalCluster's worker
    # processes are in the terminal's process group too): name -> (level, signal, executor).
    stops = {"bubblewrap": ("bubblewrap", signal.SIGTERM, "local"),
             "unprivileged-user": ("unprivileged-user", signal.SIGINT, "local"),
             "dask": ("bubblewrap", signal.SIGINT, "dask")}
    runs = {name: Run(make_batch(base, name, 1), level, 1, f"{signal.Signals(signum).name}-{name}",
                      python_for(level, user_python), executor)
            for name, (level, signum, executor) in stops.items()}
    for run in runs.values():
        run.wait_until(lambda: kernels_running(run, 1), "kernel running")
    for name, run in runs.items():
        if stops[name][1] == signal.SIGINT:
            os.killpg(run.proc.pid, signal.SIGINT)   # Ctrl-C: the terminal signals the whole foreground group
        else:
            os.kill(run.proc.pid, signal.SIGTERM)
    for name, run in runs.items():
        signum = stops[name][1]
        status = run.stopped()
        stopped_at = now_ticks()
        assert status == 128 + signum, run.output()
        assert (f"stopped by {signal.Signals(signum).name}: graded 1 of 2 submissions; run the same command "
                "again to grade the remaining 1") in run.output()
        run.assert_nothing_left(stopped_at, within=0.5)   # stopped means stopped: no grace after exit
        assert set(run.results()) == {"a_done"}
    assert not list((base / "tmp").iterdir()), "scratch folders were left behind"


# ---------------------------------------------------------------------------------------------
# The pieces, in process
# ---------------------------------------------------------------------------------------------

def test_a_pool_worker_leaves_without_the_interpreters_teardown(tmp_path):
    """What a pool worker runs last (``exit_at_once``, registered by its initializer): what it
    printed still arrives, its status is 0, and the exit handlers registered before it (the
    teardown) never run."""
    marker = tmp_path / "teardown-ran"
    code = (f"import atexit, pathlib\n"
            f"from grader.executors.local import exit_at_once\n"
            f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'ran')\n"
            f"atexit.register(exit_at_once)\n"
            f"print('the last result is sent')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "the last result is sent\n", "")
    assert not marker.exists(), "an exit handler registered before exit_at_once ran: the teardown was not skipped"


class Alarm(Exception):
    pass


def _raise_alarm(signum, frame):
    raise Alarm


def test_a_sandbox_run_cut_short_kills_its_tree_at_once(tmp_path):
    # The worker told to stop raises in the thread watching the run: the run must die with it,
    # not be waited for until it ends by itself.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    box = Sandbox(isolation="bubblewrap")
    previous = signal.signal(signal.SIGALRM, _raise_alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(Alarm):
            box.run(["python", "-c", "import time; time.sleep(90)  # cut-short-marker"], scratch=scratch, timeout=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30
    assert not [p for p in processes().values() if "cut-short-marker" in p.command and not p.zombie]


def test_a_bubblewrap_run_gives_scratch_back_before_its_uid_is_free(tmp_path):
    # Else a run on the same uid at the unprivileged level (another grader's) deletes it,
    # as it deletes all the uid owns in the shared temporary folders, while it is still read.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = Sandbox(isolation="bubblewrap").run(
        ["python", "-c", "import os; os.mkdir('made'); open('made/file', 'w').write('x'); print(os.getuid())"],
        scratch=scratch)
    assert result.returncode == 0, result.stderr
    assert is_sandbox_uid(int(result.stdout))   # it ran as a sandbox uid...
    for path in (scratch, scratch / "made", scratch / "made" / "file"):
        assert path.stat().st_uid == os.geteuid(), path   # ...and left nothing owned by it


def _as_free_sandbox_uid() -> subprocess.Popen:
    """A process of a sandbox uid that no run holds (its lease taken for the pick, then released).
    The highest free slot: a grading run in another test process takes the lowest free one, and
    would kill the process as it took the uid."""
    lease = next(filter(None, map(_UidLease.of_slot, reversed(range(SANDBOX_UID_SLOTS)))))
    uid = lease.uid
    lease.release()
    return subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "60"], user=uid, group=uid, extra_groups=[],
                            cwd="/", stdin=subprocess.DEVNULL)


def test_the_guard_stops_what_it_watches_and_the_orphans_of_free_uids_and_removes_its_folders(tmp_path):
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    orphan = _as_free_sandbox_uid()
    folder, kept = tmp_path / "coordinator's", tmp_path / "kept"
    for made in (folder / "cache", kept):
        made.mkdir(parents=True)
    (folder / "cache" / "fontlist.json").write_text("{}")
    try:
        guard = Guard()
        guard.watch(watched.pid)
        guard.remove(folder)
        started = time.monotonic()
        guard.close()   # not clean: as after an interrupt, or when the grader died
        assert watched.wait(timeout=5) == -signal.SIGTERM
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started < GUARD_GRACE
        assert not folder.exists() and kept.is_dir()
    finally:
        for proc in (watched, orphan):
            proc.kill()
            proc.wait()


def test_a_clean_close_of_the_guard_touches_nothing_but_its_folders(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    bystander = _as_free_sandbox_uid()   # e.g. a test's own process on a sandbox uid
    folder = tmp_path / "coordinator's"
    folder.mkdir()
    try:
        guard = Guard()
        guard.watch(ended.pid)
        guard.remove(folder)
        ended.wait()
        guard.close(clean=True)
        assert bystander.poll() is None
        assert not folder.exists() and tmp_path.is_dir()
    finally:
        bystander.kill()
        bystander.wait()
