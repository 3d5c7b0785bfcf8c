"""The public test suite shipped in assignments/linear_attention/tests, run as students run it.

Each configuration runs pytest in a subprocess (fresh interpreter, no ini file of this repo)
with pytest-json-report, and the outcomes are read from the JSON report. The runs start
together so the whole module costs about one torch import of wall time per core.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import SCAFFOLDS, finish_all, notebook_with_scaffold, scaffold_cell

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = ROOT / "assignments" / "linear_attention"
PUBLIC_TESTS = ASSIGNMENT / "tests"
STUDENT_NOTEBOOK = ASSIGNMENT / "linear_attention.ipynb"
MASTER_NOTEBOOK = ROOT / "solutions" / "linear_attention" / "linear_attention.ipynb"

TOTAL = 15
PASS_ON_TEMPLATE = {
    "test_feature_map_is_positive",
    "test_construction_shapes_and_head_divisibility",
    "test_decay_is_sigmoid_of_logit",
    "test_init_state_shapes_and_zeros",
    "test_lm_rejects_bad_layer_pattern",
    "test_hybrid_block_kinds",
    "test_parameter_counts_differ_only_by_decay_scalars",
    "test_lm_rejects_input_longer_than_max_seq_len",
}
EQUIVALENCE = {
    "TestEquivalence::test_parallel_matches_recurrent_mild_decay",
    "TestEquivalence::test_parallel_matches_recurrent_strong_decay",
}
CAUSALITY = {"test_causal_future_inputs_do_not_change_past_outputs"}

# name -> (notebook given in LA_NOTEBOOK or None for the default, extra pytest arguments)
RUNS = {
    "template": (None, []),
    "master": (MASTER_NOTEBOOK, []),
    "equiv": (MASTER_NOTEBOOK, ["-k", "equiv"]),
    "causal": (MASTER_NOTEBOOK, ["-k", "causal"]),
    "broken": ("BROKEN", []),
    # Every correct scaffold of tests/scaffolds, through tests/public_corpus_plugin.py.
    "corpus": (None, ["-p", "public_corpus_plugin"]),
    # One form without decay: the public tests diagnose it in the grader's words.
    "mutant_decay_only_in_forward": ("SCAFFOLD", ["-k", "equiv"]),
    "mutant_decay_only_in_step": ("SCAFFOLD", ["-k", "equiv"]),
}
CORRECT = sorted(p.stem for p in SCAFFOLDS.glob("correct_*.py"))
TIMEOUT = 240


def _short(nodeid: str) -> str:
    """'tests/test_linear_attention.py::TestX::test_y' -> 'TestX::test_y'."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


class Run:
    """One finished pytest subprocess and its JSON report."""

    def __init__(self, name: str, returncode: int, output: str, report: dict | None):
        self.name, self.returncode, self.output, self.report = name, returncode, output, report

    def outcomes(self) -> dict[str, str]:
        assert self.report is not None, f"run {self.name!r} wrote no JSON report:\n{self.output[-4000:]}"
        return {_short(t["nodeid"]): t["outcome"] for t in self.report.get("tests", [])}

    def names(self, outcome: str) -> set[str]:
        return {name for name, got in self.outcomes().items() if got == outcome}

    def summary(self) -> dict:
        assert self.report is not None, f"run {self.name!r} wrote no JSON report:\n{self.output[-4000:]}"
        return self.report["summary"]

    def context(self) -> str:
        return f"pytest output of run {self.name!r} (exit {self.returncode}):\n{self.output[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    work = tmp_path_factory.mktemp("public_suite")
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")  # isolate from this repo's pyproject settings, as students are
    broken = work / "broken.ipynb"
    broken.write_text('{"cells": [{"cell_type": "code", "source": "x = ', encoding="utf-8")

    master = nbformat.read(str(MASTER_NOTEBOOK), as_version=4)
    corpus = {}
    for name in CORRECT:
        corpus[name] = str(work / f"{name}.ipynb")
        nbformat.write(notebook_with_scaffold(master, scaffold_cell(master, (SCAFFOLDS / f"{name}.py").read_text())),
                       corpus[name])

    started = {}
    for name, (notebook, extra) in RUNS.items():
        env = {k: v for k, v in os.environ.items()
               if k not in ("LA_NOTEBOOK", "PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the shipped folder
        if notebook == "SCAFFOLD":   # the master with the scaffold of tests/scaffolds named by the run
            notebook = work / f"{name}.ipynb"
            nbformat.write(notebook_with_scaffold(master, scaffold_cell(master, (SCAFFOLDS / f"{name}.py").read_text())),
                           str(notebook))
        if notebook is not None:
            env["LA_NOTEBOOK"] = str(broken if notebook == "BROKEN" else notebook)
        if name == "corpus":
            env["G2C_CORPUS"] = json.dumps(corpus)
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
        report = work / f"{name}.json"
        cmd = [sys.executable, "-m", "pytest", str(PUBLIC_TESTS), "-q", "-p", "no:cacheprovider",
               "-c", str(ini), "--rootdir", str(ASSIGNMENT),
               "--json-report", f"--json-report-file={report}", *extra]
        started[name] = subprocess.Popen(cmd, cwd=ASSIGNMENT, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    finished = {}
    for name, (returncode, output) in finish_all(started, TIMEOUT).items():
        report = work / f"{name}.json"
        finished[name] = Run(name, returncode, output, json.loads(report.read_text()) if report.exists() else None)
    return finished


def test_suite_has_fifteen_tests(runs):
    outcomes = runs["master"].outcomes()
    assert len(outcomes) == TOTAL, f"{len(outcomes)} tests: {sorted(outcomes)}\n{runs['master'].context()}"
    assert PASS_ON_TEMPLATE | EQUIVALENCE | CAUSALITY <= set(outcomes)


def test_template_passes_exactly_the_provided_code_tests(runs):
    run = runs["template"]
    assert STUDENT_NOTEBOOK.exists()
    summary = run.summary()
    assert (summary.get("passed", 0), summary.get("failed", 0)) == (8, 7), run.context()
    assert summary.get("error", 0) == 0, run.context()
    assert run.names("passed") == PASS_ON_TEMPLATE, run.context()


def test_template_failures_show_the_todo(runs):
    run = runs["template"]
    for test in run.report["tests"]:
        if test["outcome"] == "failed":
            message = test["call"]["crash"]["message"]
            assert "NotImplementedError" in message and "TODO" in message, (test["nodeid"], message)


def test_master_passes_everything(runs):
    run = runs["master"]
    summary = run.summary()
    assert summary.get("passed", 0) == TOTAL and summary.get("total") == TOTAL, run.context()
    assert run.returncode == 0, run.context()


@pytest.mark.parametrize("keyword, expected", [("equiv", EQUIVALENCE), ("causal", CAUSALITY)])
def test_keyword_selection(runs, keyword, expected):
    run = runs[keyword]
    summary = run.summary()
    assert set(run.outcomes()) == expected, run.context()
    assert summary.get("passed", 0) == len(expected), run.context()
    assert summary.get("deselected", 0) == TOTAL - len(expected), run.context()


def test_unloadable_notebook_errors_each_test_readably(runs):
    run = runs["broken"]
    summary = run.summary()
    assert summary.get("error", 0) == TOTAL and summary.get("collected") == TOTAL, run.context()
    for test in run.report["tests"]:
        message = test["setup"]["longrepr"]
        assert "could not load the notebook's code" in message and "not valid notebook JSON" in message, message



@pytest.mark.parametrize("run, diagnosis", [("mutant_decay_only_in_forward", ("decay", "none", "step")),
                                            ("mutant_decay_only_in_step", ("decay", "none", "forward"))])
def test_a_form_without_decay_is_diagnosed_as_the_grader_diagnoses_it(runs, run, diagnosis):
    """The equivalence tests name the form that ignores gamma with the grader's own sentence, and
    name the two compared outputs for what they are (neither is a trusted value)."""
    from grader.checks.linear_attention.model import _SAYS
    concern, variant, form = diagnosis
    said = _SAYS[(concern, variant)][form]
    for test in runs[run].report["tests"]:
        message = test["call"]["crash"]["message"]
        assert test["outcome"] == "failed" and said in message, (test["nodeid"], message)
        assert "step loop " in message and ", forward " in message and "expected" not in message, message


@pytest.mark.parametrize("name", CORRECT)
def test_every_correct_style_passes_every_public_test(runs, name):
    """Including no EPS, clamp(min=EPS) and x.float(): the public tests follow the grader's rules."""
    outcomes = {test: got for test, got in runs["corpus"].outcomes().items() if test.endswith(f"[{name}]")}
    assert len(outcomes) == TOTAL, runs["corpus"].context()
    failed = {test: got for test, got in outcomes.items() if got != "passed"}
    assert not failed, f"{failed}\n{runs['corpus'].context()}"
