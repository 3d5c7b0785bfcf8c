"""grader.sandbox against the real bubblewrap: what a hostile submission can and cannot do.

These tests do not skip when bubblewrap is unusable: they fail with the reason, because
``make install`` installs it and grading real submissions needs it.
"""
from __future__ import annotations

import os
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

import grader
from grader.sandbox import levels, mounts
from grader.sandbox import Limits, MemoryShare, Sandbox, SandboxResult, SandboxUnavailable, check_bubblewrap

PACKAGE = Path(grader.__file__).resolve().parent
REPO = PACKAGE.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True)
def bubblewrap_usable() -> None:
    reason = check_bubblewrap()
    assert reason is None, f"bubblewrap cannot sandbox on this machine: {reason}"


def run_script(tmp_path: Path, code: str, limits: Limits = Limits(), *,
               timeout: float | None = 60, **kwargs: object) -> SandboxResult:
    """Write ``code`` to scratch/script.py and run it with the venv's python."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    script = scratch / "script.py"
    script.write_text(textwrap.dedent(code))
    box = Sandbox(limits, **kwargs)  # type: ignore[arg-type]
    return box.run(["python", str(script)], scratch=scratch, timeout=timeout)


def processes_running(marker: str, *, bwrap: bool = True) -> list[int]:
    """Pids of the live host processes whose command line mentions ``marker``
    (bubblewrap's own two processes included unless ``bwrap`` is false)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            name, state = stat[stat.find(b"(") + 1:stat.rfind(b")")], stat.rsplit(b")", 1)[1].split()[0]
            if marker.encode() in cmdline and state != b"Z" and (bwrap or name != b"bwrap"):
                pids.append(int(entry.name))
    return pids


def test_scratch_is_writable_and_shared_with_the_host(tmp_path: Path) -> None:
    result = run_script(tmp_path, """
        import os
        os.makedirs("results", exist_ok=True)
        with open("results/answer.json", "w") as f:
            f.write('{"x": 1}')
        print(os.getcwd(), os.environ["HOME"])
    """)
    scratch = tmp_path / "scratch"
    assert result.returncode == 0, result.stderr
    assert result.sandboxed and not result.timed_out and result.stopped == []
    assert result.stdout.split() == [str(scratch), str(scratch)]
    assert (scratch / "results" / "answer.json").read_text() == '{"x": 1}'


def test_nothing_outside_scratch_can_be_written(tmp_path: Path) -> None:
    marker = f"g2c-escape-{os.getpid()}-{time.monotonic_ns()}"
    targets = [REPO / marker, Path("/tmp") / marker, tmp_path / marker, Path("/usr") / marker,
               Path(os.__file__).parent / marker, PACKAGE / marker]
    result = run_script(tmp_path, f"""
        written = []
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                written.append(path)
            except OSError:
                pass
        print(written)
    """)
    assert result.returncode == 0, result.stderr
    for target in targets:
        assert not target.exists(), f"the sandbox wrote {target} on the host"
    # Only the sandbox's private /tmp accepted the write, and the host's /tmp has nothing.
    assert result.stdout.strip() == repr([f"/tmp/{marker}"])


def test_repo_hidden_checks_and_shared_are_invisible_but_torch_works_on_one_thread(tmp_path: Path) -> None:
    assert (PACKAGE / "sandbox" / "__init__.py").is_file()
    secrets = [PACKAGE / "sandbox" / "__init__.py", REPO / "pyproject.toml", SHARED / "DESIGN.md"]
    result = run_script(tmp_path, f"""
        import os, sys
        for path in {[str(s) for s in secrets]!r}:
            try:
                open(path).read(1)
                print("READ", path)
            except OSError:
                pass
        for path in {[str(REPO), str(PACKAGE), str(REPO.parent), "/root"]!r}:
            try:
                print("LISTED", path, os.listdir(path))
            except OSError:
                pass
        try:
            import grader
            print("IMPORTED grader from", grader.__file__)
        except ImportError:
            pass
        import torch
        x = torch.arange(4.0).reshape(2, 2)
        print("matmul", (x @ x).tolist(), sys.prefix)
        print("threads", torch.get_num_threads())
    """)
    assert result.returncode == 0, result.stderr
    assert "READ" not in result.stdout
    assert "LISTED" not in result.stdout
    assert "IMPORTED" not in result.stdout
    assert "matmul [[2.0, 3.0], [6.0, 11.0]]" in result.stdout
    # CPU limits sum over threads, and torch's idle threads spin on a busy machine: one each.
    assert "threads 1\n" in result.stdout, result.stdout


def test_network_outside_is_unreachable(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        result = run_script(tmp_path, f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                print("CONNECTED")
            except OSError as exc:
                print("blocked:", exc)
            # The sandbox's own loopback works (a kernel and its client talk over it).
            own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen(1)
            socket.create_connection(own.getsockname(), timeout=3).close()
            print("own loopback ok")
        """)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert "blocked:" in result.stdout and "CONNECTED" not in result.stdout
    assert "own loopback ok" in result.stdout


def test_fork_bomb_is_contained(tmp_path: Path) -> None:
    limits = Limits(max_processes=32)
    peak = 0
    done = threading.Event()
    marker = str(tmp_path / "scratch" / "script.py")

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(processes_running(marker, bwrap=False)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_script(tmp_path, """
            import os, time
            end, failures = time.time() + 3, 0
            while time.time() < end and failures < 500:   # every child keeps forking too
                try:
                    os.fork()
                except OSError:
                    failures += 1
                    time.sleep(0.005)
        """, limits, timeout=20)
    finally:
        done.set()
        watcher.join()
    assert not result.timed_out
    assert 0 < peak <= limits.max_processes
    assert processes_running(marker) == []


def test_memory_bomb_is_stopped(tmp_path: Path) -> None:
    result = run_script(tmp_path, "block = bytearray(8 * 2**30)\nprint('ALLOCATED')\n")
    assert "ALLOCATED" not in result.stdout
    assert "MemoryError" in result.stderr
    assert any("memory limit 4.0 GiB reached" in reason for reason in result.stopped)


def test_memory_of_many_processes_together_is_limited(tmp_path: Path) -> None:
    # Each process stays under the per-process limit; together they do not.
    result = run_script(tmp_path, """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                break
        block = b"x" * (500 * 2**20)
        time.sleep(30)
    """, Limits(memory_bytes=2**30), timeout=30)
    assert result.returncode is None and not result.timed_out
    assert result.wall_seconds < 20
    assert any(r.startswith("memory limit 1.0 GiB reached") for r in result.stopped)


def test_runs_sharing_memory_are_limited_together_and_the_one_holding_most_is_stopped(tmp_path: Path) -> None:
    """One submission's notebook and probe run at once: each under the limit, together over it.
    Each holds its memory until the file ``release`` appears in its scratch (or for 100 s); the
    small one is released once the large one's run has ended and it holds all of its memory
    (the file ``held``) for longer than two of the watch's readings."""
    box, share = Sandbox(Limits(memory_bytes=2**30)), MemoryShare()
    results: dict[str, SandboxResult] = {}

    def hold(name: str, mib: int) -> None:
        scratch = tmp_path / name
        scratch.mkdir()
        (scratch / "hold.py").write_text(f"import os, time\nheld = b'x' * ({mib} * 2**20)\n"
                                         f"open({str(scratch / 'held')!r}, 'w').close()\n"
                                         "deadline = time.monotonic() + 100\n"
                                         f"while not os.path.exists({str(scratch / 'release')!r}) "
                                         "and time.monotonic() < deadline:\n    time.sleep(0.05)\nprint('DONE')\n")
        results[name] = box.run(["python", str(scratch / "hold.py")], scratch=scratch, timeout=120, share=share)

    holding = {name: threading.Thread(target=hold, args=(name, mib)) for name, mib in (("large", 700), ("small", 400))}
    for thread in holding.values():
        thread.start()
    holding["large"].join()
    deadline = time.monotonic() + 60
    while not (tmp_path / "small" / "held").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)
    (tmp_path / "small" / "release").touch()
    holding["small"].join()
    large, small = results["large"], results["small"]
    assert large.returncode is None and not large.timed_out and "DONE" not in large.stdout
    assert any(r.startswith("memory limit 1.0 GiB reached") and "with the submission's other sandbox run" in r
               for r in large.stopped), large.stopped
    assert small.returncode == 0 and "DONE" in small.stdout and not small.stopped
    assert small.peak_memory_bytes >= 400 * 2**20 and share.peak_bytes > 2**30


def test_memory_held_in_tmpfs_counts(tmp_path: Path) -> None:
    """/tmp and /dev/shm are RAM that no process's PSS shows: the watchdog adds them."""
    result = run_script(tmp_path, """
        import time
        held = bytearray(300 * 2**20)
        for path in ("/tmp/fill", "/dev/shm/fill"):
            with open(path, "wb") as f:
                for _ in range(120):
                    f.write(b"x" * 2**20)
        time.sleep(600)
    """, Limits(memory_bytes=512 * 2**20), timeout=120)
    assert not result.timed_out and result.returncode is None, result.stderr
    assert any("its /tmp and /dev/shm" in reason for reason in result.stopped), result.stopped


def test_infinite_loop_is_killed_at_the_timeout_with_everything_it_started(
        tmp_path: Path) -> None:
    marker = str(tmp_path / "scratch" / "script.py")
    result = run_script(tmp_path, """
        import os, signal
        if os.fork() == 0:           # try to escape: new session, ignore polite signals
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        print("looping", flush=True)
        while True:
            pass
    """, timeout=2)
    assert result.timed_out and result.returncode is None
    assert 2 <= result.wall_seconds < 6
    assert "killed after 2 s wall-clock timeout" in result.stopped
    assert "looping" in result.stdout
    assert processes_running(marker) == []


def test_cpu_time_limit(tmp_path: Path) -> None:
    result = run_script(tmp_path, "while True:\n    pass\n", Limits(cpu_seconds=1), timeout=20)
    assert result.returncode == -signal.SIGXCPU and not result.timed_out
    assert "CPU time limit 1 s reached" in result.stopped
    assert result.wall_seconds < 10


def test_output_flood_is_truncated(tmp_path: Path) -> None:
    limits = Limits()
    result = run_script(tmp_path, """
        import sys
        chunk = b"x" * 2**20
        for _ in range(200):
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        print("finished", file=sys.stderr)
    """, limits)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "finished"
    dropped = 200 * 2**20 - limits.output_bytes
    assert result.stdout == "x" * limits.output_bytes + f"\n[... truncated {dropped} bytes]\n"
    assert any("stdout output truncated" in reason for reason in result.stopped)


def test_killing_the_parent_or_pid_1_cannot_hurt_the_grader(tmp_path: Path) -> None:
    result = run_script(tmp_path, """
        import os, signal, time
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
                print("killed", pid)
            except OSError as exc:
                print("refused", pid, type(exc).__name__)
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        os.kill(-1, signal.SIGKILL)  # every process this user may signal (not itself)
        print("child", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
    """)
    assert result.returncode == 0, result.stderr
    assert "killed" not in result.stdout
    assert "refused 1 PermissionError" in result.stdout
    assert "child -9" in result.stdout  # kill(-1) reached only the submission's own child
    os.kill(os.getpid(), 0)  # the grader is still here


def test_file_size_limit(tmp_path: Path) -> None:
    limits = Limits(file_size_bytes=2**20)
    result = run_script(tmp_path, """
        with open("big.bin", "wb") as f:
            for _ in range(4):
                f.write(b"\\0" * 2**19)
    """, limits)
    assert result.returncode == 1
    assert "File too large" in result.stderr
    assert (tmp_path / "scratch" / "big.bin").stat().st_size <= limits.file_size_bytes
    assert any("file size limit 1.0 MiB reached" in reason for reason in result.stopped)


def test_filling_scratch_is_stopped(tmp_path: Path) -> None:
    """Files each under the size limit, without end: the watchdog stops the total."""
    result = run_script(tmp_path, """
        import itertools
        for n in itertools.count():
            with open(f"fill-{n}.bin", "wb") as f:
                f.write(b"x" * 2**20)
    """, Limits(disk_bytes=16 * 2**20), timeout=120)
    assert not result.timed_out and result.returncode is None
    assert any("disk limit 16.0 MiB reached in scratch" in reason for reason in result.stopped), result.stopped


def test_too_many_files_in_scratch_is_stopped(tmp_path: Path) -> None:
    result = run_script(tmp_path, """
        import itertools, os
        os.makedirs("many/files", exist_ok=True)
        for n in itertools.count():
            open(f"many/files/{n}", "w").close()
    """, Limits(max_files=2000), timeout=120)
    assert not result.timed_out and result.returncode is None
    assert any("file count limit 2000 reached" in reason for reason in result.stopped), result.stopped


def test_read_only_run_can_write_nowhere_and_runs_at_low_priority(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = Sandbox().run(["python", "-c", """
import os
written = []
for path in ("here.txt", "/tmp/t", "/dev/shm/t", os.path.expanduser("~/t")):
    try:
        open(path, "w").close()
        written.append(path)
    except OSError:
        pass
print(written, os.nice(0))
"""], scratch=scratch, read_only=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "10"]
    assert list(scratch.iterdir()) == []


def test_stdin_and_environment(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = Sandbox().run(
        ["python", "-c", "import os, sys; print(sys.stdin.read(), os.environ['G2C_GRADING'],"
                         " os.environ.get('SECRET_TOKEN'))"],
        scratch=scratch, env={"G2C_GRADING": "1"}, stdin=b"hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hello", "1", "None"]


def test_unsandboxed_fallback(tmp_path: Path) -> None:
    result = run_script(tmp_path, """
        import resource, socket
        open("out.txt", "w").write("ok")
        server = socket.create_server(("127.0.0.1", 0))  # a Jupyter kernel needs loopback
        socket.create_connection(server.getsockname()).close()
        print(resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_NPROC)[0])
    """, Limits(memory_bytes=3 * 2**30, max_processes=50), force_unsandboxed=True)
    assert result.returncode == 0, result.stderr
    assert result.sandboxed is False
    assert result.stdout.split() == [str(3 * 2**30), "50"]
    assert (tmp_path / "scratch" / "out.txt").read_text() == "ok"

    looping = run_script(tmp_path, "while True: pass\n", force_unsandboxed=True, timeout=1)
    assert looping.timed_out and looping.returncode is None and looping.sandboxed is False


def test_unusable_bubblewrap_refuses_unless_fallback_allowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levels, "check_bubblewrap", lambda: "no namespaces here")
    with pytest.raises(SandboxUnavailable, match="no namespaces here"):
        Sandbox()
    assert Sandbox(allow_unsandboxed=True).sandboxed is False


def test_read_only_paths_are_visible_but_not_writable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "inputs.txt").write_text("provided")
    result = run_script(tmp_path, f"""
        print(open({str(data / "inputs.txt")!r}).read())
        try:
            open({str(data / "new.txt")!r}, "w")
        except OSError as exc:
            print(type(exc).__name__)
    """, read_only_paths=[data])
    assert result.stdout.split() == ["provided", "OSError"], result.stderr
    assert not (data / "new.txt").exists()


def test_grader_package_inside_a_bound_folder_is_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As with a non-editable install of the grader inside the venv.
    site = tmp_path / "site-packages"
    (site / "grader").mkdir(parents=True)
    (site / "grader" / "hidden_checks.py").write_text("EXPECTED = 42\n")
    (site / "numpy_like.py").write_text("OK = 1\n")
    real_paths = mounts._python_paths()
    monkeypatch.setattr(mounts, "_python_paths", lambda: [*real_paths, site])
    monkeypatch.setattr(mounts, "_package_dir", lambda: site / "grader")
    result = run_script(tmp_path, f"""
        import os, sys
        sys.path.insert(0, {str(site)!r})
        import numpy_like
        print("visible", numpy_like.OK)
        try:
            print(os.listdir({str(site / "grader")!r}))
            import grader.hidden_checks
            print("LEAKED")
        except (OSError, ImportError) as exc:
            print("hidden", type(exc).__name__)
    """)
    assert "visible 1" in result.stdout, result.stderr
    assert "hidden PermissionError" in result.stdout and "LEAKED" not in result.stdout


def test_scratch_must_not_expose_the_grader(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="grader's checks"):
        Sandbox().run(["true"], scratch=REPO)
    with pytest.raises(ValueError, match="grader's checks"):
        Sandbox(read_only_paths=[REPO])


def test_missing_bubblewrap_is_reported_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levels.shutil, "which", lambda name: None)
    assert check_bubblewrap.__wrapped__() == (
        "bubblewrap is not installed: apt-get install bubblewrap")


def test_the_unprivileged_level_is_refused_when_the_sandbox_user_cannot_import_what_runs_need(
        user_python: str, tmp_path: Path) -> None:
    # A virtualenv whose packages sit behind a folder only root may enter (a checkout in a
    # `mktemp -d` folder): root imports them, the sandbox user does not, so every run would fail
    # and charge the student. The level is refused instead, saying why.
    import shutil
    import subprocess
    import sysconfig
    import tempfile

    check = "from grader.sandbox import check_unprivileged_user as check; print(check([]))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(grader.__file__).parent.parent)}
    folder = Path(tempfile.mkdtemp(prefix="g2c-closed-venv-"))
    try:
        os.chmod(folder, 0o755)
        closed = folder / "closed"
        closed.mkdir(mode=0o700)
        (closed / "site").symlink_to(sysconfig.get_paths()["purelib"])
        venv = folder / "venv"
        subprocess.run([str(Path(user_python).resolve()), "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "closed.pth").write_text(f"{closed / 'site'}\n")
        refused = subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True,
                                 env=env, timeout=300)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.startswith("the sandbox user cannot import nbformat, nbclient, ipykernel, numpy, torch "
                                     f"with {venv / 'bin' / 'python'} (nbformat: ModuleNotFoundError"), refused.stdout
    assert "every folder above it must be readable by all" in refused.stdout
    # The same packages reachable by all: the level is accepted.
    accepted = subprocess.run([user_python, "-c", check], capture_output=True, text=True, env=env, timeout=300)
    assert (accepted.returncode, accepted.stdout.strip()) == (0, "None"), accepted.stdout + accepted.stderr


def test_a_process_that_runs_into_its_address_space_limit_and_goes_on_is_reported(tmp_path: Path) -> None:
    # A notebook's kernel raises MemoryError into the cell's output, not onto stderr, and is
    # not killed: the note must come from the address space the process reached. Here the
    # failed allocations are caught silently and the process is still alive at the timeout.
    result = run_script(tmp_path, """
        import mmap, sys, time
        hoard = []
        try:
            while True:
                hoard.append(mmap.mmap(-1, 64 * 2**20))
        except (MemoryError, OSError):
            pass
        print("FULL", flush=True)
        time.sleep(60)
    """, Limits(memory_bytes=2**30), timeout=8)
    assert "FULL" in result.stdout and "MemoryError" not in result.stderr
    assert result.peak_address_space_bytes > 2**30 - 64 * 2**20 - 2**20
    assert any(r.startswith("memory limit 1.0 GiB reached (a process's address space reached")
               for r in result.stopped), result.stopped


def test_the_memory_note_follows_the_address_space_not_the_timing_of_stderr() -> None:
    box = Sandbox(Limits(memory_bytes=2 * 2**30))
    # The adversarial notebook's hoard (256 MiB at a time) stops within 256 MiB of the limit.
    near = box._explain(0, "", 2 * 2**30 - 2**28 + 4096)
    assert any(r.startswith("memory limit 2.0 GiB reached") and "MemoryError" in r for r in near), near
    # A kernel with torch loaded (under 1 GiB of address space) ran into nothing.
    assert not any("memory limit" in r for r in box._explain(0, "", 2**30))
    # MemoryError on stderr still says so without an address space reading.
    assert box._explain(1, "MemoryError\n", 0) == ["memory limit 2.0 GiB reached (MemoryError)"]
