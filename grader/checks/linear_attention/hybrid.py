"""The hybrid-LM check: the student's layer inside the provided HybridTransformerLM.

The probe builds the model from a seed, runs it forward and backward and exports its logits,
its loss and each parameter's gradient as arrays. Here the trusted model is built from the
master notebook with the same seed, so the weights are identical, and run forward and backward
too: the item passes only when all of those arrays match the trusted model's. What the
student's process reports about itself (how often forward ran) can only fail it. The trusted
model's linear layers compute what the student's forward was shown to compute on the probe's
own cases (the reference, or the named mistake it matched): this item charges how the layer is
wired into the model, not the layer's numbers a second time. So a forward found to ignore gamma
(which ``decay_parallel`` charges) leaves the trusted ``gamma_logit`` without a gradient as well,
and the student's is not expected.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from grader.checks import torch
from grader.checks.compare import RUN_FAILED, compare, describe, scaled, within
from grader.checks.linear_attention.cases import HYBRID_MAX_PARAMETERS, gradient_output
from grader.checks.linear_attention.model import EPS_CONVENTIONS, REFERENCE, Variant, attention
from grader.probe import CaseOutput, ProbeCase
from grader.reference import reference_namespace

GRADIENT_AXES = {1: ("entry",), 2: ("row", "column")}
LISTED = 4   # parameter names quoted in a message


@dataclass(frozen=True)
class TrustedGradient:
    name: str
    value: np.ndarray      # zeros where the loss does not depend on the parameter
    reached: bool          # whether the backward pass reached the parameter at all
    judged: bool = True    # False: a fitted decay's logit, whose factor is known at one value only


@dataclass(frozen=True)
class TrustedRun:
    logits: np.ndarray
    loss: np.ndarray
    gradients: tuple[TrustedGradient, ...]   # in the order the model lists its parameters


def trusted_run(master_path: Path, config: dict, tokens: np.ndarray, variant: Variant, eps: str) -> TrustedRun:
    """The master's HybridTransformerLM built from ``config['seed']``, in float64, its linear
    layers computing ``variant``, run forward and backward as the probe driver does. The same
    for every submission: computed once per process for each input, variant and convention."""
    return _trusted_run(master_path, json.dumps(config, sort_keys=True), tokens.tobytes(), tokens.dtype.str,
                        tokens.shape, variant, eps)


@lru_cache(maxsize=64)
def _trusted_run(master_path: Path, config_json: str, token_bytes: bytes, dtype: str, shape: tuple[int, ...],
                 variant: Variant, eps: str) -> TrustedRun:
    config = json.loads(config_json)
    tokens = np.frombuffer(token_bytes, dtype=np.dtype(dtype)).reshape(shape)
    ns = reference_namespace(master_path)
    # The model's seed, without moving the grader's own RNG, and initialised in float32 as in a
    # fresh probe worker whatever this process's default dtype (code run in it may have set one).
    default_dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config["seed"])
            model = ns["HybridTransformerLM"](config["vocab_size"], config["embedding_dim"], config["layer_pattern"],
                                              config["num_heads"], config["max_seq_len"],
                                              hidden_dim=config["hidden_dim"]).to(dtype=torch.float64)
    finally:
        torch.set_default_dtype(default_dtype)
    parameters = list(model.named_parameters())
    if len(parameters) > HYBRID_MAX_PARAMETERS:
        raise ValueError(f"the hybrid model has {len(parameters)} parameters; the probe keeps the gradients of "
                         f"{HYBRID_MAX_PARAMETERS} (raise cases.HYBRID_MAX_PARAMETERS)")
    for block in model.blocks:
        if isinstance(block.attn, ns["LinearAttention"]):
            layer = block.attn
            params = {f"{p}.{w}": getattr(getattr(layer, p), w) for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                      for w in ("weight", "bias")}
            params["gamma_logit"] = layer.gamma_logit
            block.attn.forward = (lambda x, params=params, heads=layer.num_heads:
                                  attention(params, x, heads, variant, eps))
    ids = torch.tensor(tokens, dtype=torch.long)
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    gradients = tuple(TrustedGradient(name, np.zeros(tuple(p.shape)) if p.grad is None else p.grad.numpy(),
                                      p.grad is not None, not (variant.measured_decay and name.endswith("gamma_logit")))
                      for name, p in parameters)
    run = TrustedRun(logits.detach().numpy(), loss.detach().numpy(), gradients)
    for array in (run.logits, run.loss, *(g.value for g in gradients)):
        array.flags.writeable = False   # shared by every submission: no check may change it
    return run


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - LISTED} more)" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def run_problems(out: CaseOutput, trusted: TrustedRun, tolerance: float, floor: float, basis: str) -> list[str]:
    """Every way the arrays the probe exported differ from ``trusted`` (empty: none), most
    telling first. A gradient array that is absent means the parameter got no gradient.

    Logits and loss are judged by the scaled rule. Gradients are small (a decay's is ~5e-5, under
    the float32 tolerance itself), so each is judged relative to its own largest entry, or to
    ``floor`` times the model's largest gradient when that is larger (a gradient that is zero
    in exact arithmetic, a key bias under softmax, is rounding noise on both sides)."""
    problems = []
    for what, verb, expected in (("logits", "differ", trusted.logits), ("loss", "differs", trusted.loss)):
        result = compare(out.arrays.get(what), expected)
        if not within(result, scaled(tolerance, expected)):
            problems.append(f"the {what} {verb} from the trusted model built from the same seed ({basis}): "
                            f"{describe(result)}")
    missing, wrong = [], []
    largest = max(float(np.abs(g.value).max(initial=0.0)) for g in trusted.gradients)
    for index, gradient in enumerate(trusted.gradients):
        got = out.arrays.get(gradient_output(index))
        if not gradient.judged:
            continue
        if got is None:
            if gradient.reached:
                missing.append(gradient.name)
            continue
        bound = tolerance * max(float(np.abs(gradient.value).max(initial=0.0)), floor * largest)
        result = compare(got, gradient.value)
        if not within(result, bound):
            wrong.append(f"{gradient.name}: {describe(result, GRADIENT_AXES.get(gradient.value.ndim))}, beyond "
                         f"{bound:.3g} ({tolerance:g} of its scale)")
    if missing:
        problems.append(f"no gradient reached {_listed(missing)}: the loss must depend on every parameter "
                        "(is the decay detached or hard-coded?)")
    if wrong:
        more = f" (and {len(wrong) - 1} more parameters)" if len(wrong) > 1 else ""
        problems.append(f"the gradients differ from the trusted model's backward pass ({basis}): the gradient of "
                        f"{wrong[0]}{more}")
    return problems


def run_failure(out: CaseOutput, case: ProbeCase) -> str | None:
    """Why the hybrid model did not run forward and backward with the layer (None: it did)."""
    if out.status != "ok":
        return f"{RUN_FAILED}: HybridTransformerLM forward/backward: {out.error or out.status}"
    linear_layers = case.config["layer_pattern"].count("linear")
    calls = out.info.get("linear_forward_calls")   # reported by the student's process: a reason to fail only
    if calls != linear_layers:
        return f"your LinearAttention.forward ran {calls} times in a model with {linear_layers} linear layers"
    return None


def hybrid_problem(out: CaseOutput, case: ProbeCase, master_path: Path, variant: Variant,
                   tolerance: float, floor: float) -> str | None:
    """What is wrong with one run of the hybrid model at ``tolerance`` (None: nothing), against
    the trusted model whose layers compute ``variant``; ``floor`` as in ``run_problems``."""
    failure = run_failure(out, case)
    if failure:
        return failure
    basis = "with the reference layer" if variant == REFERENCE else "whose layers compute what your forward does"
    found = []
    for eps in EPS_CONVENTIONS:
        problems = run_problems(out, trusted_run(master_path, case.config, case.arrays["tokens"], variant, eps),
                                tolerance, floor, basis)
        if not problems:
            return None
        found.append(problems)
    return min(found, key=len)[0]


def hybrid_integration_problem(out: CaseOutput, case: ProbeCase, master_path: Path) -> str | None:
    """What is wrong with the layer inside the model, whatever the layer computes (None:
    nothing): it ran forward and backward, its logits and loss have the trusted model's shapes
    and are finite, and every parameter the reference's backward reaches received a finite,
    non-zero gradient of its shape. gamma_logit is left out: whether the decay depends on it is
    the decay items' concern (a forward without a decay leaves it without a gradient)."""
    failure = run_failure(out, case)
    if failure:
        return failure
    trusted = trusted_run(master_path, case.config, case.arrays["tokens"], REFERENCE, "add")
    for what, expected in (("logits", trusted.logits), ("loss", trusted.loss)):
        got = out.arrays.get(what)
        if got is None or got.shape != expected.shape:
            return (f"the {what} have shape {None if got is None else tuple(got.shape)}, expected "
                    f"{tuple(expected.shape)}")
        if not np.all(np.isfinite(got)):
            return f"the {what} are not finite ({describe(compare(got, got))})"
    missing = []
    for index, gradient in enumerate(trusted.gradients):
        if not gradient.reached or gradient.name.endswith("gamma_logit"):
            continue
        got = out.arrays.get(gradient_output(index))
        if got is None or got.shape != gradient.value.shape or not np.all(np.isfinite(got)) or (
                not np.any(got) and np.any(gradient.value)):
            missing.append(gradient.name)
    if missing:
        return (f"no finite, non-zero gradient of the right shape reached {_listed(missing)}: the loss must depend "
                "on every parameter")
    return None
