"""Self-check of the linear_attention_hyena corpus (a script, not a pytest module).

    .venv/bin/python tests/hyena_corpus/selfcheck.py [FILE.py ...]

Every ``correct_*.py`` / ``mutant_*.py`` file here is grafted onto the master notebook's
reference code (its ``provided`` definition cells and its ``scaffold`` cells, solutions
included; the ``demo-*`` cells are skipped), exactly as a submitted scaffold cell would be: a
mutant replaces only the functions it defines, and the reference's other functions then call
the mutant's (``capacity_curve`` uses whatever ``random_unit_vectors`` is defined). Each
concern below is then checked against a fresh copy of the reference and against values
computed here by plain loops, on a few seeds.

It prints, per file, the concerns it loses (with the first failing case) and compares them
with the ``(loses: ...)`` entry of README.md: correct variants must lose nothing, each mutant
exactly its concerns. The exit status is 1 when any file disagrees with the README.
"""
from __future__ import annotations

import ast
import contextlib
import io
import math
import re
import sys
import time
from pathlib import Path

import nbformat
import torch

HERE = Path(__file__).resolve().parent
MASTER = HERE.parent.parent / "solutions" / "linear_attention_hyena" / "linear_attention_hyena.ipynb"
README = HERE / "README.md"

SEEDS = (0, 1, 2)
TOL = 1e-12              # identities in float64 (the chapter's figures are 1e-16 .. 3e-14)
FLOAT32_MIN_GAP = 1e-8   # float32 recurrent vs parallel must show rounding (measured ~3e-7)
UNPADDED_MIN = 0.1       # the un-padded FFT must visibly break causality (measured 0.5-0.7)
CAPACITY_REL = 0.05      # random unit keys: mean error within 5% of sqrt((K - 1) / d_k)
SOFTMAX_MAX = 1e-3       # softmax readout at beta = 50 (measured <= 9e-8)
F64 = torch.float64


class Fail(AssertionError):
    pass


# ---------------------------------------------------------------- grafting onto the master

def _master_cells():
    master = nbformat.read(str(MASTER), as_version=4)
    definitions, symbols = [], []
    for cell in master.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        if "scaffold" in tags:
            definitions.append(cell.source)
            symbols.extend(cell.metadata.get("g2c", {}).get("symbols", []))
        elif "provided" in tags and not cell.get("id", "").startswith("demo-"):
            definitions.append(cell.source)
    return "\n\n".join(definitions), symbols


DEFINITIONS, SYMBOLS = _master_cells()


def namespace(extra: str | None = None, name: str = "reference") -> dict:
    ns: dict = {"__name__": f"hyena_{name}"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(DEFINITIONS, "<master definitions>", "exec"), ns)
        if extra is not None:
            exec(compile(extra, name, "exec"), ns)
    return ns


def defined_functions(code: str) -> set[str]:
    return {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}


# ---------------------------------------------------------------- helpers

def err(a, b) -> float:
    a = torch.as_tensor(a, dtype=F64)  # Python floats become float64, not float32
    b = torch.as_tensor(b, dtype=F64)
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def close(a, b, tol: float, what: str) -> None:
    e = err(a, b)
    if not e < tol:
        raise Fail(f"{what}: err {e:.2e} (needs < {tol:g})")


def tensor_like(y, shape, dtype, what: str) -> None:
    if not isinstance(y, torch.Tensor):
        raise Fail(f"{what}: returned {type(y).__name__}, not a tensor")
    if tuple(y.shape) != tuple(shape):
        raise Fail(f"{what}: shape {tuple(y.shape)}, expected {tuple(shape)}")
    if y.dtype != dtype:
        raise Fail(f"{what}: dtype {y.dtype}, expected {dtype}")


def scalar(x, what: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise Fail(f"{what}: returned a tensor of shape {tuple(x.shape)}, not a scalar")
        if x.dtype != F64:
            raise Fail(f"{what}: dtype {x.dtype}, expected float64")
        return float(x)
    return float(x)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=F64)


# ---------------------------------------------------------------- concerns

LA_SHAPES = [(1, 3, 2), (17, 8, 5), (64, 16, 16)]
GLA_SHAPES = [(1, 3, 2), (17, 8, 5), (17, 8, 8), (64, 16, 16)]


def _la(cand, ref, normalize: bool) -> None:
    for seed in SEEDS:
        for L, dk, dv in LA_SHAPES:
            g = gen(1000 * seed + L)
            q, k, v = randn(L, dk, g=g), randn(L, dk, g=g), randn(L, dv, g=g)
            case = f"seed {seed}, L={L}, d_k={dk}, d_v={dv}"
            expected = ref["linear_attention_parallel"](q, k, v, normalize=normalize)
            y_rec = cand["linear_attention_recurrent"](q, k, v, normalize=normalize)
            y_par = cand["linear_attention_parallel"](q, k, v, normalize=normalize)
            tensor_like(y_rec, (L, dv), F64, f"recurrent ({case})")
            tensor_like(y_par, (L, dv), F64, f"parallel ({case})")
            close(y_rec, y_par, TOL, f"recurrent vs parallel ({case})")
            close(y_rec, expected, TOL, f"recurrent vs reference ({case})")
            close(y_par, expected, TOL, f"parallel vs reference ({case})")


def la_normalized(cand, ref):
    _la(cand, ref, True)


def la_unnormalized(cand, ref):
    _la(cand, ref, False)


def la_precision(cand, ref):
    for seed in SEEDS[:2]:
        g = gen(2024 + seed)
        q, k, v = randn(512, 16, g=g), randn(512, 16, g=g), randn(512, 16, g=g)
        close(cand["linear_attention_recurrent"](q, k, v), cand["linear_attention_parallel"](q, k, v), TOL,
              f"float64 recurrent vs parallel at L=512 (seed {seed})")
        q32, k32, v32 = q.float(), k.float(), v.float()
        y_rec = cand["linear_attention_recurrent"](q32, k32, v32)
        y_par = cand["linear_attention_parallel"](q32, k32, v32)
        tensor_like(y_rec, (512, 16), torch.float32, "float32 recurrent output")
        tensor_like(y_par, (512, 16), torch.float32, "float32 parallel output")
        gap = err(y_rec, y_par)
        if not (math.isfinite(gap) and gap > FLOAT32_MIN_GAP):
            raise Fail(f"float32 recurrent vs parallel at L=512: err {gap:.2e} (a float32 computation shows "
                       f"> {FLOAT32_MIN_GAP:g}; was it done in float64?)")


def _gla(cand, ref, per_feature: bool) -> None:
    for seed in SEEDS:
        for L, dk, dv in GLA_SHAPES:
            for shift in (1.0, -1.0):          # mild and strong forgetting
                g = gen(5000 + 1000 * seed + L + dv)
                q, k, v = randn(L, dk, g=g), randn(L, dk, g=g), randn(L, dv, g=g)
                gate = torch.sigmoid(randn(*((L, dk) if per_feature else (L,)), g=g) + shift)
                case = f"seed {seed}, L={L}, d_k={dk}, d_v={dv}, gate shape {tuple(gate.shape)}"
                expected = ref["gla_recurrent"](q, k, v, gate)
                y_rec = cand["gla_recurrent"](q, k, v, gate)
                y_par = cand["gla_parallel"](q, k, v, gate)
                tensor_like(y_rec, (L, dv), F64, f"gla_recurrent ({case})")
                tensor_like(y_par, (L, dv), F64, f"gla_parallel ({case})")
                close(y_rec, y_par, TOL, f"gla recurrent vs parallel ({case})")
                close(y_rec, expected, TOL, f"gla_recurrent vs reference ({case})")
                close(y_par, expected, TOL, f"gla_parallel vs reference ({case})")


def gla_scalar(cand, ref):
    _gla(cand, ref, False)


def gla_vector(cand, ref):
    _gla(cand, ref, True)


def _powers(L: int, gamma: float) -> torch.Tensor:
    return torch.tensor([[gamma ** (t - j) if j <= t else 0.0 for j in range(L)] for t in range(L)],
                        dtype=F64).reshape(L, L)


def _strictly_upper_is_zero(m, what: str) -> None:
    if m.shape[0] > 1 and float(m.triu(1).abs().max()) != 0.0:
        raise Fail(f"{what}: non-zero entries above the diagonal (max {float(m.triu(1).abs().max()):.3g})")


def retnet_mask(cand, ref):
    for L in (1, 8, 64):
        for gamma in (0.5, 0.9, 0.99, torch.tensor(0.8, dtype=F64)):
            m = cand["retnet_decay_mask"](L, gamma)
            case = f"L={L}, gamma={float(gamma)}"
            tensor_like(m, (L, L), F64, f"retnet_decay_mask ({case})")
            close(m, _powers(L, float(gamma)), TOL, f"retnet mask vs gamma^(t-j) ({case})")
            _strictly_upper_is_zero(m, f"retnet mask ({case})")
            if L > 1:
                defect = float((m[1:, 1:] - m[:-1, :-1]).abs().max())
                if not defect < TOL:
                    raise Fail(f"retnet mask ({case}) is not Toeplitz: diagonals differ by {defect:.2e}")


def gla_mask(cand, ref):
    for seed in SEEDS:
        for L in (1, 8, 64):
            gate = torch.sigmoid(randn(L, g=gen(300 + 10 * seed + L)) + 1.0)
            logs = [math.log(float(x)) for x in gate]
            expected = torch.tensor([[math.exp(sum(logs[j + 1:t + 1])) if j <= t else 0.0 for j in range(L)]
                                     for t in range(L)], dtype=F64).reshape(L, L)
            m = cand["gla_decay_mask"](gate)
            case = f"seed {seed}, L={L}"
            tensor_like(m, (L, L), F64, f"gla_decay_mask ({case})")
            close(m, expected, TOL, f"gla mask vs exp(segment sums of log gates) ({case})")
            _strictly_upper_is_zero(m, f"gla mask ({case})")
    for L in (8, 64):
        close(cand["gla_decay_mask"](torch.full((L,), 0.9, dtype=F64)), _powers(L, 0.9), TOL,
              f"gla mask with a constant gate 0.9 vs RetNet's gamma^(t-j) (L={L})")


def _filters(L: int, D: int, g):
    flat = randn(L, D, g=g)
    decaying = randn(L, D, g=g) * torch.exp(-torch.arange(L, dtype=F64) / (L / 8))[:, None]
    return {"flat": flat, "decaying": decaying}


def fft_causal(cand, ref):
    for seed in SEEDS[:2]:
        for L in (32, 33, 128, 512):
            g = gen(700 + 10 * seed + L)
            u = randn(2, L, 3, g=g)
            for kind, k in _filters(L, 3, g).items():
                case = f"seed {seed}, L={L}, {kind} filter"
                y = cand["fft_causal_conv"](u, k)
                tensor_like(y, (2, L, 3), F64, f"fft_causal_conv ({case})")
                close(y, ref["toeplitz_causal_conv"](u, k), TOL, f"FFT vs Toeplitz oracle ({case})")


def fft_impulse(cand, ref):
    for L in (32, 128):
        k = randn(L, 3, g=gen(L))
        for p in (0, L // 2, L - 1):
            u = torch.zeros(1, L, 3, dtype=F64)
            u[0, p] = 1.0
            y = cand["fft_causal_conv"](u, k)[0]
            if p > 0:
                before = float(y[:p].abs().max())
                if not before < TOL:
                    raise Fail(f"impulse at p={p} (L={L}): output before p is {before:.2e}, not 0 (acausal)")
            close(y[p:], k[: L - p], TOL, f"impulse at p={p} (L={L}): response vs the shifted filter")


def toeplitz_oracle(cand, ref):
    for L in (1, 7, 64):
        g = gen(900 + L)
        u, k = randn(2, L, 3, g=g), randn(L, 3, g=g)
        expected = torch.zeros(2, L, 3, dtype=F64)
        for n in range(L):
            for m in range(n + 1):
                expected[:, n] += k[n - m] * u[:, m]
        y = cand["toeplitz_causal_conv"](u, k)
        tensor_like(y, (2, L, 3), F64, f"toeplitz_causal_conv (L={L})")
        close(y, expected, TOL, f"Toeplitz oracle vs the explicit causal sum (L={L})")


def fft_cyclic(cand, ref):
    for L in (7, 32, 128):
        g = gen(1100 + L)
        u, k = randn(2, L, 3, g=g), randn(L, 3, g=g)
        n = torch.arange(L)
        wrapped = k[(n[:, None] - n[None, :]) % L]          # (n, m) -> k[(n - m) mod L]
        expected = torch.einsum("nmc,bmc->bnc", wrapped, u)
        y = cand["fft_cyclic_conv"](u, k)
        tensor_like(y, (2, L, 3), F64, f"fft_cyclic_conv (L={L})")
        close(y, expected, TOL, f"un-padded FFT vs the explicit cyclic sum (L={L})")
    for L in (32, 128, 512):
        g = gen(1200 + L)
        u, k = randn(2, L, 4, g=g), _filters(L, 4, g)["decaying"]
        gap = err(cand["fft_cyclic_conv"](u, k), ref["toeplitz_causal_conv"](u, k))
        if not gap > UNPADDED_MIN:
            raise Fail(f"un-padded FFT vs the causal oracle at L={L}: err {gap:.2e} (the wrap-around should "
                       f"exceed {UNPADDED_MIN})")


def unit_vectors(cand, ref):
    f = cand["random_unit_vectors"]
    tensor_like(f(1, 3, gen(0)), (1, 3), F64, "random_unit_vectors(1, 3)")
    for seed in SEEDS:
        x = f(2000, 16, gen(seed))
        tensor_like(x, (2000, 16), F64, f"random_unit_vectors(2000, 16), seed {seed}")
        norm_gap = float((x.norm(dim=1) - 1).abs().max())
        if not norm_gap < TOL:
            raise Fail(f"rows are not unit vectors: max |norm - 1| = {norm_gap:.2e} (seed {seed})")
        if not torch.equal(x, f(2000, 16, gen(seed))):
            raise Fail(f"the same seed ({seed}) gave different vectors: draw from the generator passed in")
        if torch.allclose(x, f(2000, 16, gen(seed + 100))):
            raise Fail("different seeds gave the same vectors")
        mean = float(x.mean(dim=0).abs().max())
        spread = float((x.T @ x / 2000 * 16 - torch.eye(16, dtype=F64)).abs().max())
        if not (mean < 0.05 and spread < 0.25):
            raise Fail(f"not uniform on the sphere: |mean| up to {mean:.3f}, covariance * d - I up to {spread:.3f}")


def orthonormal_vectors(cand, ref):
    f = cand["orthonormal_vectors"]
    for n, d in ((1, 16), (5, 16), (16, 16), (64, 64), (128, 128)):
        for seed in SEEDS[:2]:
            V = f(n, d, gen(seed))
            tensor_like(V, (n, d), F64, f"orthonormal_vectors({n}, {d})")
            gap = float((V @ V.T - torch.eye(n, dtype=F64)).abs().max())
            if not gap < TOL:
                raise Fail(f"orthonormal_vectors({n}, {d}): V V^T - I up to {gap:.2e}")
            if not torch.equal(V, f(n, d, gen(seed))):
                raise Fail(f"orthonormal_vectors({n}, {d}): the same seed gave different vectors")
        if n > 1 and torch.allclose(f(n, d, gen(0)), f(n, d, gen(1))):
            raise Fail(f"orthonormal_vectors({n}, {d}): different seeds gave the same vectors")
    try:
        f(17, 16, gen(0))
    except ValueError:
        pass
    else:
        raise Fail("orthonormal_vectors(17, 16) did not raise ValueError (17 orthonormal vectors need d >= 17)")


def _bindings(ref, K: int, d_k: int, seed: int):
    g = gen(40 + seed)
    return ref["random_unit_vectors"](K, d_k, g), ref["orthonormal_vectors"](K, K, g)


def recall_error(cand, ref):
    for seed in SEEDS:
        for K in (4, 32, 128):
            keys, values = _bindings(ref, K, 16, seed)
            got = scalar(cand["linear_recall_error"](keys, values), f"linear_recall_error (K={K})")
            close(got, ref["linear_recall_error"](keys, values), TOL,
                  f"linear_recall_error vs reference (seed {seed}, K={K}, d_k=16)")
        g = gen(60 + seed)
        keys, values = randn(20, 8, g=g), randn(20, 5, g=g)
        got = scalar(cand["linear_recall_error"](keys, values), "linear_recall_error (general keys)")
        close(got, ref["linear_recall_error"](keys, values), TOL,
              f"linear_recall_error vs reference (seed {seed}, Gaussian keys and values)")


def softmax_baseline(cand, ref):
    for seed in SEEDS:
        for K in (16, 64):
            keys, values = _bindings(ref, K, 16, seed)
            for beta in (1.0, 5.0):
                got = scalar(cand["softmax_recall_error"](keys, values, beta), "softmax_recall_error")
                close(got, ref["softmax_recall_error"](keys, values, beta), TOL,
                      f"softmax_recall_error vs reference (seed {seed}, K={K}, beta={beta:g})")
    for d_k in (16, 64):
        for K in (16, 64, 128):
            keys, values = _bindings(ref, K, d_k, 0)
            got = scalar(cand["softmax_recall_error"](keys, values, 50.0), "softmax_recall_error")
            if not got < SOFTMAX_MAX:
                raise Fail(f"softmax readout at beta=50, K={K}, d_k={d_k}: error {got:.2e} (needs < {SOFTMAX_MAX:g})")


def _curve(cand, Ks, d_k, seeds, kind):
    c = cand["capacity_curve"](Ks, d_k, seeds, key_kind=kind)
    tensor_like(c, (len(Ks),), F64, f"capacity_curve({Ks}, {d_k}, key_kind={kind!r})")
    return c


def capacity_orthonormal(cand, ref):
    for Ks, d_k in (([1, 4, 8, 16], 16), ([32, 64], 64)):
        c = _curve(cand, Ks, d_k, range(3), "orthonormal")
        if not float(c.abs().max()) < TOL:
            raise Fail(f"orthonormal keys, K <= d_k = {d_k}: errors {[f'{x:.1e}' for x in c.tolist()]} "
                       f"(exact recall needs < {TOL:g})")


def capacity_rising(cand, ref):
    Ks = [8, 16, 32, 64, 128]
    c = _curve(cand, Ks, 16, range(4), "random")
    if not bool((c[1:] > c[:-1]).all()):
        raise Fail(f"random keys, d_k=16: error does not rise with K {Ks}: {[round(x, 3) for x in c.tolist()]}")


def capacity_random(cand, ref):
    for K, d_k in ((64, 16), (128, 16), (64, 64)):
        got = float(_curve(cand, [K], d_k, range(8), "random")[0])
        predicted = math.sqrt((K - 1) / d_k)
        if not abs(got / predicted - 1) < CAPACITY_REL:
            raise Fail(f"random unit keys K={K}, d_k={d_k}: mean error {got:.3f} over 8 seeds, "
                       f"sqrt((K-1)/d_k) = {predicted:.3f} (needs within {CAPACITY_REL:.0%})")


CONCERNS = [la_normalized, la_unnormalized, la_precision, gla_scalar, gla_vector, retnet_mask, gla_mask,
            fft_causal, fft_impulse, toeplitz_oracle, fft_cyclic, unit_vectors, orthonormal_vectors,
            recall_error, softmax_baseline, capacity_orthonormal, capacity_rising, capacity_random]
CONCERN_NAMES = [c.__name__ for c in CONCERNS]


# ---------------------------------------------------------------- running

def expected_losses() -> dict[str, set[str]]:
    """README entries: - `file.py` (loses: a, b): description   ('none' for correct variants)."""
    table = {}
    for match in re.finditer(r"^- `([\w.]+\.py)` \(loses: ([^)]*)\)", README.read_text(), flags=re.M):
        names = {n.strip() for n in match.group(2).split(",") if n.strip() and n.strip() != "none"}
        table[match.group(1)] = names
    return table


def run_file(path: Path, ref: dict) -> tuple[dict[str, str], list[str]]:
    """Failure message per lost concern, and problems with the file itself."""
    code = path.read_text()
    problems = []
    defined = defined_functions(code) & set(SYMBOLS)
    if path.name.startswith("correct_") and defined != set(SYMBOLS):
        problems.append(f"a correct variant must define every scaffold function; missing {sorted(set(SYMBOLS) - defined)}")
    if not defined:
        problems.append("defines no scaffold function")
    cand = namespace(code, path.name)
    lost = {}
    for concern in CONCERNS:
        torch.manual_seed(12345)    # the global state is only touched by a generator-ignoring file
        try:
            concern(cand, ref)
        except Exception as exc:  # a crash loses the concern too
            message = str(exc).splitlines()[0] if str(exc) else ""
            lost[concern.__name__] = message if isinstance(exc, Fail) else f"{type(exc).__name__}: {message}"
    return lost, problems


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    files = [HERE / a if not Path(a).is_absolute() else Path(a) for a in argv] or sorted(
        p for p in HERE.glob("*.py") if p.name.startswith(("correct_", "mutant_")))
    expected = expected_losses()
    ref = namespace()
    start = time.perf_counter()
    print(f"{len(SYMBOLS)} scaffold functions, {len(CONCERNS)} concerns: {', '.join(CONCERN_NAMES)}\n")
    bad = 0
    for path in files:
        lost, problems = run_file(path, ref)
        want = expected.get(path.name)
        agrees = want is not None and set(lost) == want and not problems
        bad += not agrees
        kept = len(CONCERNS) - len(lost)
        verdict = "as expected" if agrees else "MISMATCH"
        print(f"{'ok ' if agrees else 'BAD'} {path.name:<36} pass {kept:>2}/{len(CONCERNS)}  "
              f"fail: {', '.join(lost) or '-'}  [{verdict}]")
        for name, message in lost.items():
            print(f"      {name}: {message[:150]}")
        if want is None:
            print("      not listed in README.md")
        elif set(lost) != want:
            print(f"      README says it loses: {', '.join(sorted(want)) or 'nothing'}")
        for problem in problems:
            print(f"      {problem}")
    print(f"\n{len(files) - bad}/{len(files)} files behave as README.md says ({time.perf_counter() - start:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
