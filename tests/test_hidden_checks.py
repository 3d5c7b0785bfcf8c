"""Every pitfall of the module is caught by the item that names it; correct variants pass.

Each scaffold in tests/scaffolds/ replaces the student's LinearAttention cell and goes
through the real probe (in the sandbox) and the real checks.
"""
from __future__ import annotations

import ast
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from grader import cells
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention as checks
from grader.probe import run_probe, submission_module_source

from conftest import SCAFFOLDS

# mutant -> (the item that names its bug, words its message must contain)
MUTANTS = {
    "mutant_normalizer_dropped": ("normalization", "normalizer is missing"),
    "mutant_output_before_update": ("alignment", "read before the current token is added"),
    "mutant_decay_only_in_step": ("decay_parallel", "ignores gamma"),
    "mutant_decay_only_in_forward": ("decay_recurrent", "ignores gamma"),
    "mutant_decay_s_not_z": ("decay_recurrent", "decay the normalizer z"),
    "mutant_exponent_off_by_one": ("decay_parallel", "exponent is off by one"),
    "mutant_future_mask": ("causality", "must be 0 where i > t"),
    "mutant_step_caches_history": ("state_fixed_size", "must not store the history"),
    "mutant_heads_mixed": ("decay_per_head", "heads are mixed up"),
}
CORRECT = ("correct_explicit_loops", "correct_cumsum", "correct_einsum", "correct_float32_only")
CHEATS = ("cheat_tampers_with_parameters",)


def with_reference_methods(scaffold: str, master: nbformat.NotebookNode) -> str:
    """A mutant file holds only its buggy method(s); the others come from the reference."""
    reference = next(cells.source(c) for c in master.cells if cells.SCAFFOLD in cells.tags(c))
    reference_class = next(n for n in ast.parse(reference).body if isinstance(n, ast.ClassDef))
    tree = ast.parse(scaffold)
    student_class = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    written = {n.name for n in student_class.body if isinstance(n, ast.FunctionDef)}
    student_class.body += [n for n in reference_class.body if isinstance(n, ast.FunctionDef)
                           and n.name in checks.STUDENT_METHODS - written]
    return ast.unparse(tree)


def probe_verdicts(assignment, sandbox, scaffold: str) -> dict[str, Verdict]:
    source, _ = submission_module_source(assignment.master, scaffold, checks.CLASS_NAME,
                                         checks.STUDENT_METHODS)
    rubric = assignment.rubric
    with tempfile.TemporaryDirectory() as scratch:
        probe = run_probe(source, checks.probe_cases(rubric), sandbox, Path(scratch),
                          rubric.limits.probe_case_timeout_s)
    context = CheckContext(rubric, assignment.master_path, probe, None, None, "not executed in this test")
    return {name: verdict for name, verdict in checks.evaluate(context).items()
            if name in checks.SCAFFOLD_ITEMS}


@pytest.fixture(scope="module")
def verdicts(assignment, sandbox) -> dict[str, dict[str, Verdict]]:
    names = list(MUTANTS) + list(CORRECT) + list(CHEATS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda n: probe_verdicts(
            assignment, sandbox, with_reference_methods((SCAFFOLDS / f"{n}.py").read_text(), assignment.master)),
            names)
        return dict(zip(names, found))


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_loses_the_item_that_names_its_bug(verdicts, mutant):
    item, words = MUTANTS[mutant]
    verdict = verdicts[mutant][item]
    assert verdict.status == "failed", f"{mutant} was not caught by {item}: {verdict.message}"
    assert words in verdict.message, f"{item}'s message does not name the bug: {verdict.message}"


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_keeps_the_items_its_code_deserves(verdicts, mutant):
    """A mutant is still importable and shaped right: partial credit, never full marks."""
    found = verdicts[mutant]
    assert found["scaffold_present"].status == "passed"
    assert any(v.status == "failed" for v in found.values())
    assert any(v.status == "passed" for name, v in found.items() if name != "scaffold_present")


def test_tampering_with_parameters_fails_the_hybrid_model(verdicts):
    """The reference model is built from the seed, not from what the student's process reports."""
    verdict = verdicts["cheat_tampers_with_parameters"]["hybrid_lm"]
    assert verdict.status == "failed" and "built from the same seed" in verdict.message


def test_history_cache_also_fails_resuming_from_its_state(verdicts):
    """The cached history ignores the state it is given: resuming elsewhere goes wrong."""
    verdict = verdicts["mutant_step_caches_history"]["state_resume"]
    assert verdict.status == "failed" and "not from history kept elsewhere" in verdict.message


def test_resume_item_is_about_the_state_not_the_arithmetic(verdicts):
    """A step with the wrong arithmetic but an honest (S, z) still resumes like itself."""
    assert verdicts["mutant_decay_s_not_z"]["state_resume"].status == "passed"


@pytest.mark.parametrize("variant", CORRECT)
def test_correct_variant_earns_every_autograded_point(verdicts, variant):
    failed = {n: v.message for n, v in verdicts[variant].items() if v.status != "passed"}
    assert not failed, f"{variant} lost points: {failed}"


def test_float32_only_implementation_gets_a_note_explaining_float64(verdicts):
    message = verdicts["correct_float32_only"]["equivalence"].message
    assert "float32" in message and "float64" in message, message


def test_reference_matches_the_recurrence_loop(assignment):
    """The checks' own parallel reference equals their token-by-token recurrence."""
    case = next(c for c in checks.probe_cases(assignment.rubric) if c.name == "forward_s3_per_head_float64")
    heads = case.config["num_heads"]
    parallel = checks.reference_output(case.arrays, case.arrays["x"], heads)
    recurrent = checks.recurrent_reference(case.arrays, case.arrays["x"], heads)
    assert abs(parallel - recurrent).max() < 1e-12
