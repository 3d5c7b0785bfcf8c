"""The inputs the probe runs through the student's functions, as data, generated from seeds.

Every case uses the harness's generic ``call`` kind: it calls scaffold functions of the
student's module by name with arrays (float64 unless the case says float32), literals and
seeded ``torch.Generator`` objects, and sends back what they return. Nothing here is an
expected value: those are computed on the trusted side only (``reference``), from the same
arrays. Cases are grouped by the function under test, so that a function that hangs loses its
own cases only (the harness gives up on a group after two hangs or crashes).

The cases of one group also share one worker, one after another (``ProbeCase.batch``):
forking the probe's torch process costs more than most of these calls. What makes that
safe: every case is judged against values computed on the trusted side from its own
inputs, and the relations the checks read between cases of one group hold between cases
given the same arrays (a form's normalized output against its own unnormalized output and
row sums, on the same q and k; the precision runs, the same numbers in float64 and
float32). The relations between groups (the two forms of a computation; a capacity curve
against the one composed from the helpers) are between cases that never share a worker.
So code that kept an earlier case's inputs has nothing it could not compute from its own.

``plan()`` gives every case with its ``Spec``: what the checks need to judge it (the function
under test, the words that name the case in a message, and its parameters).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from grader.probe import ProbeCase

SEEDS = (0, 1, 2)
LA_FORMS = ("linear_attention_recurrent", "linear_attention_parallel")
LA_SHAPES = ((1, 3, 2), (17, 8, 5), (64, 16, 16))                  # (L, d_k, d_v)
PRECISION_L, PRECISION_DIM, PRECISION_SEEDS = 512, 16, (0, 1)
GLA_FORMS = ("gla_recurrent", "gla_parallel")
GLA_SHAPES = ((1, 3, 2), (17, 8, 5), (17, 8, 8), (64, 16, 16))     # d_k == d_v exposes a gate on the wrong axis
GLA_SHIFTS = {"mild": 1.0, "strong": -1.0}                          # gate = sigmoid(N(0, 1) + shift)
GATE_KINDS = ("scalar", "vector")                                   # gate (L,) or (L, d_k)
MASK_LENGTHS = (1, 8, 64)
RETNET_GAMMAS = (0.5, 0.9, 0.99, "tensor 0.8")                      # the last as a 0-d tensor
CONSTANT_GATE, CONSTANT_GATE_LENGTHS = 0.9, (8, 64)
CONV_LENGTHS, CONV_SEEDS, CONV_SHAPE = (32, 33, 128, 512), (0, 1), (2, 3)   # u: (B, L, D)
FILTERS = ("flat", "decaying")                                      # decaying: exp(-n / (L / 8))
IMPULSE_LENGTHS = (32, 128)                                         # impulses at 0, L/2, L - 1
TOEPLITZ_LENGTHS = (1, 7, 64)
CYCLIC_LENGTHS = (7, 32, 128)                                       # vs the explicit cyclic sum
UNPADDED_LENGTHS = (32, 128, 512)                                   # off the causal oracle
UNIT_SIZE = (2000, 16)
ORTHONORMAL_SHAPES = ((1, 16), (5, 16), (16, 16), (64, 64), (128, 128))
TOO_MANY = (17, 16)                                                 # must raise ValueError
RECALL_KS, RECALL_DIM = (4, 32, 128), 16
GAUSSIAN_BINDINGS = (20, 8, 5)                                      # (K, d_k, d_v)
SOFTMAX_KS, SOFTMAX_BETAS = (16, 64), (1.0, 5.0)
SHARP_BETA, SHARP_DIMS, SHARP_KS = 50.0, (16, 64), (16, 64, 128)
CAPACITY_ORTHONORMAL = (((1, 4, 8, 16), 16), ((32, 64), 64))        # (Ks, d_k), seeds 0..2
CAPACITY_ORTHONORMAL_SEEDS = (0, 1, 2)
CAPACITY_RISING, CAPACITY_RISING_SEEDS = ((8, 16, 32, 64, 128), 16), (0, 1, 2, 3)
CAPACITY_POINTS, CAPACITY_POINT_SEEDS = ((64, 16), (128, 16), (64, 64)), tuple(range(8))
KEY_DRAWS = {"random": "random_unit_vectors", "orthonormal": "orthonormal_vectors"}
COMPOSITION_GROUP = "capacity_composition"


@dataclass(frozen=True)
class Spec:
    """One probe case and what the checks need to judge it."""

    case: ProbeCase
    function: str                     # the scaffold function under test
    label: str                        # names the case in messages ("seed 0, L=17, d_k=8, d_v=5")
    params: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- building blocks

def array(name: str) -> dict:
    return {"array": name}


def value(literal: Any) -> dict:
    return {"value": literal}


def generator(seed: int, shared: str | None = None) -> dict:
    return {"generator": seed} if shared is None else {"generator": seed, "shared": shared}


def result(output: str) -> dict:
    return {"result": output}


def call(symbol: str, *args: dict, output: str = "y", **kwargs: dict) -> dict:
    return {"symbol": symbol, "args": list(args), "kwargs": kwargs, "output": output}


def _case(name: str, calls: list[dict], arrays: dict[str, np.ndarray], keep: tuple[str, ...], group: str,
          dtype: str = "float64") -> ProbeCase:
    return ProbeCase(name, "call", {"dtype": dtype, "calls": calls}, arrays, keep, group=group, batch=group)


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng(list(seed))


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def orthonormal_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return q.T.copy()


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def float32_exact(x: np.ndarray) -> np.ndarray:
    """float64 values that float32 holds exactly: the precision case's float64 and float32 runs
    then see the very same numbers, so only the arithmetic's precision differs between them."""
    return x.astype(np.float32).astype(np.float64)


# ----------------------------------------------------------------------------- names

def la_name(form: str, mode: str, seed: int, shape: tuple[int, int, int]) -> str:
    return f"la/{form}/{mode}/s{seed}/L{shape[0]}_dk{shape[1]}_dv{shape[2]}"


def precision_name(form: str, dtype: str, seed: int) -> str:
    return f"precision/{form}/{dtype}/s{seed}"


def gla_name(form: str, kind: str, seed: int, shape: tuple[int, int, int], forgetting: str) -> str:
    return f"gla/{form}/{kind}/s{seed}/L{shape[0]}_dk{shape[1]}_dv{shape[2]}/{forgetting}"


def la_label(seed: int, shape: tuple[int, int, int]) -> str:
    return f"seed {seed}, L={shape[0]}, d_k={shape[1]}, d_v={shape[2]}"


# ----------------------------------------------------------------------------- the plan

def _linear_attention() -> list[Spec]:
    """Each form, normalized and not, on the same q, k, v; and unnormalized with v = 1, whose
    output is the form's own row sums (its normalizer, whatever its mask)."""
    specs = []
    for seed in SEEDS:
        for shape in LA_SHAPES:
            L, dk, dv = shape
            rng = _rng(1, seed, L, dk, dv)
            arrays = {"q": rng.standard_normal((L, dk)), "k": rng.standard_normal((L, dk)),
                      "v": rng.standard_normal((L, dv))}
            ones = {"q": arrays["q"], "k": arrays["k"], "v": np.ones((L, 1))}
            for form in LA_FORMS:
                for mode, given, normalize in (("normalized", arrays, True), ("unnormalized", arrays, False),
                                               ("row_sums", ones, False)):
                    name = la_name(form, mode, seed, shape)
                    calls = [call(form, array("q"), array("k"), array("v"), normalize=value(normalize))]
                    specs.append(Spec(_case(name, calls, given, ("y",), form), form, la_label(seed, shape),
                                      {"seed": seed, "shape": shape, "mode": mode, "normalize": normalize}))
    return specs


def _precision() -> list[Spec]:
    """L = 512, normalized, the same numbers in float64 and in float32."""
    specs = []
    for seed in PRECISION_SEEDS:
        rng = _rng(2, seed)
        arrays = {n: float32_exact(rng.standard_normal((PRECISION_L, PRECISION_DIM))) for n in ("q", "k", "v")}
        for form in LA_FORMS:
            for dtype in ("float64", "float32"):
                calls = [call(form, array("q"), array("k"), array("v"))]
                specs.append(Spec(_case(precision_name(form, dtype, seed), calls, arrays, ("y",), form, dtype),
                                  form, f"seed {seed}, L={PRECISION_L}, d_k=d_v={PRECISION_DIM}, {dtype} inputs",
                                  {"seed": seed, "dtype": dtype}))
    return specs


def _gla() -> list[Spec]:
    specs = []
    for seed in SEEDS:
        for shape in GLA_SHAPES:
            L, dk, dv = shape
            for forgetting, shift in GLA_SHIFTS.items():
                for kind in GATE_KINDS:
                    rng = _rng(3, seed, L, dk, dv, int(shift > 0), GATE_KINDS.index(kind))
                    gate_shape = (L,) if kind == "scalar" else (L, dk)
                    arrays = {"q": rng.standard_normal((L, dk)), "k": rng.standard_normal((L, dk)),
                              "v": rng.standard_normal((L, dv)),
                              "gate": sigmoid(rng.standard_normal(gate_shape) + shift)}
                    for form in GLA_FORMS:
                        calls = [call(form, array("q"), array("k"), array("v"), array("gate"))]
                        label = f"{la_label(seed, shape)}, gate shape {gate_shape}, {forgetting} forgetting"
                        specs.append(Spec(_case(gla_name(form, kind, seed, shape, forgetting), calls, arrays, ("y",),
                                                form), form, label,
                                          {"seed": seed, "shape": shape, "kind": kind, "forgetting": forgetting}))
    return specs


def _masks() -> list[Spec]:
    specs = []
    for L in MASK_LENGTHS:
        for gamma in RETNET_GAMMAS:
            if isinstance(gamma, str):
                number = float(gamma.split()[-1])
                arrays, argument, label = {"gamma": np.array(number)}, array("gamma"), f"L={L}, gamma={number} (0-d tensor)"
            else:
                number, arrays, argument, label = gamma, {}, value(gamma), f"L={L}, gamma={gamma}"
            calls = [call("retnet_decay_mask", value(L), argument)]
            specs.append(Spec(_case(f"retnet/L{L}/gamma{number}{'_tensor' if arrays else ''}", calls, arrays, ("y",),
                                    "retnet_decay_mask"), "retnet_decay_mask", label, {"L": L, "gamma": number}))
    for seed in SEEDS:
        for L in MASK_LENGTHS:
            gate = sigmoid(_rng(4, seed, L).standard_normal(L) + 1.0)
            calls = [call("gla_decay_mask", array("gate"))]
            specs.append(Spec(_case(f"gla_mask/s{seed}/L{L}", calls, {"gate": gate}, ("y",), "gla_decay_mask"),
                              "gla_decay_mask", f"seed {seed}, L={L}", {"L": L, "constant": None}))
    for L in CONSTANT_GATE_LENGTHS:
        calls = [call("gla_decay_mask", array("gate"))]
        specs.append(Spec(_case(f"gla_mask/constant/L{L}", calls, {"gate": np.full(L, CONSTANT_GATE)}, ("y",),
                                "gla_decay_mask"), "gla_decay_mask",
                          f"a constant gate {CONSTANT_GATE}, L={L}", {"L": L, "constant": CONSTANT_GATE}))
    return specs


def decaying(filter_: np.ndarray) -> np.ndarray:
    L = filter_.shape[0]
    return filter_ * np.exp(-np.arange(L) / (L / 8))[:, None]


def _convolutions() -> list[Spec]:
    specs = []
    batch, channels = CONV_SHAPE
    for seed in CONV_SEEDS:
        for L in CONV_LENGTHS:
            rng = _rng(5, seed, L)
            u = rng.standard_normal((batch, L, channels))
            filters = {"flat": rng.standard_normal((L, channels)), "decaying": decaying(rng.standard_normal((L, channels)))}
            for kind in FILTERS:
                calls = [call("fft_causal_conv", array("u"), array("k"))]
                specs.append(Spec(_case(f"fft/s{seed}/L{L}/{kind}", calls, {"u": u, "k": filters[kind]}, ("y",),
                                        "fft_causal_conv"), "fft_causal_conv",
                                  f"seed {seed}, L={L}, u of shape {(batch, L, channels)}, {kind} filter",
                                  {"L": L, "item": "fft_causal"}))
    for L in IMPULSE_LENGTHS:
        k = _rng(6, L).standard_normal((L, channels))
        for p in (0, L // 2, L - 1):
            u = np.zeros((1, L, channels))
            u[0, p] = 1.0
            calls = [call("fft_causal_conv", array("u"), array("k"))]
            specs.append(Spec(_case(f"impulse/L{L}/p{p}", calls, {"u": u, "k": k}, ("y",), "fft_causal_conv"),
                              "fft_causal_conv", f"an impulse at p={p}, L={L}", {"L": L, "p": p, "item": "fft_impulse"}))
    for L in TOEPLITZ_LENGTHS:
        rng = _rng(7, L)
        arrays = {"u": rng.standard_normal((batch, L, channels)), "k": rng.standard_normal((L, channels))}
        calls = [call("toeplitz_causal_conv", array("u"), array("k"))]
        specs.append(Spec(_case(f"toeplitz/L{L}", calls, arrays, ("y",), "toeplitz_causal_conv"),
                          "toeplitz_causal_conv", f"L={L}, u of shape {(batch, L, channels)}", {"L": L}))
    for L in CYCLIC_LENGTHS:
        rng = _rng(8, L)
        arrays = {"u": rng.standard_normal((batch, L, channels)), "k": rng.standard_normal((L, channels))}
        calls = [call("fft_cyclic_conv", array("u"), array("k"))]
        specs.append(Spec(_case(f"cyclic/L{L}", calls, arrays, ("y",), "fft_cyclic_conv"), "fft_cyclic_conv",
                          f"L={L}, u of shape {(batch, L, channels)}", {"L": L, "half": "cyclic"}))
    for L in UNPADDED_LENGTHS:
        rng = _rng(9, L)
        arrays = {"u": rng.standard_normal((batch, L, 4)), "k": decaying(rng.standard_normal((L, 4)))}
        calls = [call("fft_cyclic_conv", array("u"), array("k"))]
        specs.append(Spec(_case(f"unpadded/L{L}", calls, arrays, ("y",), "fft_cyclic_conv"), "fft_cyclic_conv",
                          f"L={L}, u of shape {(batch, L, 4)}, decaying filter", {"L": L, "half": "unpadded"}))
    return specs


def _vectors() -> list[Spec]:
    """Each key generator called twice with the same seed (fresh generators) and once with
    another seed, in one worker: only draws from the generator passed in repeat."""
    specs = [Spec(_case("unit/1x3", [call("random_unit_vectors", value(1), value(3), generator(0))], {}, ("y",),
                        "random_unit_vectors"), "random_unit_vectors", "random_unit_vectors(1, 3, seed 0)",
                  {"n": 1, "d": 3})]
    n, d = UNIT_SIZE
    for seed in SEEDS:
        calls = [call("random_unit_vectors", value(n), value(d), generator(s), output=out)
                 for s, out in ((seed, "first"), (seed, "again"), (seed + 100, "other"))]
        specs.append(Spec(_case(f"unit/s{seed}", calls, {}, ("first", "again", "other"), "random_unit_vectors"),
                          "random_unit_vectors", f"random_unit_vectors({n}, {d}, seed {seed})",
                          {"n": n, "d": d, "seed": seed}))
    for n, d in ORTHONORMAL_SHAPES:
        calls = [call("orthonormal_vectors", value(n), value(d), generator(s), output=out)
                 for s, out in ((0, "first"), (0, "again"), (1, "other"), (1, "other_again"))]
        specs.append(Spec(_case(f"orthonormal/{n}x{d}", calls, {}, ("first", "again", "other", "other_again"),
                                "orthonormal_vectors"), "orthonormal_vectors",
                          f"orthonormal_vectors({n}, {d}, seeds 0 and 1)", {"n": n, "d": d}))
    n, d = TOO_MANY
    specs.append(Spec(_case("orthonormal/too_many", [call("orthonormal_vectors", value(n), value(d), generator(0))],
                            {}, ("y",), "orthonormal_vectors"), "orthonormal_vectors",
                      f"orthonormal_vectors({n}, {d}, seed 0)", {"n": n, "d": d}))
    return specs


def _recall() -> list[Spec]:
    specs = []
    for seed in SEEDS:
        for K in RECALL_KS:
            rng = _rng(10, seed, K)
            arrays = {"keys": unit_rows(rng, K, RECALL_DIM), "values": orthonormal_rows(rng, K)}
            calls = [call("linear_recall_error", array("keys"), array("values"))]
            specs.append(Spec(_case(f"recall/s{seed}/K{K}", calls, arrays, ("y",), "linear_recall_error"),
                              "linear_recall_error",
                              f"seed {seed}, K={K} random unit keys in R^{RECALL_DIM}, orthonormal values", {}))
        K, dk, dv = GAUSSIAN_BINDINGS
        rng = _rng(11, seed)
        arrays = {"keys": rng.standard_normal((K, dk)), "values": rng.standard_normal((K, dv))}
        calls = [call("linear_recall_error", array("keys"), array("values"))]
        specs.append(Spec(_case(f"recall/s{seed}/gaussian", calls, arrays, ("y",), "linear_recall_error"),
                          "linear_recall_error", f"seed {seed}, K={K} Gaussian keys (d_k={dk}) and values (d_v={dv})", {}))
    for seed in SEEDS:
        for K in SOFTMAX_KS:
            rng = _rng(12, seed, K)
            arrays = {"keys": unit_rows(rng, K, RECALL_DIM), "values": orthonormal_rows(rng, K)}
            for beta in SOFTMAX_BETAS:
                calls = [call("softmax_recall_error", array("keys"), array("values"), value(beta))]
                specs.append(Spec(_case(f"softmax/s{seed}/K{K}/beta{beta:g}", calls, arrays, ("y",),
                                        "softmax_recall_error"), "softmax_recall_error",
                                  f"seed {seed}, K={K}, d_k={RECALL_DIM}, beta={beta:g}", {"beta": beta, "sharp": False}))
    for dk in SHARP_DIMS:
        for K in SHARP_KS:
            rng = _rng(13, dk, K)
            arrays = {"keys": unit_rows(rng, K, dk), "values": orthonormal_rows(rng, K)}
            calls = [call("softmax_recall_error", array("keys"), array("values"), value(SHARP_BETA))]
            specs.append(Spec(_case(f"softmax/sharp/dk{dk}/K{K}", calls, arrays, ("y",), "softmax_recall_error"),
                              "softmax_recall_error", f"K={K}, d_k={dk}, beta={SHARP_BETA:g}",
                              {"beta": SHARP_BETA, "sharp": True}))
    return specs


def composition_output(K: int, seed: int) -> str:
    return f"error_K{K}_s{seed}"


def _capacity_pair(name: str, Ks: tuple[int, ...], dk: int, seeds: tuple[int, ...], kind: str, label: str,
                   params: dict[str, Any]) -> list[Spec]:
    """capacity_curve itself, and in a second worker the computation its docstring fixes, done
    with the student's own helpers: per K and seed a fresh generator (shared by the two draws),
    keys, then values = orthonormal_vectors(K, K, gen), then linear_recall_error."""
    curve = [call("capacity_curve", value(list(Ks)), value(dk), value(list(seeds)), key_kind=value(kind))]
    composed = []
    for K in Ks:
        for seed in seeds:
            stream = f"K{K}_s{seed}"
            composed += [call(KEY_DRAWS[kind], value(K), value(dk), generator(seed, stream), output=f"keys_{stream}"),
                         call("orthonormal_vectors", value(K), value(K), generator(seed, stream),
                              output=f"values_{stream}"),
                         call("linear_recall_error", result(f"keys_{stream}"), result(f"values_{stream}"),
                              output=composition_output(K, seed))]
    keep = tuple(composition_output(K, s) for K in Ks for s in seeds)
    params = {**params, "Ks": Ks, "d_k": dk, "seeds": seeds, "kind": kind, "composition": f"{name}/composed"}
    return [Spec(_case(f"{name}/curve", curve, {}, ("y",), "capacity_curve"), "capacity_curve", label, params),
            Spec(_case(f"{name}/composed", composed, {}, keep, COMPOSITION_GROUP), "capacity_curve",
                 label, {**params, "composed": True})]


def _capacity() -> list[Spec]:
    specs = []
    seeds = CAPACITY_ORTHONORMAL_SEEDS
    for Ks, dk in CAPACITY_ORTHONORMAL:
        specs += _capacity_pair(f"capacity/orthonormal/dk{dk}", Ks, dk, seeds, "orthonormal",
                                f"capacity_curve({list(Ks)}, {dk}, seeds {list(seeds)}, key_kind='orthonormal')",
                                {"item": "capacity_orthonormal"})
    (Ks, dk), seeds = CAPACITY_RISING, CAPACITY_RISING_SEEDS
    specs += _capacity_pair("capacity/rising", Ks, dk, seeds, "random",
                            f"capacity_curve({list(Ks)}, {dk}, seeds {list(seeds)}, key_kind='random')",
                            {"item": "capacity_rising"})
    seeds = CAPACITY_POINT_SEEDS
    for K, dk in CAPACITY_POINTS:
        specs += _capacity_pair(f"capacity/random/K{K}_dk{dk}", (K,), dk, seeds, "random",
                                f"capacity_curve([{K}], {dk}, seeds 0..{seeds[-1]}, key_kind='random')",
                                {"item": "capacity_random"})
    return specs


@cache
def plan() -> dict[str, Spec]:
    """Every case the probe runs, by name (generated deterministically; do not modify)."""
    specs = (_linear_attention() + _precision() + _gla() + _masks() + _convolutions() + _vectors() + _recall()
             + _capacity())
    found = {s.case.name: s for s in specs}
    assert len(found) == len(specs), "duplicate case names"
    return found


def probe_cases() -> list[ProbeCase]:
    """The plan's cases, each group's one after another (a group's cases share a worker)."""
    cases = [spec.case for spec in plan().values()]
    groups = list(dict.fromkeys(case.group for case in cases))
    return sorted(cases, key=lambda case: groups.index(case.group))
