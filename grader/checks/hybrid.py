"""The hybrid-LM check: the student's layer inside the provided HybridTransformerLM.

The harness builds the model from a seed and exports its logits. Here the reference model is
built from the master notebook with the same seed: the construction code is the grader's own
in both places, so the weights are identical, and nothing the student's process reports about
its parameters is trusted.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from grader.checks import Verdict
from grader.probe import CaseOutput, ProbeCase
from grader.reference import reference_namespace

def check_hybrid(out: CaseOutput, case: ProbeCase, master_path: Path, tolerance: float) -> Verdict:
    """``tolerance`` is the float32 one: a layer that only computes in float32 still counts."""
    if out.status != "ok":
        return Verdict("failed", f"HybridTransformerLM forward/backward: {out.error or out.status}")
    info = out.info
    config = case.config
    linear_layers = config["layer_pattern"].count("linear")
    if info.get("linear_forward_calls") != linear_layers:
        return Verdict("failed", f"your LinearAttention.forward ran {info.get('linear_forward_calls')} times "
                                 f"in a model with {linear_layers} linear layers")
    if info.get("missing_grads"):
        return Verdict("failed", f"no gradient reached {', '.join(info['missing_grads'][:4])}: the output must "
                                 "depend on every parameter (is the decay detached or hard-coded?)")
    if not info.get("grads_finite", False):
        return Verdict("failed", "the backward pass produced non-finite gradients")
    ns = reference_namespace(master_path)
    torch.manual_seed(config["seed"])
    model = ns["HybridTransformerLM"](config["vocab_size"], config["embedding_dim"], config["layer_pattern"],
                                      config["num_heads"], config["max_seq_len"],
                                      hidden_dim=config["hidden_dim"]).to(dtype=torch.float64)
    with torch.no_grad():
        expected = model(torch.tensor(case.arrays["tokens"], dtype=torch.long)).numpy()
    got = out.arrays.get("logits")
    if got is None or got.shape != expected.shape:
        return Verdict("failed", f"logits shape {None if got is None else got.shape}, expected {expected.shape}")
    error = float(np.abs(got - expected).max())
    if not error <= tolerance:
        return Verdict("failed", f"logits differ from the reference model built from the same seed by "
                                 f"{error:.3g} (max-abs)")
    return Verdict("passed", f"forward and backward run, logits match the reference (max-abs {error:.1g})")
