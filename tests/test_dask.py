"""``grader grade --executor dask``: a LocalCluster of 2 worker processes grades like the local pool.

One batch of the hyena examples is graded twice, side by side: by the local pool and by
``--executor dask`` through the CLI, where one Dask worker process is killed (SIGKILL) while
it grades a submission. The Dask run's results must equal the pool's item for item, every
submission graded exactly once, and the pool then finds the Dask run's results current (the
cache keys agree). A worker whose grader differs from the coordinator's refuses the work, and
the batch stops with a readable error. Submissions travel as bytes (:class:`Parcel`), rebuilt
to the same digest. Without Dask installed, ``--executor dask`` says how to install it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grader import digests
from grader.assignment import Assignment
from grader.cli import main
from grader.executors.dask import Parcel
from grader.intake import discover, submission_files, submission_sha256
from grader.load import package_files

from conftest import ROOT, finish_all

HYENA = ROOT / "examples" / "submissions" / "linear_attention_hyena"
IDS = ("partly_wrong", "reference", "untouched")
# The same generous limits for both runs: a verdict must not depend on how busy the machine is.
LIMITS = ["--cell-timeout", "300", "--notebook-timeout", "900"]


def grade_command(subs: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grader.cli", "grade", str(subs), "--assignment", "linear_attention_hyena",
            "--out", str(out), "--workers", "2", *LIMITS, *extra]


def children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            except OSError:
                continue
            found.setdefault(int(stat[stat.rfind(b")") + 2:].split()[1]), []).append(int(entry.name))
    return found


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def grading_worker(coordinator: int) -> int | None:
    """A Dask worker process of ``coordinator`` with a sandbox run under it: one mid-submission."""
    tree = children()
    for pid in tree.get(coordinator, []):
        if "spawn_main" not in command_of(pid):
            continue
        below, todo = [], list(tree.get(pid, []))
        while todo:
            child = todo.pop()
            below.append(command_of(child))
            todo += tree.get(child, [])
        if any("bwrap" in c for c in below):
            return pid
    return None


def items(out: Path, submission_id: str) -> dict[str, tuple]:
    data = json.loads((out / submission_id / "results.json").read_text())
    return {t["extra_data"]["id"]: (t["score"], t["extra_data"]["state"], t["output"]) for t in data["tests"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The batch graded by the local pool and, at the same time, on Dask with one worker killed
    mid-submission: (submissions, pool output, dask output, {name: (status, output)}, killed pid)."""
    base = tmp_path_factory.mktemp("dask")
    subs = base / "subs"
    subs.mkdir()
    for name in IDS:
        shutil.copy(HYENA / f"{name}.ipynb", subs / f"{name}.ipynb")
    # The killed worker's folders stay behind: in a TMPDIR of the test's own (outside pytest's
    # 0700 basetemp: the sandbox uid must reach its scratch).
    tmp = Path(tempfile.mkdtemp(prefix="g2c-dask-test-"))
    os.chmod(tmp, 0o711)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    started = {}
    for name, extra in (("pool", ()), ("dask", ("--executor", "dask"))):
        started[name] = subprocess.Popen(grade_command(subs, base / name, *extra), cwd=ROOT, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and started["dask"].poll() is None and time.monotonic() < deadline:
        killed = grading_worker(started["dask"].pid)
        if killed is None:
            time.sleep(0.2)
    if killed is not None:
        os.kill(killed, signal.SIGKILL)
    finished = finish_all(started, timeout=600)
    yield subs, base / "pool", base / "dask", finished, killed
    shutil.rmtree(tmp, ignore_errors=True)


def test_dask_grades_like_the_pool_item_for_item(runs):
    _, pool, dask, finished, _ = runs
    for name, (status, output) in finished.items():
        assert status == 0, f"{name}:\n{output}"
    assert "with 2 Dask worker processes" in finished["dask"][1]
    for submission_id in IDS:
        assert items(dask, submission_id) == items(pool, submission_id), submission_id
        assert sorted(p.name for p in (dask / submission_id).iterdir()) == \
               sorted(p.name for p in (pool / submission_id).iterdir())   # every artifact written
    assert any(state != "passed" for _, state, _ in items(dask, "partly_wrong").values())


def test_a_worker_killed_mid_submission_loses_nothing_and_counts_nothing_twice(runs):
    _, _, dask, finished, killed = runs
    status, output = finished["dask"]
    assert killed is not None, f"no Dask worker was seen grading:\n{output}"
    assert status == 0, output
    graded = [line.split(":")[0] for line in output.splitlines() if line.endswith(" s)")]
    assert sorted(graded) == sorted(IDS), output   # each submission graded once, none lost
    for submission_id in IDS:
        result = json.loads((dask / submission_id / "results.json").read_text())
        assert not result["extra_data"].get("grader_errors") and "internal grader error" not in result["output"]
    assert len((dask / "gradebook.csv").read_text().splitlines()) == 1 + len(IDS)


def test_the_pool_finds_the_dask_results_current(runs):
    subs, _, dask, _, _ = runs
    before = {i: (dask / i / "results.json").read_text() for i in IDS}
    rerun = subprocess.run(grade_command(subs, dask), cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(IDS)} of {len(IDS)} submissions already graded (unchanged); skipping them" in rerun.stderr
    assert {i: (dask / i / "results.json").read_text() for i in IDS} == before


def test_a_worker_with_another_grader_refuses_and_the_batch_stops_readably(tmp_path, monkeypatch, capsys):
    """The coordinator's evaluation digest differs from the workers' (their checks are the
    files on disk): nothing is graded, and the error says what differs."""
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(HYENA / "untouched.ipynb", subs / "untouched.ipynb")
    real = digests.evaluation_digest
    monkeypatch.setattr(digests, "evaluation_digest", lambda *a, **k: real(*a, **k) + "-coordinator")
    status = main(["grade", str(subs), "--assignment", "linear_attention_hyena", "--out", str(tmp_path / "out"),
                   "--executor", "dask", "--workers", "1"])
    error = capsys.readouterr().err
    assert status == 2, error
    assert "runs another grader than the coordinator" in error and "evaluation" in error, error
    assert "execution" not in error.split("coordinator vs worker:")[1].split(")")[0], error
    assert not (tmp_path / "out" / "untouched" / "results.json").exists()


def test_a_parcel_rebuilds_the_submission_to_the_same_digest(tmp_path):
    """A folder submission with a package file, and a file past the size limit (rebuilt sparse,
    at its real size, so the load refuses it with the same reason)."""
    folder = tmp_path / "subs" / "package_style"
    shutil.copytree(ROOT / "examples" / "submissions" / "linear_attention" / "package_style", folder)
    big = tmp_path / "subs" / "big.ipynb"
    big.write_bytes(b"{" + b" " * 3000 + b"}")
    declared = package_files(Assignment("linear_attention").template)
    for max_bytes in (1000, 2**20):   # the notebooks are past the first limit, within the second
        for submission in discover([tmp_path / "subs"], declared):
            parcel = Parcel.read(submission, declared, max_bytes)
            assert isinstance(parcel, Parcel)
            assert all(len(data) <= max_bytes + 1 for _, data, _ in parcel.files)
            target = tmp_path / f"rebuilt-{max_bytes}-{submission.submission_id}"
            target.mkdir()
            rebuilt = parcel.unpack(target)
            assert (rebuilt.submission_id, rebuilt.original, rebuilt.notes) == \
                   (submission.submission_id, submission.original, submission.notes)
            original_files = submission_files(submission.path, submission.folder, declared)
            rebuilt_files = submission_files(rebuilt.path, rebuilt.folder, declared)
            assert sorted(original_files) == sorted(rebuilt_files)
            assert len(original_files) == (2 if submission.folder else 1)
            assert submission_sha256(rebuilt_files, rebuilt.folder, max_bytes) == \
                   submission_sha256(original_files, submission.folder, max_bytes)
            for name, path in original_files.items():
                assert rebuilt_files[name].stat().st_size == path.stat().st_size
                if path.stat().st_size <= max_bytes:
                    assert rebuilt_files[name].read_bytes() == path.read_bytes()


def test_without_dask_the_command_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    """Dask is imported only for --executor dask; missing, it is one line on how to install it."""
    from grader import executors

    monkeypatch.delitem(sys.modules, "grader.executors.dask")
    monkeypatch.delattr(executors, "dask")
    monkeypatch.setitem(sys.modules, "distributed", None)   # what an environment without it gives
    command = ["grade", str(HYENA / "untouched.ipynb"), "--assignment", "linear_attention_hyena",
               "--out", str(tmp_path / "out")]
    assert main([*command, "--executor", "dask"]) == 2
    error = capsys.readouterr().err
    assert error == ("grader: --executor dask needs Dask (distributed is missing): "
                     "pip install 'g2c-grader[dask]'\n"), error
    assert main([*command, "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    assert capsys.readouterr().err == "grader: --scheduler is for --executor dask\n"
    assert not (tmp_path / "out").exists()
