"""Isolation for the second assignment: the same trust properties hold for a checks module
that only calls functions (the harness's ``call`` handler, no driver file).

The hostile notebooks of ``tests/adversarial_hyena.py`` and the honest master are graded in
ONE batch through the real ``grade_batch`` (bubblewrap, two workers, reduced limits). Each
escape attempt must cost nothing and reach nothing; each function that hangs, exits, forks
or eats memory must cost its own items only; a typed-in result must lose its item.
"""
from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

import adversarial_hyena as adv
from conftest import ROOT, gradescope_valid, items_by_id
from grader.assignment import Assignment
from grader.batch import BatchOutcome, grade_batch
from grader.intake import discover
from grader.sandbox.factory import make_sandbox
from grader.harness.cpu_time import AFTER_HUNG_S
from test_adversarial import LIMITS, OWN_FILES, SHARED, Listener, Snapshot, _sandbox_writes, snapshot

ASSIGNMENT = Assignment("linear_attention_hyena")
IDLE_TIMEOUT_S = 2   # no attack here waits on purpose but the sleeping one
HONEST = "honest"


@dataclass
class World:
    outcome: BatchOutcome
    out_dir: Path
    results: dict[str, dict]
    texts: dict[str, str]            # results.json and the executed notebook's outputs
    before: dict[str, Snapshot]
    after: dict[str, Snapshot]
    canary: tuple[bytes, int]
    canary_after: tuple[bytes, int]
    received: list[str]
    markers: dict[str, str]          # what a leak would show -> where it comes from


def _outputs(executed: Path) -> str:
    """What the cells of an executed notebook printed or raised (not its source, which holds
    the attack's own words)."""
    if not executed.is_file():
        return ""
    notebook = nbformat.read(str(executed), as_version=4)
    return json.dumps([cell.get("outputs", []) for cell in notebook.cells])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    rubric = ASSIGNMENT.rubric.with_limits(**LIMITS, idle_timeout_s=IDLE_TIMEOUT_S)
    sandbox = make_sandbox(rubric.limits, allow_unsandboxed=False)
    root = tmp_path_factory.mktemp("adversarial-hyena")
    submissions, out_dir = root / "submissions", root / "out"
    submissions.mkdir()
    out_dir.mkdir()
    canary = Path("/tmp") / f"g2c-adversarial-canary-{uuid.uuid4().hex}"
    canary.write_text("the host's /tmp: no submission may touch this file")
    checks_file = ROOT / "grader" / "checks" / "linear_attention_hyena" / "__init__.py"
    honest_marker = f"HONEST-SECRET-{uuid.uuid4().hex}"
    listener = Listener()
    try:
        honest = nbformat.from_dict(json.loads(json.dumps(ASSIGNMENT.master)))
        honest.cells.append(nbformat.v4.new_markdown_cell(honest_marker, id="honest-canary"))
        nbformat.write(honest, str(submissions / f"{HONEST}.ipynb"))
        targets = adv.Targets(ASSIGNMENT.master, out_dir, submissions / f"{HONEST}.ipynb", canary,
                              (checks_file, ASSIGNMENT.master_path, ASSIGNMENT.rubric_path), listener.port,
                              root)
        for name, (build, _) in adv.ATTACKS.items():
            nbformat.write(build(targets), str(submissions / f"{name}.ipynb"))
        (out_dir / "sentinel.txt").write_text("not the submissions'")
        roots = {"repo": ROOT, "shared": SHARED, "out": out_dir, "submissions": submissions}
        before = {name: snapshot(path) for name, path in roots.items()}
        canary_before = (canary.read_bytes(), canary.stat().st_mtime_ns)
        outcome = grade_batch(discover([submissions]), ASSIGNMENT, sandbox, rubric, out_dir, 2,
                              progress=io.StringIO())
        after = {name: snapshot(path) for name, path in roots.items()}
        canary_after = (canary.read_bytes(), canary.stat().st_mtime_ns)
    finally:
        listener.close()
        canary.unlink(missing_ok=True)
    ids = [HONEST, *adv.ATTACKS]
    results = {i: json.loads((out_dir / i / "results.json").read_text()) for i in ids
               if (out_dir / i / "results.json").is_file()}
    texts = {i: json.dumps(results.get(i)) + _outputs(out_dir / i / "executed.ipynb") for i in ids}
    # Strings only hidden material holds (checked below to be absent from every submission).
    reference = ASSIGNMENT.reference_answers["ex11_4_equivalence_proof"].answer[:60]
    markers = {checks_file.read_text().splitlines()[0]: "the hidden checks", reference: "the reference notebook",
               honest_marker: "another submission"}
    return World(outcome, out_dir, results, texts, before, after, canary_before, canary_after,
                 list(listener.received), markers)


def test_the_batch_completes_and_the_honest_master_earns_every_autograded_point(world: World) -> None:
    assert set(world.results) == {HONEST, *adv.ATTACKS}
    assert world.outcome.internal_errors == 0
    assert gradescope_valid(world.out_dir, set(world.results)) == len(world.results)
    honest = items_by_id(world.results[HONEST])
    failed = {name: t["output"] for name, t in honest.items() if "written" not in t["tags"] and t["status"] != "passed"}
    assert not failed


@pytest.mark.parametrize("attack", sorted(adv.ATTACKS))
def test_each_attack_loses_exactly_its_own_items(world: World, attack: str) -> None:
    honest, attacked = items_by_id(world.results[HONEST]), items_by_id(world.results[attack])
    lost = {name for name, t in attacked.items() if "written" not in t["tags"]
            and t["score"] < honest[name]["score"]}
    expected = adv.ATTACKS[attack][1]
    assert lost == expected, {name: attacked[name]["output"][:300] for name in lost ^ expected}
    assert world.results[attack]["score"] <= world.results[HONEST]["score"]


@pytest.mark.parametrize("attack", sorted(adv.ATTACKS))
def test_no_hidden_material_or_other_submission_leaks(world: World, attack: str) -> None:
    for marker, origin in world.markers.items():
        assert marker not in world.texts[attack], f"{attack} shows {origin}"
    for word in ("READ /", "IMPORTED ", "WROTE ", "CONNECTED", "REACHED "):
        assert word not in world.texts[attack], f"{attack}: {word}"


def test_nothing_outside_a_submissions_scratch_changed_and_no_traffic(world: World) -> None:
    for name, root in (("repo", ROOT), ("shared", SHARED)):
        assert _sandbox_writes(root, world.before[name], world.after[name]) == [], f"a submission wrote into {root}"
    assert world.after["submissions"] == world.before["submissions"]
    assert world.canary_after == world.canary
    assert world.received == []
    out_before, out_after = world.before["out"], world.after["out"]
    assert {k: v for k, v in out_after.items() if k in out_before} == out_before
    for entry in out_after:
        top, _, rest = entry.partition("/")
        assert top == "sentinel.txt" or (top in world.results and (rest == "" or rest in OWN_FILES)), entry


def test_a_hung_or_dead_function_is_reported_where_it_happened(world: World) -> None:
    hung = items_by_id(world.results["hang_in_one_function"])["toeplitz_oracle"]["output"]
    assert "used more than 2 CPU seconds" in hung or "hung or crashed" in hung, hung
    died = items_by_id(world.results["exit_in_one_function"])["gla_mask"]["output"]
    assert "exited with status 3" in died or "killed" in died, died


def test_a_sleeping_function_is_stopped_as_hung_and_not_graded_again(world: World) -> None:
    """Its cell and its probe cases are stopped after the idle limit, saying so (a later one of
    the same run after cpu_time.AFTER_HUNG_S, saying that an earlier call waited out the limit),
    and neither stage is retried (a wall-clock backstop would have been: a retry is for a
    starved machine)."""
    result = world.results["sleep_in_one_function"]
    hung = (f"stopped as hung: it made no CPU progress for {IDLE_TIMEOUT_S} s",
            f"stopped as hung: it made no CPU progress for {AFTER_HUNG_S:g} s while it could have run (sleeping or "
            f"waiting?), as an earlier call was stopped after {IDLE_TIMEOUT_S} s")
    items = items_by_id(result)
    assert any(said in items["retnet_mask"]["output"] for said in hung), items["retnet_mask"]["output"]
    assert hung[0] in items["notebook_runs"]["output"], items["notebook_runs"]["output"]
    everything = json.dumps(result)
    assert "graded again once" not in everything and "wall-clock backstop" not in everything, result["output"]
