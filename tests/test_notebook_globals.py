"""The notebooks' globals: what a course's own tests may read after running a notebook.

A course keeps public tests of its own (outside this project) that run a student's notebook
and read the globals its exercises define. Restructuring an exercise must keep those names:
Exercise 1 became a function (``decode_step_sweep``) called by a provided run cell, and its
lists (``full_ms_per_step``, ``kv_cache_bytes``, ...) stopped being globals, so a course test
reading them failed with a NameError. ``KEPT`` lists, per assignment, the globals the
notebooks' run, demo and provided cells define (those of Exercise 1 before it was a function
among them); each must stay bound at the top level of the master and of the student notebook,
and Exercise 1's run cell is executed in process to show that it defines its names with the
sweep's values.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from grader import cells
from grader.execute import GRADING_ENV

ROOT = Path(__file__).resolve().parent.parent

EXERCISE_1 = ("BENCH_DIM", "BENCH_HEADS", "BENCH_BATCH", "BENCH_DTYPE", "BYTES_PER_ELEMENT",
              "DECODE_HISTORY_LENGTHS", "DECODE_REPEATS", "DECODE_WARMUP", "time_median_ms",
              "full_attn", "lin_attn", "SWEEP", "DECODE_BENCHMARK",
              # the exercise's lists, globals of its cell before it became decode_step_sweep
              "full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes", "linear_state_bytes")

KEPT: dict[str, tuple[str, ...]] = {
    "linear_attention": EXERCISE_1 + (
        "GRADING", "DEVICE", "EPS", "feature_map", "Module", "Linear", "LayerNorm", "MLP",
        "MultiHeadAttention", "KVCache", "LinearAttention", "HybridBlock", "HybridTransformerLM",
        "NORM_POSITIONS", "LAYER_PATTERNS", "STORYLM_1M", "STORYLM_5M", "STORY_MODELS",
        "TINYSTORIES_PATH", "SAMPLE_PROMPT", "CharTokenizer", "tokenizer", "story_text", "train_ids",
        "val_ids", "TRAINING_RESULTS", "RECALL_CONFIG", "RECALL_DISTANCES", "RECALL_RESULTS",
        "DECAY_LOGITS", "DECAY_TOKENS", "DECAY_RESULTS", "BILL_TOKENS", "BILL_BYTES",
        "RUN_STORYLM_5M", "RUN_REPORT"),
    "linear_attention_hyena": (
        "DTYPE", "MEASURED", "feature_map", "LA_LENGTHS", "LA_DIM", "agreement", "PRECISION_L",
        "precision", "GLA_L", "GLA_DK", "GLA_DV", "gating", "CONV_LENGTHS", "CONV_BATCH",
        "CONV_CHANNELS", "conv", "RECALL_KS", "RECALL_DKS", "RECALL_SEEDS", "SOFTMAX_BETA", "capacity"),
}

NOTEBOOKS = [(name, folder) for name in KEPT for folder in ("solutions", "assignments")]


def _notebook(folder: str, name: str) -> dict:
    return json.loads((ROOT / folder / name / f"{name}.ipynb").read_text())


def _source(cell: dict) -> str:
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else text


def _top_level_names(source: str) -> set[str]:
    """Names a cell binds in the notebook's namespace (as the kernel runs it)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    bound: set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With, ast.If, ast.Try)):
            # what the statement stores outside a function or class body
            bound |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return bound


@pytest.mark.parametrize("name,folder", NOTEBOOKS)
def test_every_kept_global_is_bound_by_the_notebooks_code_cells(name: str, folder: str) -> None:
    notebook = _notebook(folder, name)
    bound = set().union(*(_top_level_names(_source(c)) for c in notebook["cells"] if c["cell_type"] == "code"))
    missing = [g for g in KEPT[name] if g not in bound]
    assert not missing, f"{folder}/{name}: no code cell binds {missing} any more (a course's tests read them)"


def _run_exercise_1(notebook: dict, scaffolds: dict[str, str]) -> dict[str, Any]:
    """Execute the notebook's code cells up to Exercise 1's run cell in one namespace, in
    grading mode, with the scaffold cells' sources from ``scaffolds`` (by id) where given."""
    mp = pytest.MonkeyPatch()
    for key, value in GRADING_ENV.items():
        mp.setenv(key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        for cell in notebook["cells"]:
            if cell["cell_type"] != "code" or "question" in cell["metadata"].get("tags", []):
                continue
            source = scaffolds.get(cell.get("id"), _source(cell))
            exec(compile(source, f"<cell {cell.get('id')}>", "exec"), namespace)
            if cell.get("id") == "ex1-run":
                return namespace
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    raise AssertionError("no cell with id ex1-run")


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_exercise_1s_run_cell_defines_its_globals_with_the_sweeps_values(folder: str) -> None:
    master = _notebook("solutions", "linear_attention")
    # The student notebook as a student completes it: the master's code in its scaffold cells.
    filled = {c.get("id"): _source(c) for c in master["cells"]
              if c["cell_type"] == "code" and cells.SCAFFOLD in c["metadata"].get("tags", [])}
    namespace = _run_exercise_1(_notebook(folder, "linear_attention"), filled if folder == "assignments" else {})
    missing = [g for g in EXERCISE_1 if g not in namespace]
    assert not missing, f"{folder}: Exercise 1's cells leave {missing} undefined"
    lengths = namespace["DECODE_BENCHMARK"]["history_lengths"]
    for key in ("full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes", "linear_state_bytes"):
        assert list(namespace[key]) == namespace["DECODE_BENCHMARK"][key] == list(namespace["SWEEP"][key])
        assert len(namespace[key]) == len(lengths)
    assert type(namespace["full_attn"]).__name__ == "MultiHeadAttention"
    assert type(namespace["lin_attn"]).__name__ == "LinearAttention"


def _first_cell_text(path: Path) -> str:
    return _source(json.loads(path.read_text())["cells"][0])


def test_the_first_cell_installs_the_graders_torch_and_numpy():
    """A student's install matches the grader's: torch at the project's pin (the CPU build), and
    numpy, which torch warns about on every run without it; never an unpinned torch."""
    pin = re.search(r"torch==([0-9.]+)", (ROOT / "Makefile").read_text()).group(1)
    notebooks = [ROOT / folder / name / f"{name}.ipynb" for name in KEPT for folder in ("solutions", "assignments")]
    notebooks += sorted((ROOT / "examples" / "submissions").rglob("*.ipynb"))
    for path in notebooks:
        text = _first_cell_text(path)
        installs = re.findall(r"`pip install ([^`]*)`", text)
        assert installs, f"{path}: its first cell says nothing to install"
        packages = [word for line in installs for word in line.split() if not word.startswith(("-", "http"))]
        assert f"torch=={pin}" in packages and "torch" not in packages, (path, installs)
        assert "numpy" in packages, (path, installs)
        assert any("download.pytorch.org/whl/cpu" in line for line in installs), (path, installs)
