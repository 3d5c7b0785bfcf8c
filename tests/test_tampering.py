"""Attempts on the grader read from a submission's code (grader.checks.tampering), measured
both ways: what the attack corpora must show a TA, and what honest code must not, with the
figures printed. They change no score: a graded batch's pages show them (test_pages)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
import pytest

import adversarial
import adversarial_hyena
import inline_assignment
from conftest import ROOT
from test_observed_runs import FAKE_CLOCK, PREFIXES
from grader import cells
from grader.assignment import Assignment
from grader.checks.tampering import KINDS, attempts, import_aliases, submission_attempts
from grader.load import load_submission

HONEST_FOLDERS = {"linear_attention": ("scaffolds", "sweeps", "recalls", "decay_inspections", "trainings"),
                  "linear_attention_hyena": ("hyena_corpus",)}

# attack -> the kinds its code shows. The other attacks hold no construct to read: they are
# stopped by the sandbox's limits (a loop, a memory or output flood), judged by their items (a
# history kept on the state, an empty result, a scaffold renamed or missing, the provided cells
# redefined), or flagged by the written stage (a prompt injection); NOT_SHOWN says which.
SHOWN = {
    "cell_signal_tricks": {"process_control"}, "cell_alarm": {"process_control"},
    "cell_fork_bomb": {"process_control"}, "cell_exits": {"process_control"},
    "cell_kill_parent": {"process_control"}, "cell_kill_all": {"process_control"},
    "probe_exit_in_step": {"process_control"}, "probe_sys_exit": {"process_control"},
    "probe_signal_tricks": {"process_control"}, "probe_fork_bomb": {"process_control"},
    "forge_execution_report": {"grader_files", "process_control"},
    "forge_probe_outputs": {"grader_files", "process_control"},
    "escape_writes": {"grader_files"}, "escape_reads": {"grader_files"}, "patch_libraries": {"library_patch"},
    "patch_harness_toplevel": {"frame_access"}, "patch_harness_in_forward": {"frame_access"},
    "patch_harness_at_import": {"frame_access"}, "forge_hybrid_report": {"frame_access"},
    "step_history_in_files": {"grader_files"}, "probe_leaves_traces": {"grader_files", "process_control"},
}
NOT_SHOWN = {
    "cell_infinite_loop": "stopped at its limit", "memory_bomb": "stopped at its limit",
    "output_flood": "stopped at its limit", "disk_filler": "stopped at its limit",
    "probe_infinite_step": "stopped at its limit", "step_history_on_state": "judged by its items",
    "redefine_provided": "the grader's copies replace them", "scaffold_missing": "judged by its items",
    "scaffold_duplicated": "judged by its items", "scaffold_renamed": "judged by its items",
    "prompt_injection": "flagged by the written stage", "huge_notebook": "refused at load",
    "not_utf8": "refused at load", "binary_junk": "refused at load",
}
HYENA_SHOWN = {"escape_reads": {"grader_files"}, "escape_writes": {"grader_files"},
               "reach_the_supervisor": {"grader_files", "process_control"}, "exit_in_one_function": {"process_control"},
               "fork_bomb_in_one_function": {"process_control"}}
INLINE_SHOWN = {"patched_comparisons": {"library_patch"}, "always_equal": {"comparison_override"},
                "repr_prints_expected": {"comparison_override"},
                "silenced_traceback": {"traceback_silenced", "library_patch", "process_control"},
                "raises_to_skip": {"process_control"}, "swapped_module_attributes": {"library_patch"},
                "reads_expected_from_frames": {"frame_access"}, "frames_table": {"frame_access"},
                "frames_helper": {"frame_access"}, "frames_case_source": {"frame_access"},
                "rebinds_provided_helper": {"frame_access"}, "scans_own_memory": {"grader_files"},
                "wraps_the_recorder": {"frame_access", "grader_files"}}
INLINE_NOT_SHOWN = {"empty_results": "the comparison's layout rule fails it"}
OBSERVED_SHOWN = {"fake_clock": (FAKE_CLOCK, {"library_patch"}),
                  "closure": (PREFIXES["the original taken from the wrapper's closure"], {"frame_access"})}


def kinds_of(found) -> set[str]:
    return {attempt.kind for attempt in found}


@pytest.fixture(scope="module")
def attack_findings() -> dict[str, set[str]]:
    """Each attack of the corpora, built in memory, and the kinds its reading shows."""
    found: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for assignment_name, registry in (("linear_attention", adversarial.ATTACKS),
                                          ("linear_attention_hyena", {n: b for n, (b, _) in
                                                                       adversarial_hyena.ATTACKS.items()})):
            assignment = Assignment(assignment_name)
            targets = adversarial.Targets(assignment.master, tmp / "out", tmp / "honest.ipynb", tmp / "canary",
                                          (tmp / "secret",), 9, tmp)
            for name, build in registry.items():
                if name in NOT_SHOWN and name not in HYENA_SHOWN:
                    continue
                path = adversarial.write_submission(build(targets), tmp / f"{assignment_name}-{name}.ipynb")
                submission = load_submission(path, name, assignment.template, 50 * 2**20)
                found[f"{assignment_name}/{name}"] = kinds_of(submission_attempts(submission, assignment.template))
    inline_aliases = import_aliases(cells.source(c) for c in inline_assignment.master_notebook().cells
                                    if c.cell_type == "code")
    for name, (scaffold, _) in {**inline_assignment.HOSTILE, **inline_assignment.FOURTH_ROUND}.items():
        found[f"inline/{name}"] = kinds_of(attempts([("scaffold", scaffold)], inline_aliases))
    master_aliases = import_aliases(cells.source(c) for c in Assignment("linear_attention").master.cells
                                    if c.cell_type == "code")
    for name, (code, _) in OBSERVED_SHOWN.items():   # snippets of a function's body, its lines as one block
        block = "\n".join(line.strip() for line in code.splitlines())
        found[f"observed/{name}"] = kinds_of(attempts([("exercise cell", block)], master_aliases))
    return found


def test_every_attack_with_a_construct_shows_it(attack_findings):
    expected = {**{f"linear_attention/{n}": k for n, k in SHOWN.items()},
                **{f"linear_attention_hyena/{n}": k for n, k in HYENA_SHOWN.items()},
                **{f"inline/{n}": k for n, k in INLINE_SHOWN.items()},
                **{f"observed/{n}": k for n, (_, k) in OBSERVED_SHOWN.items()}}
    missed = {name: (sorted(kinds), sorted(attack_findings.get(name, set()))) for name, kinds in expected.items()
              if not kinds <= attack_findings.get(name, set())}
    print(f"\nattacks shown to the TA: {len(expected) - len(missed)} of {len(expected)} with a construct to read; "
          f"{len(NOT_SHOWN) + len(INLINE_NOT_SHOWN)} others hold none (stopped by limits, judged by items, "
          "refused at load, flagged by the written stage)")
    assert not missed, f"attacks whose reading misses an expected kind (expected, found): {missed}"
    assert not set(SHOWN) & set(NOT_SHOWN) and set(SHOWN) | set(NOT_SHOWN) >= set(adversarial.ATTACKS)
    assert set(INLINE_SHOWN) | set(INLINE_NOT_SHOWN) == {*inline_assignment.HOSTILE, *inline_assignment.FOURTH_ROUND}


def honest_sources() -> list[tuple[str, str, dict[str, str]]]:
    """(name, code, aliases) of the honest corpora: every correct and mistaken solution of both
    assignments, the exercise corpora, the masters, the student notebooks and the examples."""
    sources = []
    for name, folders in HONEST_FOLDERS.items():
        assignment = Assignment(name)
        aliases = import_aliases(cells.source(c) for c in assignment.master.cells if c.cell_type == "code")
        for folder in folders:
            sources += [(f"{folder}/{path.name}", path.read_text(), aliases)
                        for path in sorted((ROOT / "tests" / folder).glob("*.py"))]
        notebooks = [assignment.master_path, assignment.template_path,
                     *sorted((ROOT / "examples" / "submissions" / name).rglob("*.ipynb"))]
        for path in notebooks:
            notebook = nbformat.read(str(path), 4)
            sources += [(f"{path.name}, code cell {number}", cells.source(cell), aliases) for number, cell in
                        enumerate((c for c in notebook.cells if c.cell_type == "code"), 1)]
        sources += [(str(path.relative_to(ROOT)), path.read_text(), aliases)
                    for path in sorted((ROOT / "examples" / "submissions" / name).rglob("*.py"))]
    inline_aliases = import_aliases(cells.source(c) for c in inline_assignment.master_notebook().cells
                                    if c.cell_type == "code")
    sources += [(f"inline/{name}", scaffold, inline_aliases)
                for name, (scaffold, _) in {**inline_assignment.CORRECT, **inline_assignment.MISTAKES}.items()]
    return sources


def test_honest_code_shows_no_attempt():
    sources = honest_sources()
    shown = {name: [a.describe() for a in attempts([(name, code)], aliases)] for name, code, aliases in sources}
    shown = {name: found for name, found in shown.items() if found}
    print(f"\nhonest sources with an attempt shown: {len(shown)} of {len(sources)} "
          f"(correct and mistaken solutions, exercise corpora, masters, templates, examples)")
    assert len(sources) > 400 and not shown, shown


def test_an_attempt_names_its_cell_line_code_and_what_it_tries():
    notebook_code = ["import numpy as np\nimport torch\n", "x = 1\n\n\ndef f(a):\n    np.allclose = lambda *a, **k: True\n"
                                                            "    return a\n"]
    found = attempts([("code cell 2", notebook_code[1])], import_aliases(notebook_code))
    assert [a.to_json() for a in found] == [{"kind": "library_patch", "where": "code cell 2, line 5",
                                             "code": "np.allclose = lambda *a, **k: True",
                                             "detail": "sets numpy.allclose"}]
    assert found[0].describe() == ("code cell 2, line 5: replaces part of a library (sets numpy.allclose): "
                                   "np.allclose = lambda *a, **k: True")
    configured = "import torch\ntorch.backends.cudnn.benchmark = True\nimport matplotlib.pyplot as plt\n" \
                 "plt.rcParams['figure.dpi'] = 120\n"
    assert attempts([("code cell 1", configured)]) == [], "configuration is no patch"
    assert set(KINDS) >= {a.kind for a in found}


def test_only_the_students_cells_are_read(tmp_path):
    """The assignment's own cells (provided code, the template) are not the student's: a copy of
    the master as submitted shows nothing, and one line added shows exactly that line."""
    assignment = Assignment("linear_attention")
    notebook = nbformat.read(str(assignment.master_path), 4)
    nbformat.write(notebook, str(tmp_path / "master.ipynb"))
    submission = load_submission(tmp_path / "master.ipynb", "master", assignment.template, 50 * 2**20)
    assert submission_attempts(submission, assignment.template) == []
    notebook.cells.append(nbformat.v4.new_code_cell("torch.allclose = lambda *args, **kwargs: True\n"))
    nbformat.write(notebook, str(tmp_path / "patched.ipynb"))
    submission = load_submission(tmp_path / "patched.ipynb", "patched", assignment.template, 50 * 2**20)
    code_cells = sum(c.cell_type == "code" for c in notebook.cells)
    assert [(a.kind, a.where, a.detail) for a in submission_attempts(submission, assignment.template)] == [
        ("library_patch", f"code cell {code_cells}, line 1", "sets torch.allclose")]
