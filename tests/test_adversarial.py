"""Isolation: student code cannot cheat, escape or take the grader down.

Every hostile notebook of ``tests/adversarial.py`` is graded in ONE batch together with an
honest submission, through the real ``grade_batch`` (real bubblewrap sandbox, two workers,
reduced limits). The module fixture snapshots what no submission may touch (the repository, ``/work/shared``, the batch's output folder, a canary in
the host's ``/tmp``), runs a TCP and UDP server on 127.0.0.1, grades the batch and snapshots
again. Each test then reads the results: the batch completed, the honest submission earns exactly
what its cells give, an attack earns no more than the honest baseline (and a cheat no more
than the same code without its cheat), nothing outside its scratch changed, and its
``results.json`` says what was stopped.

Nothing here asserts on time: timeouts are limits the grader enforces, not measurements.
"""
from __future__ import annotations

import io
import json
import os
import select
import socket
import threading
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

import adversarial as adv
from adversarial import ATTACKS
from conftest import ROOT, gradescope_valid, items_by_id
from grader.assignment import Assignment
from grader.batch import BatchOutcome, grade_batch
from grader.checks import linear_attention as la_checks
from grader.intake import discover
from grader.sandbox.factory import make_sandbox
from grader.pipeline import EXECUTED_NOTEBOOK, GRADER_ERRORS, RAW_OUTPUTS, SCAFFOLD_SOURCE, SCREENING
from grader.report.executed import EXECUTED_PAGE
from grader.report.results import RESULTS_FILE
from grader.sandbox import SANDBOX_UID_BASE, SANDBOX_UID_SLOTS
from grader.written import WRITTEN_INPUTS

# The honest notebook's slowest cell (the imports) needs 1.5 to 2 CPU s here, its slowest probe
# case under 0.3 s: limits twice and six times that, so that the attacks stopped by them cost little.
LIMITS = {"cell_timeout_s": 4, "notebook_timeout_s": 60, "probe_case_timeout_s": 2, "memory_gib": 2,
          "disk_mib": 256}
SHARED = ROOT.parent / "shared"
SNAPSHOT_SKIP = {".venv", "out", "__pycache__", ".git", ".pytest_cache"}
HONEST = "honest"
CONTROL = "control_no_step"          # step unwritten: what the cheats must not beat
CHEATS = ("forge_probe_outputs", "patch_harness_toplevel", "patch_harness_in_forward", "patch_harness_at_import",
          "patch_libraries", "step_history_on_state", "step_history_in_files", "scaffold_duplicated",
          "forge_hybrid_report")
STEP_ITEMS = ("equivalence", "alignment", "decay_recurrent", "decay_per_head", "state_fixed_size",
              "state_resume", "state_not_mutated")
FORWARD_ITEMS = ("scaffold_present", "normalization", "causality", "decay_parallel", "hybrid_lm")
# What the grader itself writes beside each results.json.
OWN_FILES = {RESULTS_FILE, EXECUTED_NOTEBOOK, EXECUTED_PAGE, WRITTEN_INPUTS, GRADER_ERRORS, SCAFFOLD_SOURCE, RAW_OUTPUTS,
             SCREENING}


# ----------------------------------------------------------------------------- fixtures

class Listener:
    """A TCP and a UDP socket on the host's 127.0.0.1 that record whatever reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.received: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.tcp, self.udp], [], [], 0.1)
            for sock in ready:
                if sock is self.tcp:
                    connection, peer = sock.accept()
                    with connection:
                        connection.settimeout(1)
                        try:
                            data = connection.recv(65536)
                        except OSError:
                            data = b""
                    self.received.append(f"TCP connection from {peer}: {data!r}")
                else:
                    data, peer = sock.recvfrom(65536)
                    self.received.append(f"UDP datagram from {peer}: {data!r}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.tcp.close()
        self.udp.close()


Snapshot = dict[str, tuple[int, int]]


def snapshot(root: Path, skip_dirs: set[str] = SNAPSHOT_SKIP) -> Snapshot:
    """Relative path -> (mtime_ns, size) of every file and folder under ``root``."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        for name in dirs + files:
            path = Path(folder) / name
            info = path.lstat()
            found[str(path.relative_to(root))] = (info.st_mtime_ns, info.st_size)
    return found


@dataclass
class World:
    """Everything the tests read: the batch's results and the state around it."""

    outcome: BatchOutcome
    out_dir: Path
    results: dict[str, dict]                       # results.json per submission id
    executed: dict[str, bytes | None]              # executed.ipynb per submission id
    submissions: dict[str, bytes]                  # the submitted files
    secrets: dict[str, str]                        # what a leak would show -> where it comes from
    before: dict[str, Snapshot]
    after: dict[str, Snapshot]
    canary: tuple[bytes, int]
    canary_after: tuple[bytes, int]
    received: list[str] = field(default_factory=list)


def _items(result: dict) -> dict[str, dict]:
    return items_by_id(result)


def _secret_markers(assignment: Assignment, honest_canary: str) -> dict[str, str]:
    """Strings that appear only in hidden material: if one shows up in a submission's results
    or executed notebook, that submission read what it must not."""
    master = assignment.master
    delta_rule = adv.cell_by_id(master, "explain-delta-rule")
    answer = adv.cells.parse_written_answer(delta_rule).answer
    checks_source = (ROOT / "grader" / "checks" / "linear_attention" / "cases.py").read_text()
    rubric_source = assignment.rubric_path.read_text()
    markers = {"IDENTIFYING_SHAPES": "the hidden checks", answer[:60]: "the reference notebook",
               "Reports the crossover the notebook measured": "the rubric's criteria",
               honest_canary: "another submission"}
    assert "IDENTIFYING_SHAPES" in checks_source and "Reports the crossover the notebook measured" in rubric_source
    return markers


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, assignment: Assignment) -> World:
    rubric = assignment.rubric.with_limits(**LIMITS)
    sandbox = make_sandbox(rubric.limits, allow_unsandboxed=False)
    root = tmp_path_factory.mktemp("adversarial")
    submissions, out_dir, scratch = (root / n for n in ("submissions", "out", "scratch"))
    for folder in (submissions, out_dir, scratch):
        folder.mkdir()
    canary = Path("/tmp") / f"g2c-adversarial-canary-{uuid.uuid4().hex}"
    canary.write_text("the host's /tmp: no submission may touch this file")
    listener = Listener()
    try:
        honest_canary = f"HONEST-SECRET-{uuid.uuid4().hex}"
        honest = adv.baseline(assignment.master)
        honest.cells.append(nbformat.v4.new_markdown_cell(honest_canary, id="honest-canary"))
        adv.write_submission(honest, submissions / f"{HONEST}.ipynb")
        targets = adv.Targets(assignment.master, out_dir, submissions / f"{HONEST}.ipynb", canary,
                              (ROOT / "grader" / "checks" / "linear_attention" / "cases.py", assignment.master_path,
                               assignment.rubric_path), listener.port, scratch)
        adv.write_submission(adv.control_no_step(targets), submissions / f"{CONTROL}.ipynb")
        for name, build in ATTACKS.items():
            adv.write_submission(build(targets), submissions / f"{name}.ipynb")

        # What a submission may try to overwrite in the out dir before the batch gets there.
        (out_dir / "bystander").mkdir()
        (out_dir / "bystander" / "results.json").write_text('{"score": 1}')
        (out_dir / "sentinel.txt").write_text("not the submissions'")
        roots = {"repo": ROOT, "shared": SHARED, "out": out_dir, "submissions": submissions}
        before = {name: snapshot(path) for name, path in roots.items()}
        canary_before = (canary.read_bytes(), canary.stat().st_mtime_ns)

        outcome = grade_batch(discover([submissions]), assignment, sandbox, rubric, out_dir, 2,
                              progress=io.StringIO())

        after = {name: snapshot(path) for name, path in roots.items()}
        canary_after = (canary.read_bytes(), canary.stat().st_mtime_ns)
    finally:
        listener.close()
        canary.unlink(missing_ok=True)
    ids = [p.stem for p in submissions.glob("*.ipynb")]
    submitted = {i: (submissions / f"{i}.ipynb").read_bytes()[:2**20] for i in ids}
    (submissions / "huge_notebook.ipynb").unlink()  # 200 MB: not kept with pytest's temp folders
    return World(
        outcome=outcome, out_dir=out_dir,
        results={i: json.loads((out_dir / i / "results.json").read_text()) for i in ids
                 if (out_dir / i / "results.json").is_file()},
        executed={i: (out_dir / i / "executed.ipynb").read_bytes() if (out_dir / i / "executed.ipynb").is_file()
                  else None for i in ids},
        submissions=submitted,
        secrets=_secret_markers(assignment, honest_canary),
        before=before, after=after, canary=canary_before, canary_after=canary_after,
        received=list(listener.received))


# ----------------------------------------------------------------------------- the batch as a whole

def test_the_batch_completes_without_internal_errors(world: World) -> None:
    expected = {HONEST, CONTROL, *ATTACKS}
    assert set(world.results) == expected
    assert len(world.outcome.results) == len(expected)
    assert world.outcome.internal_errors == 0
    for name, result in world.results.items():
        assert "internal grader error" not in result["output"], name
    # Every file the batch wrote can be uploaded to Gradescope as it is.
    assert gradescope_valid(world.out_dir, expected) == len(expected)   # not the pre-seeded bystander


def test_the_honest_submission_earns_exactly_what_its_cells_give(world: World) -> None:
    """Graded among the attacks, the honest baseline (the master's cells without the training
    exercises and without most written answers) passes every other item with full points:
    nothing in the batch touched its grade. The baseline really is a full-marks scaffold and
    Exercises 1, 3 (its functions), 4 and 5: the attacks compete with that."""
    items = _items(world.results[HONEST])
    not_given = {name for name, test in items.items() if set(test["tags"]) & {"written", "training"}}
    assert {name for name, test in items.items() if test["status"] != "passed"} == not_given
    assert all(test["score"] == test["max_score"] for name, test in items.items() if name not in not_given)
    assert world.results[HONEST]["score"] == sum(items[name]["max_score"] for name in set(items) - not_given)
    assert set(FORWARD_ITEMS + STEP_ITEMS) <= set(items) - not_given


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_no_attack_beats_the_honest_baseline(world: World, attack: str) -> None:
    assert world.results[attack]["score"] <= world.results[HONEST]["score"]


@pytest.mark.parametrize("cheat", CHEATS)
def test_cheats_gain_nothing_over_the_same_code_without_the_cheat(world: World, cheat: str) -> None:
    """On the layer's items. (The control's notebook stops where Exercise 1's sweep calls its
    unwritten step, so the notebook and Exercise 1 items are not a comparison with the cheat.)"""
    control, cheated = _items(world.results[CONTROL]), _items(world.results[cheat])
    better = {name: (control[name]["score"], test["score"]) for name, test in cheated.items()
              if name in la_checks.LAYER_ITEMS and test["score"] > control[name]["score"]}
    assert not better, f"{cheat} gained points (control, cheat): {better}"
    for name in STEP_ITEMS:
        assert cheated[name]["status"] != "passed", f"{cheat} passed {name} without a step"


def _sandbox_writes(root: Path, before: Snapshot, after: Snapshot) -> list[str]:
    """Changes under ``root`` that a submission made: files owned by a sandbox uid, or holding
    the attacks' PLANTED marker, or named like the files they plant. The repository and
    /work/shared may also be edited by people while the batch runs; those edits are not
    failures (the test warns about them)."""
    found = []
    for relative in sorted(set(before) ^ set(after) | {k for k in after if before.get(k) != after[k]}):
        path = root / relative
        if "planted" in relative.lower():
            found.append(relative)
        elif path.is_file() and not path.is_symlink():
            uid = path.stat().st_uid
            with path.open("rb") as handle:
                marked = b"PLANTED" in handle.read(2**20)
            if marked or SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SLOTS:
                found.append(relative)
    return found


def test_nothing_outside_a_submissions_scratch_changed(world: World) -> None:
    for name, root in (("repo", ROOT), ("shared", SHARED)):
        before, after = world.before[name], world.after[name]
        assert _sandbox_writes(root, before, after) == [], f"a submission wrote into {root}"
        others = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if others:
            warnings.warn(f"{root} changed during the batch, not by a submission: {others[:10]}", stacklevel=1)
    assert world.after["submissions"] == world.before["submissions"]
    assert world.canary_after == world.canary
    out_before, out_after = world.before["out"], world.after["out"]
    assert {k: v for k, v in out_after.items() if k in out_before} == out_before
    submission_ids = set(world.results)
    for entry in out_after:
        top, _, rest = entry.partition("/")
        if top in ("bystander", "sentinel.txt"):
            assert entry in out_before, f"{entry} appeared in the out dir"
            continue
        assert top in submission_ids, f"unexpected {entry} in the out dir"
        assert rest == "" or rest in OWN_FILES, f"unexpected {entry} in the out dir"


def test_no_network_traffic_reached_the_host(world: World) -> None:
    assert world.received == []


@pytest.mark.parametrize("submission", sorted({*ATTACKS, CONTROL}))
def test_no_hidden_material_or_other_submission_leaks(world: World, submission: str) -> None:
    texts = {"results.json": json.dumps(world.results[submission]),
             "executed.ipynb": (world.executed[submission] or b"").decode("utf-8", "replace")}
    for marker, origin in world.secrets.items():
        assert marker not in world.submissions[submission].decode("utf-8", "replace"), "test bug"
        for where, text in texts.items():
            assert marker not in text, f"{submission}'s {where} shows {origin}"


# ----------------------------------------------------------------------------- one test per attack

def _item(world: World, submission: str, name: str) -> dict:
    return _items(world.results[submission])[name]


def _output(world: World, submission: str) -> str:
    return world.results[submission]["output"]


def test_cell_infinite_loop_is_interrupted_and_later_cells_still_run(world: World) -> None:
    runs = _item(world, "cell_infinite_loop", "notebook_runs")
    assert runs["status"] == "failed" and "CellTimeoutError" in runs["output"]
    assert _item(world, "cell_infinite_loop", "bill_mha_kv_cache")["status"] == "passed"


def test_cell_ignoring_signals_is_stopped(world: World) -> None:
    runs = _item(world, "cell_signal_tricks", "notebook_runs")
    assert runs["status"] == "failed"
    assert "CellTimeoutError" in runs["output"] and "did not run" in runs["output"]


def test_cell_alarm_kills_only_its_kernel(world: World) -> None:
    runs = _item(world, "cell_alarm", "notebook_runs")
    assert runs["status"] == "failed" and "the kernel died" in runs["output"]


def test_memory_bomb_is_stopped(world: World) -> None:
    assert "MemoryError" in _item(world, "memory_bomb", "notebook_runs")["output"]
    assert "memory limit 2.0 GiB reached" in _output(world, "memory_bomb")


def test_fork_bomb_is_stopped(world: World) -> None:
    assert _item(world, "cell_fork_bomb", "notebook_runs")["status"] == "failed"
    assert "process limit 64 reached" in _output(world, "cell_fork_bomb")


def test_output_flood_is_truncated(world: World) -> None:
    assert "was truncated at 1024 KiB per cell" in _output(world, "output_flood")
    assert len(world.executed["output_flood"] or b"") < 8 * 2**20
    assert len(json.dumps(world.results["output_flood"])) < 2**20
    assert all(_item(world, "output_flood", name)["status"] == "passed" for name in FORWARD_ITEMS + STEP_ITEMS)


def test_filling_the_disk_is_stopped_and_the_probe_still_runs(world: World) -> None:
    assert "disk limit 256.0 MiB reached in scratch" in _output(world, "disk_filler")
    assert _item(world, "disk_filler", "notebook_runs")["status"] != "passed"
    assert all(_item(world, "disk_filler", name)["status"] == "passed" for name in FORWARD_ITEMS + STEP_ITEMS)


def test_sys_exit_and_os_exit_in_cells(world: World) -> None:
    runs = _item(world, "cell_exits", "notebook_runs")["output"]
    assert "SystemExit" in runs and "the kernel died" in runs


@pytest.mark.parametrize("attack", ["cell_kill_parent", "cell_kill_all"])
def test_killing_the_notebook_driver_is_reported(world: World, attack: str) -> None:
    assert "the notebook driver was killed before it finished" in _output(world, attack)
    runs = _item(world, attack, "notebook_runs")
    assert runs["status"] == "failed" and "did not run" in runs["output"]


def test_endless_step_still_lets_the_probe_grade_forward(world: World) -> None:
    for name in FORWARD_ITEMS:
        assert _item(world, "probe_infinite_step", name)["status"] == "passed", name
    assert "used more than 2 CPU seconds" in _item(world, "probe_infinite_step", "equivalence")["output"]
    for name in STEP_ITEMS:
        assert _item(world, "probe_infinite_step", name)["status"] == "failed", name


def test_step_that_kills_the_probe_still_lets_it_grade_forward(world: World) -> None:
    for name in FORWARD_ITEMS:
        assert _item(world, "probe_exit_in_step", name)["status"] == "passed", name
    equivalence = _item(world, "probe_exit_in_step", "equivalence")
    assert equivalence["status"] == "failed"
    assert "exited with status 3" in equivalence["output"] or "supervisor exited" in equivalence["output"]


def test_signal_tricks_in_the_scaffold_change_nothing(world: World) -> None:
    honest = _items(world.results[HONEST])
    for name in FORWARD_ITEMS + STEP_ITEMS:
        assert _item(world, "probe_signal_tricks", name)["status"] == honest[name]["status"], name


def test_sys_exit_in_the_scaffold_fails_only_the_import(world: World) -> None:
    present = _item(world, "probe_sys_exit", "scaffold_present")
    assert present["status"] == "error" and "SystemExit" in present["output"]
    assert _item(world, "probe_sys_exit", "bill_mha_kv_cache")["status"] == "passed"


def test_fork_bomb_in_the_scaffold_is_contained(world: World) -> None:
    assert _item(world, "probe_fork_bomb", "scaffold_present")["status"] == "error"
    assert _item(world, "probe_fork_bomb", "notebook_runs")["status"] == "failed"


def test_forged_execution_report_is_not_believed(world: World) -> None:
    runs = _item(world, "forge_execution_report", "notebook_runs")
    assert runs["status"] == "failed"
    notes = _output(world, "forge_execution_report")
    assert "REAL-FAILURE" in runs["output"] or "report was changed after the driver wrote it" in notes
    executed = world.executed["forge_execution_report"]
    if executed is not None:  # kept only if it is the driver's own (the forger may lose the race)
        assert b"FORGED-EXECUTED-NOTEBOOK" not in executed and b'"hybrid-model"' in executed
    # The kernel could neither write to the driver's descriptors, open its memory nor ptrace it.
    assert "VOUCHED [] False" in _item(world, "forge_execution_report", "bill_mha_kv_cache")["output"]


def test_forged_probe_outputs_are_not_believed(world: World) -> None:
    for name in STEP_ITEMS:
        assert _item(world, "forge_probe_outputs", name)["status"] == "failed", name
    equivalence = _item(world, "forge_probe_outputs", "equivalence")["output"]
    assert "NotImplementedError" in equivalence
    # A worker could neither write to the supervisor's descriptors, open its memory nor ptrace it.
    assert "VOUCHED [] False" in equivalence


def test_writes_outside_scratch_and_network_are_refused(world: World) -> None:
    runs = _item(world, "escape_writes", "notebook_runs")["output"]
    assert "WRITES:" in runs and "WROTE" not in runs
    assert "No such file or directory" in runs or "Read-only file system" in runs


def test_hidden_material_cannot_be_read(world: World) -> None:
    bill = _item(world, "escape_reads", "bill_mha_kv_cache")["output"]
    assert "could not read" in bill and "READ " not in bill and "IMPORTED" not in bill
    forward = _item(world, "escape_reads", "normalization")["output"]
    assert "could not read" in forward and "READ " not in forward


@pytest.mark.parametrize("attack", ["patch_harness_toplevel", "patch_harness_in_forward", "patch_libraries"])
def test_monkeypatching_gains_nothing(world: World, attack: str) -> None:
    for name in STEP_ITEMS:
        assert _item(world, attack, name)["status"] != "passed", name


def test_a_forged_hybrid_report_does_not_pass_a_detached_decay(world: World) -> None:
    """The worker reports every gradient present and finite (which once passed hybrid_lm); the
    gradient arrays it exported show that none reached gamma_logit. Its forward's numbers are
    right, so the forward items pass, as the control's do."""
    hybrid = _item(world, "forge_hybrid_report", "hybrid_lm")
    assert hybrid["status"] == "failed", hybrid
    assert "no gradient reached blocks.0.attn.gamma_logit" in hybrid["output"], hybrid
    assert _item(world, CONTROL, "hybrid_lm")["status"] == "passed"
    for name in (n for n in FORWARD_ITEMS if n != "hybrid_lm"):
        assert _item(world, "forge_hybrid_report", name)["status"] == "passed", name


def test_step_that_keeps_history_outside_its_state_is_caught_where_it_resumes(world: World) -> None:
    for cheat in ("step_history_on_state", "step_history_in_files"):
        resume = _item(world, cheat, "state_resume")["output"]
        assert "after token 8, in a fresh process" in resume, resume
        equivalence = _item(world, cheat, "equivalence")["output"]
        assert "is where the probe went on from the state your step returned" in equivalence, equivalence
        # A step that ignores the state it is given is no recurrence: what it does with a decay is
        # not judged, state_resume charges the cause.
        decay = _item(world, cheat, "decay_recurrent")
        assert decay["status"] == "error" and "step ignores the state it is given" in decay["output"], decay


def test_probe_workers_can_leave_nothing_behind(world: World) -> None:
    """No file (scratch, /tmp, /dev/shm), no exec, no System V IPC; and the probe said the
    syscall filter was in place (no note says otherwise)."""
    equivalence = _item(world, "probe_leaves_traces", "equivalence")["output"]
    assert "TRACES []" in equivalence, equivalence
    assert "without its seccomp filter" not in _output(world, "probe_leaves_traces")


def test_redefining_provided_code_does_not_change_the_probe(world: World) -> None:
    honest = _items(world.results[HONEST])
    for name in FORWARD_ITEMS + STEP_ITEMS:
        assert _item(world, "redefine_provided", name)["status"] == honest[name]["status"], name
    notes = _output(world, "redefine_provided")
    assert "redefinition of provided EPS ignored" in notes
    assert "redefinition of provided feature_map ignored" in notes


@pytest.mark.parametrize("attack", ["scaffold_missing", "scaffold_renamed"])
def test_missing_or_renamed_scaffold(world: World, attack: str) -> None:
    present = _item(world, attack, "scaffold_present")
    assert present["status"] == "error" and "no cell defines `class LinearAttention`" in present["output"]


def test_duplicated_scaffold_grades_the_last_copy(world: World) -> None:
    notes = _output(world, "scaffold_duplicated")
    assert "defined in 2 cells" in notes and "duplicate cell id 'linear-attention'" in notes
    assert _item(world, "scaffold_duplicated", "equivalence")["status"] == "failed"


@pytest.mark.parametrize("attack", ["not_utf8", "binary_junk"])
def test_undecodable_files_are_refused(world: World, attack: str) -> None:
    assert "not UTF-8" in _output(world, attack)
    assert world.results[attack]["score"] == 0


def test_huge_notebook_is_refused(world: World) -> None:
    assert "over the 50 MiB limit" in _output(world, "huge_notebook")
    assert world.results["huge_notebook"]["score"] == 0


def test_prompt_injection_stays_pending_review(world: World) -> None:
    injected, honest = _items(world.results["prompt_injection"]), _items(world.results[HONEST])
    written = injected["written_ex5_memory_bill"]
    assert written["status"] == "pending_review" and written["score"] == 0
    for name, test in injected.items():
        if name != "written_ex5_memory_bill":
            assert (test["status"], test["score"]) == (honest[name]["status"], honest[name]["score"]), name
