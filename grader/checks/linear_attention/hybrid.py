"""The hybrid-LM check: the student's layer inside the provided HybridTransformerLM.

The harness builds the model from a seed and exports its logits and gradients. Here the
trusted model is built from the master notebook with the same seed, so the weights are
identical and nothing the student's process reports about its parameters is trusted. Its
linear layers compute what the student's forward was shown to compute on the probe's own
cases (the reference, or the named mistake it matched): this item charges how the layer is
wired into the model, not the layer's numbers a second time.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from grader.checks.compare import RUN_FAILED, compare, describe, scaled, within
from grader.checks.linear_attention.model import EPS_CONVENTIONS, REFERENCE, Variant, attention
from grader.probe import CaseOutput, ProbeCase
from grader.reference import reference_namespace


def trusted_logits(master_path: Path, config: dict, tokens: np.ndarray, variant: Variant, eps: str) -> np.ndarray:
    """Logits of the master's HybridTransformerLM built from ``config['seed']``, in float64,
    its linear layers computing ``variant``."""
    ns = reference_namespace(master_path)
    torch.manual_seed(config["seed"])
    model = ns["HybridTransformerLM"](config["vocab_size"], config["embedding_dim"], config["layer_pattern"],
                                      config["num_heads"], config["max_seq_len"],
                                      hidden_dim=config["hidden_dim"]).to(dtype=torch.float64)
    for block in model.blocks:
        if isinstance(block.attn, ns["LinearAttention"]):
            layer = block.attn
            params = {f"{p}.{w}": getattr(getattr(layer, p), w) for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                      for w in ("weight", "bias")}
            params["gamma_logit"] = layer.gamma_logit
            block.attn.forward = (lambda x, params=params, heads=layer.num_heads:
                                  attention(params, x, heads, variant, eps))
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).numpy()


def hybrid_problem(out: CaseOutput, case: ProbeCase, master_path: Path, variant: Variant | None,
                   tolerance: float) -> str | None:
    """What is wrong with one run of the hybrid model (None: nothing)."""
    if out.status != "ok":
        return f"{RUN_FAILED}: HybridTransformerLM forward/backward: {out.error or out.status}"
    info, config = out.info, case.config
    linear_layers = config["layer_pattern"].count("linear")
    if info.get("linear_forward_calls") != linear_layers:
        return (f"your LinearAttention.forward ran {info.get('linear_forward_calls')} times "
                f"in a model with {linear_layers} linear layers")
    basis = variant or REFERENCE
    # A forward that ignores gamma leaves gamma_logit without a gradient: decay_parallel charges that.
    missing = [n for n in info.get("missing_grads") or []
               if basis.applies_decay or not n.endswith("gamma_logit")]
    if missing:
        return (f"no gradient reached {', '.join(missing[:4])}: the output must "
                "depend on every parameter (is the decay detached or hard-coded?)")
    if not info.get("grads_finite", False):
        return "the backward pass produced non-finite gradients"
    got = out.arrays.get("logits")
    results = []
    for eps in EPS_CONVENTIONS:
        expected = trusted_logits(master_path, config, case.arrays["tokens"], basis, eps)
        result = compare(got, expected)
        if within(result, scaled(tolerance, expected)):
            return None
        results.append(result)
    return (f"logits differ from the trusted model built from the same seed "
            f"({'with the reference layer' if variant is None else 'whose layers compute what your forward does'}): "
            f"{describe(results[0])}")
