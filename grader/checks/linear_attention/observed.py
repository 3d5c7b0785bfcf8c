"""The figures the written answers are grounded on, from the runs the grader observed.

The notebook's run prints what the student's code chose to print; the grader shows the model
(``grader.written``) figures it measured itself instead (``observed_answers``), each answer
variable as the notebook's run cells shape it, in grading mode:

- ``DECODE_BENCHMARK``: the medians the grader's timer measured in its observed run of
  ``decode_step_sweep`` at the notebook's history lengths (``benchmark.observed_sweep``), and the
  bytes of the KV cache and of (S, z), which follow from the sizes.
- ``TRAINING_RESULTS``: each Exercise 2 model ``train_and_compare`` trained in the probe's run of
  the notebook's Exercise 2 (``probe_driver.case_grading_run``), every gradient of its training
  from a forward pass the grader observed (``training.unobserved_gradients``), evaluated by the grader on the
  held-out windows the provided ``evaluate_loss`` reads: the cross-entropy is computed here from
  the logits, against targets cut here from the master's corpus. Parameter counts are those the
  config builds. The sample text is not observed and is left out.
- ``RECALL_RESULTS``: each Exercise 3 model ``train_recall`` trained there (every gradient from an
  observed forward), scored here by distance from its logits at the query positions of the
  notebook's evaluation rows.
- ``DECAY_RESULTS``: ||S||_F after the token counts the notebook prints, of the states the
  layer's own ``step`` returned on the notebook's decay layer and inputs, and sigmoid of the
  gamma_logit of each linear layer of the Exercise 2 models.

A variable the grader could not observe is None (the grounding then says it is absent), never
the notebook's own figure. ``MEMORY_BILL`` is not here: it is arithmetic on the rubric's sizes,
which its items check exactly, so the notebook's bill is shown as it is.
"""
from __future__ import annotations

import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from grader.checks import CheckContext, torch
from grader.checks.linear_attention.benchmark import FULL, LINEAR, observed_sweep
from grader.checks.linear_attention.cases import BENCHMARK, GRADING_RUN
from grader.checks.linear_attention.training import grading_run_output, notebook_corpus, unobserved_gradients
from grader.reference import reference_namespace

BYTES_PER_ELEMENT = 4   # the benchmark's float32 layers
BENCHMARK_BATCH = 1


def observed_answers(context: CheckContext) -> dict[str, Any]:
    """Each answer variable the grader observed, as the notebook's run cells shape it, or None
    when it could not observe it; each computed on its own (a failure costs its variable)."""
    found: dict[str, Any] = {}
    for name, measure in (("DECODE_BENCHMARK", _decode_benchmark), ("TRAINING_RESULTS", _training_results),
                          ("RECALL_RESULTS", _recall_results), ("DECAY_RESULTS", _decay_results)):
        try:
            found[name] = measure(context)
        except Exception:  # noqa: BLE001 - a grader bug leaves the variable unobserved, never the notebook's
            traceback.print_exc()
            found[name] = None
    return found


def _decode_benchmark(context: CheckContext) -> dict[str, Any] | None:
    run, _ = observed_sweep(context)
    if run is None:
        return None
    lengths = BENCHMARK["notebook_lengths"]
    times = {}
    for path in (FULL, LINEAR):
        measured = run[path.times]
        if any(not measured.get(t) for t in lengths):
            return None
        times[path.times] = [round(float(np.median(measured[t])), 4) for t in lengths]
    dim, heads = BENCHMARK["embedding_dim"], BENCHMARK["num_heads"]
    head_dim = dim // heads
    state = BENCHMARK_BATCH * heads * (head_dim * head_dim + head_dim) * BYTES_PER_ELEMENT
    return {"history_lengths": list(lengths), **times,
            "kv_cache_bytes": [2 * BENCHMARK_BATCH * t * dim * BYTES_PER_ELEMENT for t in lengths],
            "linear_state_bytes": [state] * len(lengths),
            "embedding_dim": dim, "num_heads": heads, "batch_size": BENCHMARK_BATCH,
            "bytes_per_element": BYTES_PER_ELEMENT, "device": "cpu"}


def _exercise(context: CheckContext, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The grading run's outputs when the exercise ``key`` (of its ``errors``) ran through."""
    run = grading_run_output(context)
    if run is None or key in (run[0].get("errors") or {}):
        return None
    return run


@lru_cache(maxsize=2)
def held_out_windows(master_path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """The windows the notebook's grading-mode ``evaluate_loss`` reads (inputs, targets) and the
    vocabulary size, from the master's own corpus and helpers."""
    setup, budget = GRADING_RUN["training"], GRADING_RUN["training"]["budget"]
    _, held_out, vocab = notebook_corpus(master_path)
    inputs, targets = reference_namespace(master_path)["get_batch"](
        held_out, budget["batch_size"], budget["context"], torch.Generator().manual_seed(setup["eval_seed"]))
    return inputs.numpy(), targets.numpy(), vocab


@lru_cache(maxsize=2)
def _parameter_counts(master_path: Path) -> dict[str, int]:
    ns = reference_namespace(master_path)
    _, _, vocab = held_out_windows(master_path)
    config = ns["STORYLM_1M"]
    return {name: int(ns["HybridTransformerLM"](vocab, config["embedding_dim"], pattern, config["num_heads"],
                                                max_seq_len=GRADING_RUN["training"]["budget"]["context"],
                                                hidden_dim=config["hidden_dim"]).num_parameters())
            for name, pattern in GRADING_RUN["patterns"].items()}


def _cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float | None:
    if logits.ndim != 3 or logits.shape[:2] != targets.shape or not np.isfinite(logits).all():
        return None
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if targets.max() >= logits.shape[-1]:
        return None
    return float(-np.take_along_axis(log_probs, targets[..., None], axis=-1).mean())


def _training_results(context: CheckContext) -> dict[str, Any] | None:
    run = _exercise(context, "training")
    if run is None:
        return None
    info, arrays = run
    inputs, targets, _ = held_out_windows(context.master_path)
    relayed = arrays.get("train.inputs")
    if relayed is None or relayed.shape != inputs.shape or not np.array_equal(relayed, inputs):
        return None
    counts = _parameter_counts(context.master_path)
    found = {}
    for name in GRADING_RUN["patterns"]:
        logits = arrays.get(f"train.{name}.logits")
        trained = (info.get("models") or {}).get(name) or {}
        loss = _cross_entropy(logits, targets) if logits is not None else None
        # not a model the observed training trained, or trained by steps the grader did not see
        if trained.get("index") is None or unobserved_gradients(name, trained) or loss is None:
            return None
        found[name] = {"parameters": counts[name], "val_loss": round(loss, 4)}
    return found


def _recall_results(context: CheckContext) -> dict[str, Any] | None:
    run = _exercise(context, "recall")
    if run is None:
        return None
    info, arrays = run
    recall = GRADING_RUN["recall"]
    tokens, answers, distances = (t.numpy() for t in reference_namespace(context.master_path)["recall_batch"](
        recall["budget"]["eval_size"], torch.Generator().manual_seed(recall["eval_seed"])))
    relayed = arrays.get("recall.tokens")
    if relayed is None or relayed.shape != tokens.shape or not np.array_equal(relayed, tokens):
        return None
    buckets = sorted(set(distances.ravel().tolist()))
    found = {}
    for name in GRADING_RUN["patterns"]:
        logits = arrays.get(f"recall.{name}.logits")
        trained = ((info.get("recall") or {}).get("models") or {}).get(name) or {}
        if trained.get("index") is None or unobserved_gradients(name, trained):
            return None   # not a model the observed training trained, or trained by steps the grader did not see
        if logits is None or logits.shape[:2] != answers.shape or not np.isfinite(logits).all():
            return None
        correct = logits.argmax(axis=-1) == answers
        found[name] = {"distance_buckets": buckets,
                       "accuracy": [round(float(correct[distances == d].mean()), 4) for d in buckets],
                       "overall_accuracy": round(float(correct.mean()), 4)}
    return found


def _decay_results(context: CheckContext) -> dict[str, Any] | None:
    figures = observed_decays(context)
    if figures is None:
        return None
    norms, decays = figures
    if norms is None and decays is None:
        return None
    return {"state_norms_after_tokens": None if norms is None else
            {label: {str(n): round(v, 4) for n, v in found.items()} for label, found in norms.items()},
            "learned_decays": None if decays is None else
            {name: [[round(v, 4) for v in row] for row in layers] for name, layers in decays.items()}}


def observed_decays(context: CheckContext) -> tuple[dict[str, dict[int, float]] | None,
                                                    dict[str, list[list[float]]] | None] | None:
    """Exercise 4's figures as the grader measured them in the grading run: ||S||_F after each
    printed token count per decay logit (None when stepping failed), and each trained model's
    per-head decays, bottom to top (None when Exercise 2 failed); None without the run."""
    run = grading_run_output(context)
    if run is None:
        return None
    info, arrays = run
    errors = info.get("errors") or {}
    norms: dict[str, dict[int, float]] | None = None
    if "norms" not in errors:
        norms = {}
        for label in GRADING_RUN["norms"]["logits"]:
            states = [arrays.get(f"norms.{label}.{n}") for n in GRADING_RUN["norms"]["positions"]]
            if any(s is None for s in states):
                norms = None
                break
            norms[label] = {n: float(np.sqrt((s.astype(np.float64) ** 2).sum()))
                            for n, s in zip(GRADING_RUN["norms"]["positions"], states)}
    decays: dict[str, list[list[float]]] | None = None
    if "training" not in errors:
        decays = {}
        for name, pattern in GRADING_RUN["patterns"].items():
            logits = [arrays.get(f"decay.{name}.{i}") for i in range(pattern.count("linear"))]
            if any(v is None for v in logits):
                decays = None
                break
            decays[name] = [[float(1 / (1 + np.exp(-v))) for v in logit.astype(np.float64).ravel()] for logit in logits]
    return norms, decays
