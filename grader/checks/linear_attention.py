"""Hidden checks for the linear_attention assignment.

The reference here is independent of the notebook: plain numpy in float64, written from the
recurrence equations. Every known pitfall has a named variant of that reference; when a
student's output misses the reference, the variant it matches names the bug in the message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict
from grader.checks.hybrid import check_hybrid
from grader.probe import CaseOutput, ProbeCase
from grader.rubric import Rubric

EPS = 1e-6
STUDENT_METHODS = frozenset({"forward", "step"})
CLASS_NAME = "LinearAttention"

# (batch, tokens, embedding_dim, heads): batch 1 and > 1, T from 1 to 256, d_h from 2 to 8.
SHAPES = ((1, 1, 8, 2), (2, 17, 12, 3), (3, 64, 16, 4), (1, 256, 32, 4))
DTYPES = ("float64", "float32")


def _logits(kind: str, heads: int) -> list[float]:
    """Decay logits per head; 50 gives gamma == 1.0 exactly in float64 and float32."""
    per_head = [4.6, 0.0, 2.0, -1.0]
    return {"none": [50.0] * heads, "mild": [3.0] * heads, "strong": [0.0] * heads,
            "per_head": per_head[:heads]}[kind]


GAMMAS = ("none", "mild", "strong", "per_head")

# Cases whose query bias is strongly negative: phi(q).z is then comparable to EPS, which makes
# a uniform extra factor of gamma (an exponent off by one) visible instead of cancelling.
SMALL_QUERY_BIAS = -14.0
# A resumed run and an uninterrupted one do the same arithmetic in the same order.
RESUME_TOLERANCE = 1e-9
RESUME_TOKENS, RESUME_SEGMENTS = 16, [[0, 9], [9, 16]]
UNUSED_STATE = "not judged, because step does not go on from the state it returned"


def segments(tokens: int) -> list[list[int]] | None:
    """Where a step run is cut into separate workers (thirds), each resuming from the state the
    previous one returned: the probe's harness passes nothing else between them, so a step
    that needs more than (x_t, state) fails there (see harness/probe_harness.py)."""
    cuts = sorted({tokens // 3, 2 * tokens // 3} - {0, tokens})
    bounds = [0, *cuts, tokens]
    return [[a, b] for a, b in zip(bounds, bounds[1:])] if cuts else None


# ----------------------------------------------------------------------------- inputs

def _weights(rng: np.random.Generator, dim: int, query_bias: float | None) -> dict[str, np.ndarray]:
    bound = 1.0 / math.sqrt(dim)
    arrays = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        arrays[f"{proj}.weight"] = rng.uniform(-bound, bound, (dim, dim))
        arrays[f"{proj}.bias"] = rng.uniform(-bound, bound, dim)
    if query_bias is not None:
        arrays["q_proj.bias"] = np.full(dim, query_bias)
        arrays["q_proj.weight"] *= 0.1
    return arrays


def _case_name(kind: str, shape: int, gamma: str, dtype: str, extra: str = "") -> str:
    return f"{kind}_s{shape}_{gamma}{extra}_{dtype}"


def _form_cases(shape_index: int, gamma: str, seed: list[int], query_bias: float | None = None,
                extra: str = "") -> list[ProbeCase]:
    """One input run through forward and through step, in float64 and in float32."""
    batch, tokens, dim, heads = SHAPES[shape_index]
    rng = np.random.default_rng(seed)
    arrays = _weights(rng, dim, query_bias)
    arrays["gamma_logit"] = np.array(_logits(gamma, heads))
    arrays["x"] = rng.standard_normal((batch, tokens, dim))
    config = {"embedding_dim": dim, "num_heads": heads}
    return [ProbeCase(_case_name(kind, shape_index, gamma, dtype, extra), kind,
                      {**config, "dtype": dtype, **({"segments": segments(tokens)} if kind == "steps" else {})},
                      arrays)
            for dtype in DTYPES for kind in ("forward", "steps")]


def probe_cases(rubric: Rubric) -> list[ProbeCase]:
    """Every input the harness runs, generated deterministically."""
    cases: list[ProbeCase] = []
    for shape_index in range(len(SHAPES)):
        for gamma in GAMMAS:
            cases += _form_cases(shape_index, gamma, [shape_index, GAMMAS.index(gamma)])
    # Tiny phi(q).z for the decay items (see SMALL_QUERY_BIAS).
    for gamma in ("mild", "strong"):
        cases += _form_cases(1, gamma, [7, GAMMAS.index(gamma)], SMALL_QUERY_BIAS, "-smallq")
    # Causality: the same weights on an input whose tokens after `cut` are replaced.
    for shape_index in (1, 2, 3):
        batch, tokens, dim, heads = SHAPES[shape_index]
        rng = np.random.default_rng([11, shape_index])
        arrays = _weights(rng, dim, None)
        arrays["gamma_logit"] = np.array(_logits("per_head", heads))
        x = rng.standard_normal((batch, tokens, dim))
        cut = tokens // 2
        changed = x.copy()
        changed[:, cut + 1:] = rng.standard_normal((batch, tokens - cut - 1, dim)) * 3
        config = {"embedding_dim": dim, "num_heads": heads, "dtype": "float64", "cut": cut}
        cases.append(ProbeCase(f"causal_s{shape_index}_original", "forward", config, {**arrays, "x": x}))
        cases.append(ProbeCase(f"causal_s{shape_index}_changed", "forward", config, {**arrays, "x": changed}))
    # State size after 1, 10 and 1000 steps.
    rng = np.random.default_rng(13)
    arrays = _weights(rng, 16, None)
    arrays["gamma_logit"] = np.array(_logits("per_head", 4))
    arrays["x"] = rng.standard_normal((2, 1000, 16))
    cases.append(ProbeCase("state_growth", "state_growth",
                           {"embedding_dim": 16, "num_heads": 4, "dtype": "float64",
                            "checkpoints": [1, 10, 1000]}, arrays))
    # Resuming from a state: one run in a single worker, the same run cut in two workers.
    rng = np.random.default_rng(17)
    arrays = _weights(rng, 12, None)
    arrays["gamma_logit"] = np.array(_logits("per_head", 3))
    arrays["x"] = rng.standard_normal((2, RESUME_TOKENS, 12))
    config = {"embedding_dim": 12, "num_heads": 3, "dtype": "float64"}
    cases.append(ProbeCase("resume_whole", "steps", config, arrays))
    cases.append(ProbeCase("resume_split", "steps", {**config, "segments": RESUME_SEGMENTS}, arrays))
    rng = np.random.default_rng(19)
    cases.append(ProbeCase("hybrid", "hybrid",
                           {"vocab_size": 23, "embedding_dim": 16, "num_heads": 4,
                            "layer_pattern": ["linear", "linear", "linear", "full"],
                            "max_seq_len": 32, "hidden_dim": 32, "seed": 3},
                           {"tokens": rng.integers(0, 23, (2, 20)).astype(np.float64)}))
    return cases


# ----------------------------------------------------------------------------- reference

def _phi(a: np.ndarray) -> np.ndarray:
    return np.where(a > 0, a + 1.0, np.exp(np.minimum(a, 0.0)))


def _project(x: np.ndarray, arrays: dict[str, np.ndarray], proj: str) -> np.ndarray:
    return x @ arrays[f"{proj}.weight"].T + arrays[f"{proj}.bias"]


def _split(a: np.ndarray, heads: int) -> np.ndarray:
    batch, tokens, dim = a.shape
    return a.reshape(batch, tokens, heads, dim // heads).transpose(0, 2, 1, 3)


def _qkv(arrays: dict[str, np.ndarray], x: np.ndarray, heads: int):
    q = _phi(_split(_project(x, arrays, "q_proj"), heads))
    k = _phi(_split(_project(x, arrays, "k_proj"), heads))
    v = _split(_project(x, arrays, "v_proj"), heads)
    return q, k, v


def _merge_and_project(out: np.ndarray, arrays: dict[str, np.ndarray]) -> np.ndarray:
    batch, heads, tokens, d = out.shape
    return _project(out.transpose(0, 2, 1, 3).reshape(batch, tokens, heads * d), arrays, "out_proj")


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


# Each variant: (numerator mask, denominator mask or None for "no normalizer"), from lag and gamma.
Mask = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _decayed(lag, g):
    return np.where(lag >= 0, g ** np.maximum(lag, 0), 0.0)


def _undecayed(lag, g):
    return np.where(lag >= 0, 1.0, 0.0)


VARIANTS: dict[str, tuple[Mask, Mask | None]] = {
    "reference": (_decayed, _decayed),
    "unnormalized": (_decayed, None),
    "undecayed": (_undecayed, _undecayed),
    "exponent_plus_one": (lambda lag, g: np.where(lag >= 0, g ** (np.maximum(lag, 0) + 1), 0.0),) * 2,
    "exponent_minus_one": (lambda lag, g: np.where(lag >= 0, g ** (np.maximum(lag, 0) - 1.0), 0.0),) * 2,
    "future_visible": (lambda lag, g: g ** np.abs(lag), lambda lag, g: g ** np.abs(lag)),
    "strict_past": (lambda lag, g: np.where(lag >= 1, g ** np.maximum(lag - 1, 0), 0.0),) * 2,
    "z_not_decayed": (_decayed, _undecayed),
    "s_not_decayed": (_undecayed, _decayed),
}
HEAD_VARIANTS = {
    "heads_flipped": lambda g: g[::-1],
    "heads_rolled": lambda g: np.roll(g, 1),
    "heads_first_decay": lambda g: np.full_like(g, g[0]),
}

DIAGNOSES = {
    "unnormalized": "it equals the unnormalized sum phi(q).S: the normalizer is missing "
                    "(divide by phi(q).z + EPS)",
    "undecayed": "it equals the result with no decay at all: this form ignores gamma",
    "exponent_plus_one": "it equals weights gamma^(t-i+1): the decay exponent is off by one "
                         "(token i = t must have weight gamma^0 = 1; decay the old state, not the new token)",
    "exponent_minus_one": "it equals weights gamma^(t-i-1): the decay exponent is off by one",
    "future_visible": "tokens after position t contribute: the mask must be 0 where i > t",
    "strict_past": "a token does not see itself: the state is read before the current token is "
                   "added (update S and z first, then read out)",
    "z_not_decayed": "S is decayed but z is not: decay the normalizer z too",
    "s_not_decayed": "z is decayed but S is not: decay the state S too",
    "heads_flipped": "each head uses another head's decay (heads are mixed up): head h must use gamma_h",
    "heads_rolled": "each head uses another head's decay (heads are mixed up): head h must use gamma_h",
    "heads_first_decay": "every head uses head 0's decay: head h must use its own gamma_h",
}


def reference_output(arrays: dict[str, np.ndarray], x: np.ndarray, heads: int,
                     variant: str = "reference", head_variant: str | None = None) -> np.ndarray:
    """Parallel form of the (possibly buggy) computation, in float64."""
    gammas = _sigmoid(np.asarray(arrays["gamma_logit"], dtype=np.float64))
    if head_variant:
        gammas = HEAD_VARIANTS[head_variant](gammas)
    q, k, v = _qkv(arrays, x, heads)
    tokens = x.shape[1]
    lag = np.arange(tokens)[:, None] - np.arange(tokens)[None, :]
    numerator_mask, denominator_mask = VARIANTS[variant]
    scores = q @ k.transpose(0, 1, 3, 2)                      # (B, H, T, T)
    g = gammas[None, :, None, None]
    numerator = (scores * numerator_mask(lag, g)) @ v
    if denominator_mask is None:
        return _merge_and_project(numerator, arrays)
    denominator = (scores * denominator_mask(lag, g)).sum(-1, keepdims=True) + EPS
    return _merge_and_project(numerator / denominator, arrays)


def recurrent_reference(arrays: dict[str, np.ndarray], x: np.ndarray, heads: int) -> np.ndarray:
    """The recurrence itself, token by token: the cross-check of ``reference_output``."""
    gammas = _sigmoid(np.asarray(arrays["gamma_logit"], dtype=np.float64))
    q, k, v = _qkv(arrays, x, heads)
    batch, _, tokens, d = q.shape
    S = np.zeros((batch, heads, d, d))
    z = np.zeros((batch, heads, d))
    out = np.zeros_like(q)
    g = gammas[None, :, None]
    for t in range(tokens):
        S = g[..., None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        z = g * z + k[:, :, t]
        out[:, :, t] = (np.einsum("bhd,bhde->bhe", q[:, :, t], S)
                        / ((q[:, :, t] * z).sum(-1, keepdims=True) + EPS))
    return _merge_and_project(out, arrays)


# ----------------------------------------------------------------------------- comparison

@dataclass(frozen=True)
class Mismatch:
    max_abs: float
    where: tuple[int, ...]
    expected: float
    got: float


def mismatch(got: np.ndarray, expected: np.ndarray) -> Mismatch | str:
    """Max-abs error and its first worst position, or a message when shapes differ."""
    if got.shape != expected.shape:
        return f"output shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if not np.all(np.isfinite(got)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return f"non-finite output at {_position(where)}"
    diff = np.abs(got.astype(np.float64) - expected)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return Mismatch(float(diff[where]), where, float(expected[where]), float(got[where]))


def _position(where: tuple[int, ...]) -> str:
    names = ("batch", "position", "channel")
    return ", ".join(f"{n} {i}" for n, i in zip(names, where)) if len(where) == 3 else str(where)


def _describe(result: Mismatch | str) -> str:
    if isinstance(result, str):
        return result
    return (f"max-abs error {result.max_abs:.3g} at ({_position(result.where)}): "
            f"expected {result.expected:.6g}, got {result.got:.6g}")


def _within(result: Mismatch | str, tolerance: float) -> bool:
    return isinstance(result, Mismatch) and result.max_abs <= tolerance


def diagnose(got: np.ndarray, arrays: dict[str, np.ndarray], x: np.ndarray, heads: int) -> str | None:
    """The named bug whose output ``got`` reproduces, if any, among the bugs this input can tell
    apart from the reference (at T = 1, say, no decay bug is visible)."""
    reference = reference_output(arrays, x, heads)
    candidates = [(name, reference_output(arrays, x, heads, name)) for name in VARIANTS
                  if name != "reference"]
    candidates += [(name, reference_output(arrays, x, heads, head_variant=name)) for name in HEAD_VARIANTS]
    best = None
    for name, expected in candidates:
        result = mismatch(got, expected)
        scale = 1e-6 * (1.0 + float(np.abs(expected).max()))
        distinct = not _within(mismatch(expected, reference), 100 * scale)
        if distinct and _within(result, scale) and (best is None or result.max_abs < best[1]):
            best = (name, result.max_abs)
    return DIAGNOSES[best[0]] if best else None


# ----------------------------------------------------------------------------- evaluation

class _Cases:
    """Probe outputs together with the inputs that produced them."""

    def __init__(self, context: CheckContext, cases: list[ProbeCase]):
        self.context = context
        self.inputs = {c.name: c for c in cases}
        self.tol64 = context.rubric.tolerances.get("float64_abs", 1e-10)
        self.tol32 = context.rubric.tolerances.get("float32_abs", 1e-4)

    def output(self, name: str) -> CaseOutput:
        return self.context.probe.cases.get(name) or CaseOutput("not_run", "the probe did not run this case")

    def label(self, name: str) -> str:
        case = self.inputs[name]
        x = case.arrays.get("x")
        shape = f"B={x.shape[0]}, T={x.shape[1]}, " if x is not None else ""
        gammas = _sigmoid(case.arrays["gamma_logit"]) if "gamma_logit" in case.arrays else None
        decay = "" if gammas is None else f", gamma per head {np.round(gammas, 4).tolist()}"
        small = ", tiny phi(q).z" if "smallq" in name else ""
        return f"{shape}D={case.config.get('embedding_dim')}, H={case.config.get('num_heads')}{decay}{small}"


def _float32_name(name: str) -> str:
    return name[: -len("float64")] + "float32"


def _compare_family(cases: _Cases, names: list[str], expected_for: Callable[[str], np.ndarray],
                    got_for: Callable[[CaseOutput], np.ndarray | None], what: str,
                    diagnose_form: bool = True) -> Verdict:
    """Every float64 case within the float64 tolerance; failing that, every case within the
    float32 tolerance in its float64 run or its float32 twin (code that only computes in float32)."""
    strict = _first_failure(cases, names, expected_for, got_for, cases.tol64, False)
    if strict is None:
        return Verdict("passed", f"{what}: all {len(names)} cases within {cases.tol64:g} (float64)")
    loose = _first_failure(cases, names, expected_for, got_for, cases.tol32, diagnose_form)
    if loose is None:
        return Verdict("passed", f"{what}: correct at float32 tolerance {cases.tol32:g}, so full marks; "
                                 f"in float64 it missed {cases.tol64:g} ({strict}). Your code seems to "
                                 "compute in float32 (a hard-coded dtype?); use the input's dtype.")
    return Verdict("failed", f"{what}: {loose}")


def _first_failure(cases: _Cases, names: list[str], expected_for, got_for, tolerance: float,
                   diagnose_form: bool) -> str | None:
    """The first case (float64 run, else its float32 twin) outside ``tolerance``, described."""
    for name in names:
        expected = expected_for(name)
        twin = _float32_name(name)
        runs = [name] + ([twin] if tolerance > cases.tol64 and twin in cases.inputs else [])
        results = []
        for run in runs:
            out = cases.output(run)
            got = got_for(out) if out.status == "ok" else None
            if got is None:
                results.append(f"case {cases.label(run)}: {out.error or out.status if out.status != 'ok' else 'no output was produced'}")
                continue
            result = mismatch(got, expected)
            if _within(result, tolerance):
                break
            message = f"case {cases.label(run)}: {_describe(result)}"
            if diagnose_form and isinstance(result, Mismatch):
                case = cases.inputs[run]
                found = diagnose(got, case.arrays, case.arrays["x"], case.config["num_heads"])
                hint = f"Diagnosis: {found}" if found else _resume_hint(case, got, expected, tolerance)
                if hint:
                    message += f". {hint}"
            results.append(message)
        else:
            return results[0]
    return None


def _resume_hint(case: ProbeCase, got: np.ndarray, expected: np.ndarray, tolerance: float) -> str | None:
    """When a segmented step run first goes wrong exactly where a segment starts."""
    starts = [start for start, _ in case.config.get("segments") or []][1:]
    wrong = np.argwhere(np.abs(got.astype(np.float64) - expected) > tolerance)
    first = int(wrong[:, 1].min()) if starts and wrong.size else None
    if first not in starts:
        return None
    return (f"Everything before token {first} is right; token {first} is where the probe went on from the "
            "state your step returned, in a fresh process on a fresh layer: step must compute from "
            "(x_t, state) alone, not from history kept elsewhere")


def _reference_for(cases: _Cases) -> Callable[[str], np.ndarray]:
    memo: dict[str, np.ndarray] = {}

    def expected(name: str) -> np.ndarray:
        if name not in memo:
            case = cases.inputs[name]
            memo[name] = reference_output(case.arrays, case.arrays["x"], case.config["num_heads"])
        return memo[name]
    return expected


def _names(kind: str, gammas: tuple[str, ...], extra: str = "") -> list[str]:
    return [_case_name(kind, s, g, "float64", extra) for s in range(len(SHAPES)) for g in gammas]


def _smallq(kind: str) -> list[str]:
    return [_case_name(kind, 1, g, "float64", "-smallq") for g in ("mild", "strong")]


def _y(out: CaseOutput) -> np.ndarray | None:
    return out.arrays.get("y")


def check_equivalence(cases: _Cases) -> Verdict:
    names = _names("forward", GAMMAS)
    step_of = {n: n.replace("forward_", "steps_", 1) for n in names + [_float32_name(n) for n in names]}

    def expected(name: str) -> np.ndarray:
        step = cases.output(step_of[name])
        if step.status != "ok" or "y" not in step.arrays:
            raise _NoStep(f"step failed on case {cases.label(name)}: {step.error or 'no output'}")
        return step.arrays["y"].astype(np.float64)
    try:
        return _compare_family(cases, names, expected, _y, "forward vs a loop of step calls", False)
    except _NoStep as exc:
        return Verdict("failed", str(exc))


class _NoStep(Exception):
    pass


def check_alignment(cases: _Cases, resume: Verdict) -> Verdict:
    """The first output of a sequence depends on token 0 alone: it must be out_proj(c * v_0), c > 0.
    step's first output is evidence only if its later outputs come from the state (``resume``):
    otherwise any other computation of the first token would do."""
    problem = _first_token_problem(cases, _names("forward", GAMMAS), "forward")
    if problem is None and resume.status != "passed":
        problem = f"step: {UNUSED_STATE} ({resume.message})"
    problem = problem or _first_token_problem(cases, _names("steps", GAMMAS), "step")
    if problem:
        return Verdict("failed", problem)
    return Verdict("passed", "the first token's output is its own value, in both forms")


def _first_token_problem(cases: _Cases, names: list[str], form: str) -> str | None:
    for name in names:
        out = cases.output(name)
        if out.status != "ok" or _y(out) is None:
            return f"{form} on case {cases.label(name)}: {out.error or 'no output'}"
        case = cases.inputs[name]
        arrays, heads = case.arrays, case.config["num_heads"]
        y0 = _y(out)[:, 0].astype(np.float64)
        inside = np.linalg.solve(arrays["out_proj.weight"], (y0 - arrays["out_proj.bias"]).T).T
        v0 = _project(case.arrays["x"][:, :1], arrays, "v_proj")[:, 0]
        batch, dim = v0.shape
        u, v = inside.reshape(batch, heads, -1), v0.reshape(batch, heads, -1)
        coefficient = (u * v).sum(-1) / (v * v).sum(-1)
        residual = np.abs(u - coefficient[..., None] * v).max()
        if residual > 1e-4 * (1 + np.abs(v).max()) or coefficient.min() <= 1e-3:
            hint = DIAGNOSES["strict_past"] if np.abs(u).max() < 1e-6 * (1 + np.abs(v).max()) else (
                "the first token's output is not a multiple of its own value vector")
            return f"{form}, first token of case {cases.label(name)}: {hint}"
    return None


def check_causality(cases: _Cases) -> Verdict:
    for shape_index in (1, 2, 3):
        original = cases.output(f"causal_s{shape_index}_original")
        changed = cases.output(f"causal_s{shape_index}_changed")
        name = f"causal_s{shape_index}_original"
        for out in (original, changed):
            if out.status != "ok" or _y(out) is None:
                return Verdict("failed", f"forward on case {cases.label(name)}: {out.error or 'no output'}")
        cut = cases.inputs[name].config["cut"]
        before = _y(original)[:, : cut + 1].astype(np.float64)
        after = _y(changed)[:, : cut + 1].astype(np.float64)
        if before.shape != after.shape:
            return Verdict("failed", f"forward output shapes differ: {before.shape} vs {after.shape}")
        diff = np.abs(before - after)
        if diff.max() > cases.tol32:
            b, t, c = (int(i) for i in np.argwhere(diff > cases.tol32)[0])
            return Verdict("failed", f"changing only tokens after position {cut} changed the output at "
                                     f"position {t} (batch {b}, channel {c}) by {diff[b, t, c]:.3g}; "
                                     "the mask must be 0 where i > t (case "
                                     f"{cases.label(name)})")
    return Verdict("passed", "outputs at or before t ignore every token after t")


def check_state_fixed_size(cases: _Cases, resume: Verdict) -> Verdict:
    """(S, z) keeps one size however many tokens arrive, and it is what step goes on from
    (``resume``): a fixed-size state that step does not use proves nothing."""
    out = cases.output("state_growth")
    if out.status != "ok":
        return Verdict("failed", f"1000 step calls: {out.error or out.status}")
    config = cases.inputs["state_growth"].config
    batch, heads = 2, config["num_heads"]
    d = config["embedding_dim"] // heads
    expected_shapes = [[batch, heads, d, d], [batch, heads, d]]
    size = batch * (heads * d * d + heads * d)
    checkpoints = out.info.get("checkpoints", {})
    for step in ("1", "10", "1000"):
        entry = checkpoints.get(step)
        if not isinstance(entry, dict):
            return Verdict("failed", f"no state was recorded after {step} steps")
        if entry.get("shapes") != expected_shapes:
            return Verdict("failed", f"after {step} steps the state is {entry.get('container')} of "
                                     f"{entry.get('shapes')}; expected (S, z) shaped {expected_shapes}")
        if entry.get("numel") != size:
            return Verdict("failed", f"after {step} steps the state holds {entry.get('numel')} values; "
                                     f"expected H*d_h^2 + H*d_h = {size} per batch of {batch}")
    relayed = _relayed_state_problem(cases)
    if relayed:
        return Verdict("failed", relayed)
    growth = [checkpoints[s].get("retained_growth", 0) for s in ("1", "10", "1000")]
    if not (growth[0] == growth[1] == growth[2]):
        return Verdict("failed", f"the layer keeps more tensor data as tokens arrive ({growth[0]} values "
                                 f"after 1 step, {growth[2]} after 1000): step must not store the history; "
                                 "everything it needs must live in the fixed-size (S, z)")
    if resume.status != "passed":
        return Verdict("failed", f"{UNUSED_STATE} ({resume.message})")
    return Verdict("passed", f"(S, z) keeps {size} values after 1, 10 and 1000 steps")


def _relayed_state_problem(cases: _Cases) -> str | None:
    """The states the harness handed from one worker to the next, measured here (the sizes
    above are reported from inside the student's process). The resume run must have handed
    one on; every segmented run that ran must have handed on (S, z) of the right shapes."""
    if cases.output("resume_split").status != "ok":
        return f"resuming from a state: {cases.output('resume_split').error}"
    for name in ["resume_split"] + _names("steps", GAMMAS):
        out, case = cases.output(name), cases.inputs[name]
        batch, heads = case.arrays["x"].shape[0], case.config["num_heads"]
        d = case.config["embedding_dim"] // heads
        expected = [[batch, heads, d, d], [batch, heads, d]]
        for shapes in out.info.get("states", []) if out.status == "ok" else []:
            if shapes != expected:
                return (f"on case {cases.label(name)} step returned a state of arrays shaped {shapes}; "
                        f"expected (S, z) shaped {expected}")
    return None


def check_state_resume(cases: _Cases) -> Verdict:
    """A run cut in two workers, the second resuming from the state the first returned, must
    match the student's own run in one worker: this item is about using (S, z), whatever the
    step computes."""
    whole, split = cases.output("resume_whole"), cases.output("resume_split")
    for out in (whole, split):
        if out.status != "ok" or _y(out) is None:
            return Verdict("failed", f"resuming from a state: {out.error or 'no output'}")
    cut = RESUME_SEGMENTS[0][1]
    result = mismatch(_y(split), _y(whole).astype(np.float64))
    if not _within(result, RESUME_TOLERANCE):
        return Verdict("failed", f"continuing from the state step returned after token {cut - 1}, in a fresh "
                                 f"process on a fresh layer, differs from one uninterrupted run: "
                                 f"{_describe(result)}. step must compute from the (S, z) it is given, not "
                                 "from history kept elsewhere")
    return Verdict("passed", "step continues from the state it is given exactly as an uninterrupted run")


def check_decay_property(cases: _Cases) -> str | None:
    name = _case_name("forward", 3, "per_head", "float64")
    out = cases.output(name)
    decay = out.arrays.get("decay")
    expected = _sigmoid(cases.inputs[name].arrays["gamma_logit"])
    if decay is None or decay.shape != expected.shape or np.abs(decay - expected).max() > 1e-12:
        return f"decay should equal sigmoid(gamma_logit) = {np.round(expected, 6).tolist()}"
    return None


def evaluate(context: CheckContext) -> dict[str, Verdict]:
    verdicts: dict[str, Verdict] = {}
    verdicts.update(_scaffold_verdicts(context))
    verdicts.update(_answer_verdicts(context))
    verdicts["notebook_runs"] = _execution_verdict(context)
    return verdicts


def _execution_verdict(context: CheckContext) -> Verdict:
    if context.execution is None:
        return Verdict("error", f"the notebook was not executed: {context.execution_problem}")
    problems = context.execution.problems()
    if problems:
        return Verdict("failed", "; ".join(problems[:5]))
    return Verdict("passed", f"all {len(context.execution.cells)} code cells ran without error")


SCAFFOLD_ITEMS = ("scaffold_present", "equivalence", "normalization", "alignment", "causality",
                  "decay_parallel", "decay_recurrent", "decay_per_head", "state_fixed_size",
                  "state_resume", "hybrid_lm")


def _scaffold_verdicts(context: CheckContext) -> dict[str, Verdict]:
    probe = context.probe
    if probe is None or probe.import_status != "ok":
        reason = context.probe_problem if probe is None else f"importing your code failed: {probe.import_error}"
        return {name: Verdict("error", reason) for name in SCAFFOLD_ITEMS}
    cases = _Cases(context, probe_cases(context.rubric))
    reference = _reference_for(cases)
    verdicts = {"scaffold_present": Verdict("passed", "the LinearAttention scaffold imports")}
    verdicts["equivalence"] = check_equivalence(cases)
    verdicts["normalization"] = _compare_family(
        cases, _names("forward", ("none",)), reference, _y, "forward at gamma = 1 vs the normalized reference")
    resume = check_state_resume(cases)
    verdicts["alignment"] = check_alignment(cases, resume)
    verdicts["causality"] = check_causality(cases)
    verdicts["decay_parallel"] = _compare_family(
        cases, _names("forward", ("mild", "strong")) + _smallq("forward"), reference, _y,
        "forward with decay vs the reference")
    verdicts["decay_recurrent"] = _compare_family(
        cases, _names("steps", ("mild", "strong")) + _smallq("steps"), reference, _y,
        "step with decay vs the reference")
    per_head = _compare_family(
        cases, _names("forward", ("per_head",)) + _names("steps", ("per_head",)), reference, _y,
        "different decays per head vs the reference")
    property_problem = check_decay_property(cases)
    if per_head.status == "passed" and property_problem:
        per_head = Verdict("failed", property_problem)
    verdicts["decay_per_head"] = per_head
    verdicts["state_fixed_size"] = check_state_fixed_size(cases, resume)
    verdicts["state_resume"] = resume
    verdicts["hybrid_lm"] = check_hybrid(cases.output("hybrid"), cases.inputs["hybrid"], context.master_path,
                                         cases.tol32)
    return verdicts


# ----------------------------------------------------------------------------- answers

def memory_bill_expected(setting: dict[str, Any]) -> dict[str, float]:
    """Exercise 5's byte counts, from the rubric's sizes."""
    tokens, dim, heads = setting["tokens"], setting["embedding_dim"], setting["num_heads"]
    kv_heads, window, width = setting["kv_heads"], setting["window"], setting["bytes_per_element"]
    layers = setting["stack_layers"]
    head_dim = dim // heads
    mha = 2 * tokens * dim * width
    linear = (heads * head_dim * head_dim + heads * head_dim) * width
    return {"mha_kv_cache": mha, "gqa8_kv_cache": 2 * tokens * kv_heads * head_dim * width,
            "sliding_window_kv_cache": 2 * min(window, tokens) * dim * width,
            "linear_state": linear, "stack_all_mha": layers * mha,
            "stack_all_linear": layers * linear, "stack_hybrid_LLLF": (layers - 1) * linear + mha}


GROWS_WITH_T = {"mha_kv_cache", "gqa8_kv_cache", "stack_all_mha", "stack_hybrid_LLLF"}


def _answer_verdicts(context: CheckContext) -> dict[str, Verdict]:
    verdicts: dict[str, Verdict] = {}
    bill = context.answers.get("MEMORY_BILL")
    expected = memory_bill_expected(context.rubric.settings["memory_bill"])
    tolerance = context.rubric.tolerances.get("memory_bill_rel", 0.02)
    missing = _missing_answer(context, "MEMORY_BILL", bill)
    for key, value in expected.items():
        name = f"bill_{key}"
        if missing:
            verdicts[name] = Verdict("failed", missing)
            continue
        got = bill.get(key)
        if not _is_number(got):
            verdicts[name] = Verdict("failed", f"MEMORY_BILL[{key!r}] should be a number of bytes, got {got!r}")
        elif abs(got - value) > tolerance * value:
            verdicts[name] = Verdict("failed", f"MEMORY_BILL[{key!r}] = {got:,.0f} bytes, off by more than "
                                               f"{tolerance:.0%} from the expected size")
        else:
            verdicts[name] = Verdict("passed", f"MEMORY_BILL[{key!r}] = {got:,.0f} bytes")
    if missing:
        verdicts["bill_grows_with_T"] = Verdict("failed", missing)
    else:
        grows = bill.get("grows_with_T")
        if not isinstance(grows, list) or set(map(str, grows)) != GROWS_WITH_T:
            verdicts["bill_grows_with_T"] = Verdict(
                "failed", f"MEMORY_BILL['grows_with_T'] = {grows!r}: list exactly the keys whose size grows "
                          "with T")
        else:
            verdicts["bill_grows_with_T"] = Verdict("passed", "the growing states are named correctly")
    verdicts.update(_benchmark_verdicts(context))
    return verdicts


def _missing_answer(context: CheckContext, name: str, value: Any) -> str | None:
    if context.execution is None:
        return f"{name} was not read: the notebook was not executed ({context.execution_problem})"
    if value is None:
        return f"{name} is not defined after running the notebook (did its cell fail?)"
    if not isinstance(value, dict):
        return f"{name} should be a dict, got {type(value).__name__}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


BENCHMARK_FIELDS = ("history_lengths", "full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes",
                    "linear_state_bytes", "embedding_dim", "num_heads", "batch_size", "bytes_per_element")


def _benchmark_verdicts(context: CheckContext) -> dict[str, Verdict]:
    bench = context.answers.get("DECODE_BENCHMARK")
    names = ("benchmark_fields", "benchmark_lengths", "benchmark_timings", "benchmark_memory")
    missing = _missing_answer(context, "DECODE_BENCHMARK", bench)
    if missing:
        return {n: Verdict("failed", missing) for n in names}
    absent = [f for f in BENCHMARK_FIELDS if f not in bench]
    lists = ("history_lengths", "full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes",
             "linear_state_bytes")
    lengths = bench.get("history_lengths")
    bad_lists = [f for f in lists if f in bench and (not isinstance(bench[f], list) or not isinstance(
        lengths, list) or len(bench[f]) != len(lengths) or not all(_is_number(v) for v in bench[f]))]
    verdicts = {}
    if absent or bad_lists:
        reason = (f"missing fields {absent}" if absent else "") + (
            f"{'; ' if absent else ''}fields {bad_lists} must be lists of numbers, one per history length"
            if bad_lists else "")
        verdicts["benchmark_fields"] = Verdict("failed", f"DECODE_BENCHMARK: {reason}")
        return {**{n: Verdict("failed", "DECODE_BENCHMARK is incomplete (see benchmark_fields)") for n in names},
                **verdicts}
    verdicts["benchmark_fields"] = Verdict("passed", "all required fields are present")
    if len(lengths) >= 4 and min(lengths) > 0 and max(lengths) >= 16 * min(lengths):
        verdicts["benchmark_lengths"] = Verdict("passed", f"{len(lengths)} lengths from {min(lengths)} to "
                                                          f"{max(lengths)}")
    else:
        verdicts["benchmark_lengths"] = Verdict("failed", f"history_lengths {lengths}: use at least 4 lengths "
                                                          "spanning at least 16x (e.g. 64 to 1024)")
    timings = bench["full_ms_per_step"] + bench["linear_ms_per_step"]
    verdicts["benchmark_timings"] = (
        Verdict("passed", "every timing is positive and finite") if all(t > 0 for t in timings)
        else Verdict("failed", "timings must be positive milliseconds per step"))
    verdicts["benchmark_memory"] = _benchmark_memory(bench, context.rubric.tolerances.get(
        "benchmark_memory_rel", 0.01))
    return verdicts


def _benchmark_memory(bench: dict[str, Any], tolerance: float) -> Verdict:
    sizes = [bench[f] for f in ("embedding_dim", "num_heads", "batch_size", "bytes_per_element")]
    if not all(isinstance(s, int) and s > 0 for s in sizes) or sizes[0] % sizes[1]:
        return Verdict("failed", "embedding_dim, num_heads, batch_size and bytes_per_element must be "
                                 "positive integers with num_heads dividing embedding_dim")
    dim, heads, batch, width = sizes
    head_dim = dim // heads
    state = batch * (heads * head_dim * head_dim + heads * head_dim) * width
    for length, kv, lin in zip(bench["history_lengths"], bench["kv_cache_bytes"], bench["linear_state_bytes"]):
        kv_expected = 2 * batch * length * dim * width
        if abs(kv - kv_expected) > tolerance * kv_expected:
            return Verdict("failed", f"at history length {length}, kv_cache_bytes = {kv:,.0f}; keys and values of "
                                     f"one layer take {kv_expected:,} bytes at these sizes")
        if abs(lin - state) > tolerance * state:
            return Verdict("failed", f"at history length {length}, linear_state_bytes = {lin:,.0f}; (S, z) take "
                                     f"{state:,} bytes at these sizes, whatever the length")
    return Verdict("passed", "KV-cache and (S, z) bytes are right for every length")
