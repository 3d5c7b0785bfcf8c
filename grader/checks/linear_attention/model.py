"""The computation students must write, and the named ways of getting it wrong.

The reference is written here from the equations (torch in float64, none of the notebook's
code): per head, with gamma_h = sigmoid(gamma_logit_h) and phi = elu + 1,

    out_t = sum_{i<=t} gamma^(t-i) phi(q_t).phi(k_i) v_i / (sum_{i<=t} gamma^(t-i) phi(q_t).phi(k_i) + EPS)
    S_t = gamma S_{t-1} + phi(k_t) v_t^T,   z_t = gamma z_{t-1} + phi(k_t).

A ``Variant`` is that computation with some of its parts changed: each field is one concern
of the rubric, and each non-default value is a mistake the module warns about (or one seen in
student code). The checks find the variant a student's form computes (``identify``) and then
judge each concern against that variant with only that concern put right, so one mistake
costs the item of its own concern and no other (error carried forward). A decay that no named
mistake explains but that is some function of each head's own logit is measured instead
(``fit_decay``): the variant then carries the factor found for each gamma_logit (``fitted``).

EPS is not a concern: ``+ EPS``, no EPS and ``clamp(min=EPS)`` are all correct, and the probe's
inputs keep phi(q).z far above EPS, where the three agree to float64 precision except for
``+ EPS``, whose outputs both conventions are compared with (``EPS_CONVENTIONS``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Iterator

import numpy as np

from grader.checks import torch

EPS = 1e-6
EPS_CONVENTIONS = ("add", "none")   # out = num / (den + EPS), or num / den (= clamp(min=EPS) here)

# Per-token decay factor as a function of gamma and of its logit (per head), by name.
DECAY_FACTORS = {
    "gamma": lambda g, logit: g,
    "none": lambda g, logit: torch.ones_like(g),
    "squared": lambda g, logit: g * g,
    "one_minus": lambda g, logit: 1 - g,
    "raw_logit": lambda g, logit: logit,     # gamma_logit itself, without the sigmoid
    "exp_neg_logit": lambda g, logit: torch.exp(-logit),   # the logit read as a rate: near 0 where gamma is near 1
}
HEAD_ORDERS = {
    "own": lambda g: g,
    "flipped": lambda g: g.flip(0),
    "rolled": lambda g: g.roll(1),
    "first": lambda g: g[:1].expand_as(g),
    "mean": lambda g: g.mean().expand_as(g),   # one decay for the layer: the heads' mean
}


@dataclass(frozen=True)
class Variant:
    """One computation of the layer; the defaults are the reference."""

    normalizer: str = "divide"      # divide | missing | unmasked_row (denominator over the whole row)
    #                                 | columns (row t divided by the sum of column t: the query axis)
    features: str = "phi_qk"        # phi_qk | phi_q_only (k without phi) | phi_v_too | elu (no + 1)
    future: str = "hidden"          # hidden | visible (weights gamma^|t-i| for i > t too)
    diagonal: str = "included"      # included | hidden (i < t, gamma^(t-i)) | read_before_write (gamma^(t-i-1))
    decay_s: str = "gamma"          # the factor applied to S (the numerator): see DECAY_FACTORS
    decay_z: str = "gamma"          # the factor applied to z (the denominator)
    heads: str = "own"              # which decay each head uses: see HEAD_ORDERS
    readout: str = "qS"             # qS | transposed (phi(q) contracted with S's value index)
    merge: str = "transpose"        # transpose | reshape_only ((B, H, T, d_h) reshaped to (B, T, D) as is)
    batch: str = "own"              # own | keys_summed (each query scored against the batch's keys summed)
    #                                 | shared_state (every sequence adds its phi(k) v^T and phi(k) to all)
    carry: str = "updated"          # updated | given (step returns the state it was given)
    decay_order: str = "decay_then_add"   # decay_then_add | add_then_decay (S = gamma (S + phi(k) v^T))
    # With decay_s = decay_z = "fitted": the per-token factor measured for each gamma_logit value
    # of the probe's inputs, (logit, factor) pairs (``fit_decay``).
    fitted: tuple[tuple[float, float], ...] = ()

    def put_right(self, concern: str) -> Variant:
        """This variant with the fields of ``concern`` set back to the reference."""
        return replace(self, **{name: getattr(REFERENCE, name) for name in CONCERN_FIELDS[concern]})

    def mistakes(self) -> list[tuple[str, str]]:
        """(field, value) of every field that differs from the reference."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) != getattr(REFERENCE, f.name)]

    @property
    def applies_decay(self) -> bool:
        return not (self.decay_s == "none" and self.decay_z == "none")

    @property
    def measured_decay(self) -> bool:
        """Whether its decay is the factor measured per gamma_logit (``fitted``), not a function of it."""
        return "fitted" in (self.decay_s, self.decay_z)

    def overflow_free_tokens(self, logits: np.ndarray, tokens: int, limit: float) -> int:
        """How many leading positions keep every decay weight below ``limit``: a decay factor
        above 1 (the raw logit) grows as factor^(t-i) until the computation overflows, and the
        positions past that are not compared (the decay items charge the factor)."""
        logit = torch.as_tensor(np.asarray(logits, dtype=np.float64))
        largest = max(float(factor.abs().max()) if factor.numel() else 0.0
                      for factor in _factors(self, torch.sigmoid(logit), logit))
        if largest <= 1.0:
            return tokens
        return min(tokens, int(np.log(limit) / np.log(largest)) + 1)


REFERENCE = Variant()

# Which rubric concern each field belongs to. ``readout`` and ``merge`` only have the
# equivalence item. A step that returns the state it was given (``carry``) shows no decay in
# that state: decay_recurrent, which judges the state step builds, charges it. A sequence that
# reads another sequence's tokens sees what it must not, as one that reads later tokens does:
# causality (which judges forward) charges ``batch``; in step alone, equivalence does.
CONCERN_FIELDS = {
    "normalization": ("normalizer", "features"),
    "causality": ("future", "batch"),
    "alignment": ("diagonal",),
    "decay": ("decay_s", "decay_z", "fitted", "decay_order", "carry"),
    "heads": ("heads",),
    "readout": ("readout",),
    "merge": ("merge",),
}
CONCERN_OF_FIELD = {name: concern for concern, names in CONCERN_FIELDS.items() for name in names}

# The single mistakes, grouped by the fields they change (a group changes fields together).
_SINGLE_MISTAKES: dict[str, list[dict[str, str]]] = {
    "normalizer": [{"normalizer": "missing"}, {"normalizer": "unmasked_row"}, {"normalizer": "columns"}],
    "features": [{"features": "phi_q_only"}, {"features": "phi_v_too"}, {"features": "elu"}],
    "future": [{"future": "visible"}],
    "diagonal": [{"diagonal": "hidden"}, {"diagonal": "read_before_write"}],
    "decay": [{"decay_s": d, "decay_z": d} for d in ("none", "squared", "one_minus", "raw_logit", "exp_neg_logit")]
    + [{"decay_z": "none"}, {"decay_s": "none"}],
    "heads": [{"heads": h} for h in ("flipped", "rolled", "first", "mean")],
    "readout": [{"readout": "transposed"}],
    "merge": [{"merge": "reshape_only"}],
    "batch": [{"batch": "keys_summed"}, {"batch": "shared_state"}],
    "state": [{"carry": "given"}, {"decay_order": "add_then_decay"}],
}
# What each form can get wrong: the recurrent form cannot see the future or sum a whole row or
# column; its readout is the only one that can be transposed and its state the only one that
# can be carried wrong; only the parallel form merges (B, H, T, d_h) into (B, T, D).
FORM_GROUPS = {
    "forward": ("normalizer", "features", "future", "diagonal", "decay", "heads", "merge", "batch"),
    "step": ("normalizer", "features", "diagonal", "decay", "heads", "readout", "state", "batch"),
}
_NOT_IN_STEP = {("normalizer", "unmasked_row"), ("normalizer", "columns"), ("batch", "keys_summed")}


def candidates(form: str, pairs: bool) -> Iterator[Variant]:
    """Every single mistake of ``form`` (or every pair of mistakes in different groups)."""
    singles = [(group, change) for group in FORM_GROUPS[form] for change in _SINGLE_MISTAKES[group]
               if form != "step" or not set(change.items()) & _NOT_IN_STEP]
    if not pairs:
        for _, change in singles:
            yield replace(REFERENCE, **change)
        return
    for (group_a, a), (group_b, b) in itertools.combinations(singles, 2):
        if group_a != group_b:
            yield replace(REFERENCE, **a, **b)


# ----------------------------------------------------------------------------- computing it

def _tensor(arrays: dict[str, np.ndarray], name: str) -> torch.Tensor:
    return torch.as_tensor(np.asarray(arrays[name], dtype=np.float64))


def _phi(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a > 0, a + 1.0, torch.exp(torch.clamp(a, max=0.0)))


def _elu(a: torch.Tensor) -> torch.Tensor:
    """elu alone: the feature map without its + 1, negative for a < 0."""
    return _phi(a) - 1.0


def _heads(a: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, d_h)."""
    batch, tokens, dim = a.shape
    return a.reshape(batch, tokens, heads, dim // heads).transpose(1, 2)


def _project(params: dict[str, torch.Tensor], x: torch.Tensor, proj: str) -> torch.Tensor:
    return x @ params[f"{proj}.weight"].T + params[f"{proj}.bias"]


def parameters(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The layer's parameters from a probe case's arrays, as float64 tensors."""
    names = [f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for w in ("weight", "bias")]
    return {name: _tensor(arrays, name) for name in names + ["gamma_logit"]}


def _qkv(params: dict[str, torch.Tensor], x: torch.Tensor, heads: int, variant: Variant):
    phi = _elu if variant.features == "elu" else _phi
    q = phi(_heads(_project(params, x, "q_proj"), heads))
    k = _heads(_project(params, x, "k_proj"), heads)
    v = _heads(_project(params, x, "v_proj"), heads)
    k = k if variant.features == "phi_q_only" else phi(k)
    v = _phi(v) if variant.features == "phi_v_too" else v
    return q, k, v


def _decays(params: dict[str, torch.Tensor], variant: Variant) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head factors applied to S and to z, shape (H,)."""
    order = HEAD_ORDERS[variant.heads]
    return _factors(variant, order(torch.sigmoid(params["gamma_logit"])), order(params["gamma_logit"]))


FITTED_MATCH = 1e-6   # a gamma_logit is looked up among the fitted ones this close (float32 logits too)


def _factors(variant: Variant, gamma: torch.Tensor, logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    def factor(decay: str) -> torch.Tensor:
        if decay != "fitted":
            return DECAY_FACTORS[decay](gamma, logit)
        found = []
        for value in logit.tolist():
            match = [f for known, f in variant.fitted if abs(known - value) <= FITTED_MATCH * max(1.0, abs(value))]
            if not match:
                raise KeyError(f"no decay was measured for gamma_logit {value:g}")
            found.append(match[0])
        return torch.tensor(found, dtype=logit.dtype)
    return factor(variant.decay_s), factor(variant.decay_z)


def attention(params: dict[str, torch.Tensor], x: torch.Tensor, heads: int,
              variant: Variant = REFERENCE, eps: str = "add") -> torch.Tensor:
    """The parallel form of ``variant``: x (B, T, D) -> (B, T, D), in x's dtype (float64 here)."""
    q, k, v = _qkv(params, x, heads, variant)
    tokens = x.shape[1]
    positions = torch.arange(tokens, dtype=x.dtype)
    lag = positions[:, None] - positions[None, :]
    visible = torch.ones_like(lag, dtype=torch.bool) if variant.future == "visible" else lag >= 0
    if variant.diagonal != "included":
        visible = visible & (lag != 0)
    if variant.carry == "given":   # every step starts from the fresh state again: token t alone
        visible = visible & (lag == 0)
    exponent = (lag.abs() - (1.0 if variant.diagonal == "read_before_write" else 0.0)).clamp(min=0)
    exponent = exponent + (1.0 if variant.decay_order == "add_then_decay" else 0.0)
    factor_s, factor_z = _decays(params, variant)

    index = exponent.long()

    def weights(factor: torch.Tensor) -> torch.Tensor:   # (H, T, T)
        return _decay_weights(factor, index, visible)

    keys, values = _batch_partners(k, v, variant.batch)    # (B, C, H, T, d): whose tokens each sequence reads
    scores = torch.einsum("bhtd,bchsd->bchts", q, keys)   # (B, C, H, T, T)
    if variant.readout == "transposed":
        numerator = torch.einsum("bchts,bchsd->bhtd", torch.einsum("bhtd,bchsd->bchts", q, values)
                                 * weights(factor_s), keys)
    else:
        numerator = torch.einsum("bchts,bchsd->bhtd", scores * weights(factor_s), values)
    if variant.normalizer == "missing":
        out = numerator
    else:
        row = scores if variant.normalizer == "unmasked_row" else scores * weights(factor_z)
        denominator = (row.sum(-2).sum(1).unsqueeze(-1) if variant.normalizer == "columns"
                       else row.sum(-1).sum(1).unsqueeze(-1))
        out = numerator / (denominator + EPS if eps == "add" else denominator)
    batch, _, _, head_dim = out.shape
    merged = (out if variant.merge == "reshape_only" else out.transpose(1, 2)).reshape(batch, tokens, heads * head_dim)
    return _project(params, merged, "out_proj")


def _decay_weights(factor: torch.Tensor, exponent: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """factor_h ** exponent where visible, else 0: (H,) with (T, T) whole-number exponents ->
    (H, T, T). Each power is taken once per factor and gathered (an element-wise pow per entry
    was most of the checks' time)."""
    powers = factor[:, None] ** torch.arange(int(exponent.max()) + 1, dtype=factor.dtype)
    return torch.where(visible, powers[:, exponent], torch.zeros((), dtype=factor.dtype))


def _batch_partners(k: torch.Tensor, v: torch.Tensor, batch: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values (B, C, H, T, d) each sequence of the batch reads, C per sequence: its
    own (C = 1); the keys summed over the batch with its own values (C = 1); every sequence's
    keys and values (C = B, a state shared by the batch)."""
    if batch == "keys_summed":
        return k.sum(0, keepdim=True).expand_as(k).unsqueeze(1), v.unsqueeze(1)
    if batch == "shared_state":
        return k.unsqueeze(0).expand(k.shape[0], *k.shape), v.unsqueeze(0).expand(v.shape[0], *v.shape)
    return k.unsqueeze(1), v.unsqueeze(1)


def state_after(params: dict[str, torch.Tensor], x: torch.Tensor, heads: int,
                variant: Variant = REFERENCE) -> tuple[np.ndarray, np.ndarray]:
    """(S, z) after stepping through all of x from a zero state: S (B, H, d_k, d_v) = sum_i
    f_s^(T-1-i) phi(k_i) v_i^T and z (B, H, d_k) = sum_i f_z^(T-1-i) phi(k_i) (one factor more
    when the state is decayed after the write; the zero state when step hands back its input)."""
    _, k, v = _qkv(params, x, heads, variant)
    tokens = x.shape[1]
    age = (tokens - 1 - torch.arange(tokens, dtype=x.dtype))          # (T,)
    age = age + (1.0 if variant.decay_order == "add_then_decay" else 0.0)
    factor_s, factor_z = _decays(params, variant)
    if variant.carry == "given":
        k, v = torch.zeros_like(k), torch.zeros_like(v)
    S = torch.einsum("bhtd,bhte,ht->bhde", k, v, factor_s[:, None] ** age)
    z = torch.einsum("bhtd,ht->bhd", k, factor_z[:, None] ** age)
    if variant.batch == "shared_state":
        S, z = S.sum(0, keepdim=True).expand_as(S), z.sum(0, keepdim=True).expand_as(z)
    return S.numpy(), z.numpy()


FIT_GRID = (0.0, 1.5, 31)   # factors tried before refining: torch.linspace's start, end and count
FIT_STEPS = 64   # golden-section steps: a bracket of 0.1 shrinks below 1e-14


def fit_decay(params: dict[str, torch.Tensor], x: torch.Tensor, heads: int,
              y: np.ndarray) -> np.ndarray | None:
    """The per-token factor of each head, f_h in [0, 1.5], that brings the reference's parallel
    form, weighting position i by f_h^(t-i), closest to the outputs ``y`` (B, T, D) of the layer
    on ``x`` (under the EPS convention that fits best); None when out_proj cannot be undone. Each
    head is fitted on its own part of the output, read back through out_proj: a grid, then a
    golden-section search on the max-abs error around the best point of the grid."""
    weight, bias = params["out_proj.weight"], params["out_proj.bias"]
    if not bool(torch.isfinite(torch.as_tensor(y)).all()) or float(torch.linalg.cond(weight)) > 1e8:
        return None
    batch, tokens, dim = x.shape
    merged = torch.linalg.solve(weight, (torch.as_tensor(y, dtype=torch.float64) - bias).reshape(-1, dim).T).T
    target = merged.reshape(batch, tokens, heads, dim // heads).transpose(1, 2)
    q, k, v = _qkv(params, x, heads, REFERENCE)
    scores = q @ k.transpose(-1, -2)
    positions = torch.arange(tokens)
    lag = positions[:, None] - positions[None, :]
    causal, exponent = lag >= 0, lag.clamp(min=0)
    fit_grid = torch.linspace(*FIT_GRID, dtype=torch.float64)
    best = None
    for eps in EPS_CONVENTIONS:
        def error(factor: torch.Tensor, eps: str = eps) -> torch.Tensor:   # (H,) -> max-abs error per head
            weighted = scores * _decay_weights(factor, exponent, causal)
            denominator = weighted.sum(-1, keepdim=True)
            out = (weighted @ v) / (denominator + EPS if eps == "add" else denominator)
            return (out - target).abs().amax(dim=(0, 2, 3)).nan_to_num(nan=np.inf)
        grid = torch.stack([error(torch.full((heads,), float(f), dtype=torch.float64)) for f in fit_grid])
        index = grid.argmin(dim=0)
        low = fit_grid[(index - 1).clamp(min=0)]
        high = fit_grid[(index + 1).clamp(max=len(fit_grid) - 1)]
        ratio = (5 ** 0.5 - 1) / 2
        left, right = high - ratio * (high - low), low + ratio * (high - low)
        at_left, at_right = error(left), error(right)
        for _ in range(FIT_STEPS):   # one new point per head and step
            keep_left = at_left <= at_right
            low, high = torch.where(keep_left, low, left), torch.where(keep_left, right, high)
            new = torch.where(keep_left, high - ratio * (high - low), low + ratio * (high - low))
            at_new = error(new)
            left, right = torch.where(keep_left, new, right), torch.where(keep_left, left, new)
            at_left, at_right = torch.where(keep_left, at_new, at_right), torch.where(keep_left, at_left, at_new)
        factor = (low + high) / 2
        worst = float(error(factor).max())
        if best is None or worst < best[0]:
            best = (worst, factor.numpy())
    return best[1]


def recurrence(params: dict[str, torch.Tensor], x: torch.Tensor, heads: int) -> torch.Tensor:
    """The reference recurrence itself, token by token: the cross-check of ``attention``."""
    q, k, v = _qkv(params, x, heads, REFERENCE)
    gamma = torch.sigmoid(params["gamma_logit"])[None, :, None]
    batch, _, tokens, head_dim = q.shape
    S = torch.zeros(batch, heads, head_dim, head_dim, dtype=x.dtype)
    z = torch.zeros(batch, heads, head_dim, dtype=x.dtype)
    out = torch.zeros_like(q)
    for t in range(tokens):
        S = gamma[..., None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        z = gamma * z + k[:, :, t]
        out[:, :, t] = (torch.einsum("bhd,bhde->bhe", q[:, :, t], S)
                        / ((q[:, :, t] * z).sum(-1, keepdim=True) + EPS))
    return _project(params, out.transpose(1, 2).reshape(batch, tokens, heads * head_dim), "out_proj")


# ----------------------------------------------------------------------------- naming it

# What each mistake is, in the student's terms, per form.
_SAYS = {
    ("normalizer", "missing"): {
        "forward": "forward returns the unnormalized sum: the normalizer is missing (divide each row by "
                   "its sum of decayed weights + EPS)",
        "step": "step returns phi(q).S without dividing by phi(q).z + EPS: the normalizer is missing"},
    ("normalizer", "unmasked_row"): {
        "forward": "forward's denominator sums the scores of the whole row: it must use the same decayed, "
                   "causal weights as the numerator"},
    ("normalizer", "columns"): {
        "forward": "forward's denominator sums the weights over the wrong axis (the query axis, sum(dim=-2), "
                   "which also takes in later tokens): row t must be divided by the sum of its own decayed "
                   "weights over i <= t, sum(dim=-1)"},
    ("features", "elu"): "{form}'s feature map is not positive (elu without the + 1?): phi = elu + 1 > 0 keeps "
                         "every phi(q).phi(k) positive, so the normalizer cannot come near 0 or change sign",
    ("features", "phi_q_only"): "{form} applies the feature map to q but not to k: both q and k go through "
                                "phi = elu + 1",
    ("features", "phi_v_too"): "{form} applies the feature map to v as well: only q and k go through phi",
    ("future", "visible"): "tokens after position t contribute: forward's mask must be 0 where i > t",
    ("diagonal", "hidden"): {
        "forward": "forward's mask hides the diagonal: token t must attend to itself (i <= t, with "
                   "weight gamma^0 = 1)",
        "step": "step's output leaves out the current token: add phi(k_t) v_t^T and phi(k_t) to the "
                "state before reading out"},
    ("diagonal", "read_before_write"): {
        "forward": "forward's mask hides the diagonal: token t must attend to itself (i <= t, with "
                   "weight gamma^0 = 1)",
        "step": "step reads the state before the current token is added (update S and z first, "
                "then read out)"},
    ("decay", "none"): {
        "forward": "forward ignores gamma: weight position i by gamma^(t-i)",
        "step": "step ignores gamma: decay S and z by gamma before adding the new token"},
    ("decay", "squared"): "{form} applies gamma twice per token (gamma^2): one token of distance is one "
                          "factor gamma",
    ("decay", "one_minus"): "{form} uses 1 - gamma as the decay: gamma = sigmoid(gamma_logit) is the "
                            "fraction of the state kept per token",
    ("decay", "raw_logit"): "{form} uses the raw gamma_logit as the decay: the decay is gamma = "
                            "sigmoid(gamma_logit) (self.decay), in (0, 1); the logit itself can be negative or "
                            "above 1, and a factor above 1 grows without bound",
    ("decay", "z_only"): {
        "forward": "forward decays the denominator but not the numerator: both use gamma^(t-i)",
        "step": "z is decayed but S is not: decay the state S too"},
    ("decay", "s_only"): {
        "forward": "forward decays the numerator but not the denominator: both use gamma^(t-i)",
        "step": "S is decayed but z is not: decay the normalizer z too"},
    ("heads", "flipped"): "each head uses another head's decay (heads are mixed up): head h must use gamma_h",
    ("heads", "rolled"): "each head uses another head's decay (heads are mixed up): head h must use gamma_h",
    ("heads", "first"): "every head uses head 0's decay: head h must use its own gamma_h",
    ("heads", "mean"): "every head uses the mean of the heads' decays: head h must use its own gamma_h",
    ("decay", "exp_neg_logit"): "{form} uses exp(-gamma_logit) as the decay: the decay is gamma = "
                                "sigmoid(gamma_logit) (self.decay), close to 1 for a large logit, where "
                                "exp(-gamma_logit) is close to 0",
    ("readout", "transposed"): "step reads the state out transposed: with S = phi(k) v^T the output is "
                               "phi(q)^T S, contracting q with S's key index",
    ("merge", "reshape_only"): "forward merges the heads without the transpose: the (B, H, T, d_h) output must "
                               "become (B, T, H, d_h) (transpose(1, 2)) before the reshape to (B, T, D); "
                               "without it each output row holds pieces of other positions, later ones too",
    ("batch", "keys_summed"): "forward scores each query against the keys of every sequence in the batch, summed "
                              "(an einsum whose key index names the batch axis with another letter?): a sequence "
                              "must see its own tokens only",
    ("batch", "shared_state"): "{form} mixes the sequences of a batch: every sequence's phi(k) v^T and phi(k) "
                               "reach every other's state (summed over the batch axis?); each sequence keeps its "
                               "own (S, z)",
    ("carry", "given"): "step returns the state it was given, not the one it computed: return the updated "
                        "(S, z), so that the next call goes on from it",
    ("decay_order", "add_then_decay"): "step decays the state once more than the recurrence says: S = gamma S "
                                       "+ phi(k) v^T and z = gamma z + phi(k) (decay, then add the token), not "
                                       "gamma (S + phi(k) v^T); the outputs agree, but the state is gamma times "
                                       "the recurrence's",
}


def _decay_mistake(variant: Variant) -> str | None:
    s, z = variant.decay_s, variant.decay_z
    if s == z:
        return None if s == "gamma" else s
    return "s_only" if z == "none" and s == "gamma" else "z_only" if s == "none" and z == "gamma" else f"{s}/{z}"


def says(variant: Variant, form: str, concern: str | None = None) -> str | None:
    """What ``variant``'s mistakes are (those of ``concern`` only, if given), for a student."""
    mistakes = [(name, value) for name, value in variant.mistakes() if name not in ("decay_s", "decay_z", "fitted")]
    decay = _decay_mistake(variant)
    mistakes += [("decay", decay)] if decay else []
    found = []
    for group, value in mistakes:
        if concern is not None and CONCERN_OF_FIELD.get(group, "decay") != concern:
            continue
        text = (_fitted_says(variant, form) if (group, value) == ("decay", "fitted") else
                _SAYS.get((group, value), f"{form} gets the decay wrong ({value})" if group == "decay" else None))
        text = text.get(form) if isinstance(text, dict) else text
        if text:
            found.append(text.format(form=form))
    return "; ".join(found) or None


def _fitted_says(variant: Variant, form: str) -> str:
    """A fitted decay, by what was measured: the factor per token where it is not sigmoid(logit)."""
    differ = [(logit, factor, 1 / (1 + np.exp(-logit))) for logit, factor in variant.fitted]
    listed = "; ".join(f"{factor:.6g} for gamma_logit = {logit:g} (sigmoid gives {gamma:.6g})"
                       for logit, factor, gamma in differ if abs(factor - gamma) > 1e-9)
    return (f"{form}'s decay is not gamma = sigmoid(gamma_logit) (self.decay); its factor per token, measured: "
            f"{listed}")
