"""The hybrid-LM check: the student's layer inside the provided HybridTransformerLM.

The harness exports the model's parameters and logits; here the reference model is rebuilt
from the master notebook with those same parameters, and the logits must agree.
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
        for name, param in model.named_parameters():
            value = out.arrays.get(f"param.{name}")
            if value is None or value.shape != tuple(param.shape):
                return Verdict("failed", f"parameter {name} is missing or has the wrong shape")
            param.copy_(torch.from_numpy(value.astype(np.float64)))
        expected = model(torch.tensor(case.arrays["tokens"], dtype=torch.long)).numpy()
    got = out.arrays.get("logits")
    if got is None or got.shape != expected.shape:
        return Verdict("failed", f"logits shape {None if got is None else got.shape}, expected {expected.shape}")
    error = float(np.abs(got - expected).max())
    if not error <= tolerance:
        return Verdict("failed", f"logits differ from the reference model with the same parameters by "
                                 f"{error:.3g} (max-abs)")
    return Verdict("passed", f"forward and backward run, logits match the reference (max-abs {error:.1g})")
