"""The linear_attention_hyena hidden checks on the corpus of tests/hyena_corpus/ (see its README).

Every ``correct_*`` file must earn every scaffold item; every ``mutant_*`` file must lose
exactly the items its README entry lists (``(loses: ...)``, the one place they are written
down), each with a message naming the mutant's function; the untouched student template
earns only the baseline; a check that crashes is an ``error`` of its own item only.

Each file is grafted as a submission would be: for each scaffold cell of the master, the
master's cell (solution included) followed by the file's own helpers and its definitions of
that cell's functions, so that a mutant's function wins and the reference supplies the rest.
The module then runs through the probe harness's own case code in this process
(``probe_in_process``) and the real checks, about a second per file.
"""
from __future__ import annotations

import ast
import copy
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path

import nbformat
import numpy as np
import pytest

from grader import cells
from grader.assign import student_notebook
from grader.assignment import Assignment
from grader.checks import CheckContext, Verdict
from grader.checks import linear_attention_hyena as checks
from grader.checks.compare import Mismatch, compare_nonfinite_as_expected, describe_scaled, first_beyond
from grader.graft import submission_module_source
from grader.probe import CaseOutput, ProbeResult, run_probe

from probe_in_process import probe_in_process

ASSIGNMENT = "linear_attention_hyena"
CORPUS = Path(__file__).parent / "hyena_corpus"
README = CORPUS / "README.md"
CORRECT = sorted(p.stem for p in CORPUS.glob("correct_*.py"))
MUTANTS = sorted(p.stem for p in CORPUS.glob("mutant_*.py"))


@cache
def hyena() -> Assignment:
    return Assignment(ASSIGNMENT)


def expected_losses() -> dict[str, set[str]]:
    """README entries: - `file.py` (loses: a, b): description   ('none' for correct variants)."""
    table = {}
    for match in re.finditer(r"^- `([\w.]+)\.py` \(loses: ([^)]*)\)", README.read_text(), flags=re.M):
        table[match.group(1)] = {n.strip() for n in match.group(2).split(",") if n.strip() not in ("", "none")}
    return table


def defined_functions(code: str) -> set[str]:
    return {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}


def scaffold_sources(master: nbformat.NotebookNode, code: str) -> dict[str, str]:
    """The student's cell for each scaffold cell: the master's, then the file's helpers and its
    definitions of that cell's functions (which therefore replace the master's)."""
    tree = ast.parse(code)
    declared = cells.scaffolds(master)
    symbols = {s for scaffold in declared for s in scaffold.symbols}
    helpers = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in symbols)]
    sources = {}
    for cell in master.cells:
        if cells.SCAFFOLD not in cells.tags(cell):
            continue
        scaffold = next(s for s in declared if s.cell_id == cell.get("id"))
        own = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in scaffold.symbols]
        appended = ast.unparse(ast.Module(body=helpers + own, type_ignores=[]))
        sources[scaffold.cell_id] = cells.source(cell) + "\n\n\n" + appended + "\n"
    return sources


def probe_of(sources: dict[str, str]) -> ProbeResult:
    module, _ = submission_module_source(hyena().master, sources)
    return probe_in_process(module, checks.probe_cases(hyena().rubric), checks.PROBE_DRIVER)


def evaluate(probe: ProbeResult | None) -> dict[str, Verdict]:
    context = CheckContext(hyena().rubric, hyena().master_path, probe, None, None, "not executed in this test")
    verdicts = checks.evaluate(context)
    return {item: verdicts[item] for item in checks.SCAFFOLD_ITEMS}


def grade_file(name: str) -> dict[str, Verdict]:
    return evaluate(probe_of(scaffold_sources(hyena().master, (CORPUS / f"{name}.py").read_text())))


def _one_thread() -> None:
    import torch
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus() -> dict[str, dict[str, Verdict]]:
    names = CORRECT + MUTANTS
    with ProcessPoolExecutor(max_workers=2, initializer=_one_thread) as pool:
        return dict(zip(names, pool.map(grade_file, names)))


@pytest.fixture(scope="module")
def solution_probe() -> ProbeResult:
    """The master's own scaffold cells through the probe."""
    return probe_of({c.get("id"): cells.source(c) for c in hyena().master.cells if cells.SCAFFOLD in cells.tags(c)})


# ----------------------------------------------------------------------------- the corpus

def test_the_readme_lists_every_file_with_items_of_the_rubric():
    table = expected_losses()
    assert set(table) == set(CORRECT + MUTANTS), "README.md and the corpus files disagree"
    assert len(CORRECT) >= 4 and len(MUTANTS) >= 20
    rubric_items = {item.name for item in hyena().rubric.items}
    assert set(checks.SCAFFOLD_ITEMS) <= rubric_items
    for name, lost in table.items():
        assert lost <= set(checks.SCAFFOLD_ITEMS), f"{name}: unknown items {lost - set(checks.SCAFFOLD_ITEMS)}"
        assert bool(lost) == name.startswith("mutant_"), name
    symbols = {s for scaffold in cells.scaffolds(hyena().master) for s in scaffold.symbols}
    for name in CORRECT:
        assert defined_functions((CORPUS / f"{name}.py").read_text()) >= symbols, f"{name} must define every function"


@pytest.mark.parametrize("name", CORRECT)
def test_correct_code_earns_every_scaffold_item(corpus, name):
    lost = {item: v.message for item, v in corpus[name].items() if v.status != "passed"}
    assert not lost, f"{name} lost items: {lost}"


@pytest.mark.parametrize("name", MUTANTS)
def test_a_mutant_loses_exactly_its_items_with_a_message_naming_its_function(corpus, name):
    verdicts = corpus[name]
    crashed = {item: v.message for item, v in verdicts.items() if v.status == "error"}
    assert not crashed, crashed
    lost = {item for item, v in verdicts.items() if v.status != "passed"}
    expected = expected_losses()[name]
    assert lost == expected, {item: verdicts[item].message for item in lost ^ expected}
    functions = defined_functions((CORPUS / f"{name}.py").read_text())
    for item in lost:
        message = verdicts[item].message
        assert any(f in message for f in functions), f"{item}'s message names none of {functions}: {message}"
        assert re.search(r"err \S+ \(tolerance |raised|not 0|not unit|different vectors|shape|not more than|"
                         r"needs < ", message), f"{item}'s message does not say what differed: {message}"


def test_a_mistake_is_charged_once_and_the_message_says_where(corpus):
    """Error carried forward: the dependent item passes, and tells the student why."""
    said = {
        ("mutant_keys_not_normalized", "capacity_random"): "judged against your own random_unit_vectors (which loses `unit_vectors`)",
        ("mutant_recall_squared_error", "capacity_random"): "judged against your own linear_recall_error (which loses `recall_error`)",
        ("mutant_recall_feature_map", "capacity_orthonormal"): "judged against your own linear_recall_error",
        ("mutant_orthonormal_columns", "capacity_orthonormal"): "as the same calls to your own orthonormal_vectors",
        ("mutant_mask_diagonal_excluded", "la_normalized"): "divided by its own row sums",
        ("mutant_readout_before_write", "la_normalized"): "divided by its own row sums",
        ("mutant_mask_future_included", "la_precision"): "already disagree at small L",
        ("mutant_gate_after_write", "gla_vector"): "which loses gla_scalar",
        ("mutant_gla_exclusive_cumsum", "gla_vector"): "which loses gla_scalar",
    }
    for (name, item), words in said.items():
        verdict = corpus[name][item]
        assert verdict.status == "passed" and words in verdict.message, (name, item, verdict.message)
    assert "charged there, not here" in corpus["mutant_orthonormal_columns"]["capacity_orthonormal"].message


def test_named_mistakes_are_named(corpus):
    named = {
        ("mutant_gate_after_write", "gla_scalar"): "the gate applied after the write",
        ("mutant_gla_exclusive_cumsum", "gla_scalar"): "shifted by one",
        ("mutant_normalizer_missing", "la_normalized"): "the normalizer is what differs",
        ("mutant_generator_ignored", "unit_vectors"): "draw from the generator passed in",
        ("mutant_fft_no_padding", "fft_impulse"): "acausal",
        ("mutant_gla_mask_own_gate", "gla_mask"): "the key's own gate is not in it",
        ("mutant_orthonormal_columns", "orthonormal_vectors"): "returned shape (16, 1), expected (1, 16)",
    }
    for (name, item), words in named.items():
        assert words in corpus[name][item].message, (name, item, corpus[name][item].message)


# ----------------------------------------------------------------------------- the template and the format

def test_the_student_template_earns_only_the_baseline():
    template = {c.get("id"): cells.source(c) for c in hyena().template.cells if cells.SCAFFOLD in cells.tags(c)}
    verdicts = evaluate(probe_of(template))
    baseline = {item.name for item in hyena().rubric.items if item.baseline}
    assert {item for item, v in verdicts.items() if v.status == "passed"} == baseline & set(verdicts)
    assert not [v for v in verdicts.values() if v.status == "error"]
    assert "NotImplementedError" in verdicts["capacity_random"].message


def test_a_missing_function_or_signature_fails_only_the_format_item_and_its_own():
    master = hyena().master
    sources = scaffold_sources(master, "")
    renamed = {cell: source.replace("def toeplitz_causal_conv(", "def toeplitz_conv(") for cell, source in sources.items()}
    verdicts = evaluate(probe_of(renamed))
    assert "not defined: toeplitz_causal_conv" in verdicts["scaffold_present"].message
    assert {i for i, v in verdicts.items() if v.status != "passed"} == {"scaffold_present", "toeplitz_oracle"}
    assert "toeplitz_causal_conv is not defined" in verdicts["toeplitz_oracle"].message
    signature = {cell: source.replace("def retnet_decay_mask(length: int, gamma):", "def retnet_decay_mask(length):")
                 for cell, source in sources.items()}
    verdicts = evaluate(probe_of(signature))
    assert {i for i, v in verdicts.items() if v.status != "passed"} == {"scaffold_present", "retnet_mask"}
    assert "retnet_decay_mask does not take the scaffold's arguments" in verdicts["scaffold_present"].message


def test_a_crashing_check_is_an_error_of_its_own_item_only(solution_probe):
    probe = copy.deepcopy(solution_probe)
    unit = next(name for name in probe.cases if name.startswith("unit/s"))
    probe.cases[unit] = CaseOutput("ok", None, {"first": "junk"}, {"first": None})
    verdicts = evaluate(probe)
    assert verdicts["unit_vectors"].status == "error" and "grader error" in verdicts["unit_vectors"].message
    assert verdicts["unit_vectors"].internal
    assert {i for i, v in verdicts.items() if v.status != "passed"} == {"unit_vectors"}


def test_without_a_probe_every_scaffold_item_says_why():
    verdicts = checks.evaluate(CheckContext(hyena().rubric, hyena().master_path, None, "no cell defines `def f`",
                                            None, "not executed"))
    assert all(verdicts[i].status == "error" and "no cell defines" in verdicts[i].message for i in checks.SCAFFOLD_ITEMS)
    assert verdicts["notebook_runs"].status == "error"


RANDOM_ITEMS = ("unit_vectors", "orthonormal_vectors", "recall_error", "capacity_orthonormal", "capacity_rising",
                "capacity_random")


def test_the_sandboxed_probe_grades_like_the_in_process_one(corpus, sandbox):
    """The mutant whose grade depends on process boundaries (it draws from the global random
    state, which every sandboxed worker starts afresh), through the real probe: the cases of
    the items built on random draws."""
    name = "mutant_generator_ignored"
    module, _ = submission_module_source(hyena().master, scaffold_sources(hyena().master,
                                                                         (CORPUS / f"{name}.py").read_text()))
    cases = [c for c in checks.probe_cases(hyena().rubric) if c.name.startswith(("unit/", "orthonormal/", "recall/",
                                                                                  "capacity/"))]
    with tempfile.TemporaryDirectory() as scratch:
        probe = run_probe(module, cases, sandbox, Path(scratch), hyena().rubric.limits.probe_case_timeout_s,
                          checks.PROBE_DRIVER)
    verdicts = evaluate(probe)
    assert {i: verdicts[i].status for i in RANDOM_ITEMS} == {i: corpus[name][i].status for i in RANDOM_ITEMS}
    assert verdicts["unit_vectors"].message == corpus[name]["unit_vectors"].message


# ----------------------------------------------------------------------------- the notebooks

def test_the_committed_student_notebook_matches_a_fresh_assign():
    fresh = student_notebook(hyena().master)
    assert nbformat.writes(fresh) == nbformat.writes(hyena().template), (
        f"assignments/{ASSIGNMENT}/{ASSIGNMENT}.ipynb is out of date: run `grader assign "
        f"solutions/{ASSIGNMENT}/{ASSIGNMENT}.ipynb`")
    assert hyena().check_files() is None


def test_demo_cells_run_in_the_notebook_but_stay_out_of_the_probed_module():
    master = hyena().master
    demos = [c for c in master.cells if cells.DEMO in cells.tags(c)]
    assert [c.id for c in demos] == [c.id for c in master.cells if str(c.get("id")).startswith("demo-")]
    assert all(cells.PROVIDED in cells.tags(c) for c in demos)
    module, _ = submission_module_source(master, {c.get("id"): cells.source(c) for c in master.cells
                                                  if cells.SCAFFOLD in cells.tags(c)})
    assert "MEASURED[" not in module and "def hyena_like_filter" not in module and "def feature_map" in module


# ----------------------------------------------------------------------------- the shared comparison helpers

def test_the_scaled_rule_reports_the_error_the_tolerance_and_the_first_offending_position():
    expected = np.array([[1.0, 2.0], [400.0, 3.0]])
    got = expected + np.array([[0.0, 1e-9], [1e-6, 0.0]])
    result = compare_nonfinite_as_expected(got, expected)
    text = describe_scaled(result, got, expected, 1e-12, ("row", "column"))
    assert text.startswith("err 2.5e-09 (tolerance 1e-12), max-abs error 1e-06 at (row 1, column 0)"), text
    assert text.endswith("first beyond the tolerance at (row 0, column 1)"), text
    assert first_beyond(got, expected, 1e-3) is None
    # Non-finite entries count only where they are expected, and must be the same there.
    nan = np.array([[np.nan, 1.0]])
    assert compare_nonfinite_as_expected(np.array([[np.nan, 1.5]]), nan) == Mismatch(0.5, (0, 1), 1.0, 1.5)
    assert "expected nan" in compare_nonfinite_as_expected(np.array([[0.0, 1.0]]), nan)
    assert "non-finite output" in compare_nonfinite_as_expected(np.array([[np.nan, np.inf]]), nan)
