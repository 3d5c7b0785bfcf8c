"""The inputs the probe runs through the student's LinearAttention, generated from seeds.

Every case exists twice, ``<name>_float64`` and its twin ``<name>_float32`` (the same inputs,
with the layer and the input in float32): see the dtype rule in ``grader.checks.compare``.
Where a float32-accurate run is judged on its float64 run alone (every kind but ``forward``,
whose twins share one worker), the twin runs only when its float64 case could not, or, for a
step run, when the forward case it is compared with could not (equivalence then compares the
two forms' float32 runs).
Inputs are ordinary (unit-scale projections), so phi(q).z stays far above EPS and every EPS
convention gives the same outputs to float64 precision.

The ``forward`` cases of the shapes and decays share one worker (``FORWARD_BATCH``, see
``ProbeCase.batch``): each is judged against values computed from its own inputs (the
reference, or the computation the checks identified, with one concern put right), its
float32 twin is given the same arrays, and the step loop it is compared with runs in
other workers. So code that kept the earlier forward cases' inputs can do nothing with them
that it could not do with its own. The step runs of those shapes and decays
(``STEPS_BATCH``) run in passes: the first half of every run in one worker, then every
second half in another, so no worker sees both halves of a run, and step gets from the
first half only the state the harness relayed; each run is judged on its own inputs. The
causality pairs, the other step runs, the state growth, the state contract and the hybrid
model each have a worker of their own.
"""
from __future__ import annotations

import math
from functools import cache

import numpy as np

from grader.probe import MAX_STATE_ARRAYS, ProbeCase, Segments

# (batch, tokens, embedding_dim, heads): batch 1 and > 1, T from 1 to 256, d_h from 2 to 8.
SHAPES = ((1, 1, 8, 2), (2, 17, 12, 3), (3, 64, 16, 4), (1, 256, 32, 4))
GAMMAS = ("none", "mild", "strong", "per_head")
# Where the checks find which computation each form does, under every decay setting (a decay
# mistake can show at one only: a clamp below 1 at gamma = 1).
IDENTIFYING_SHAPES = (2, 3)

RESUME_TOKENS, RESUME_SEGMENTS = 16, [(0, 9), (9, 16)]
STATE_CHECKPOINTS = [1, 10, 1000]
# The state contract: a chain of steps keeping every state step returned, then token
# CONTRACT_TWICE_FROM + 1 stepped twice from the state kept after token CONTRACT_TWICE_FROM,
# then the tokens after CONTRACT_BACK_TO stepped again from the state kept after it.
CONTRACT_TOKENS, CONTRACT_TWICE_FROM, CONTRACT_BACK_TO = 5, 2, 0
CAUSAL_SHAPES = (1, 2, 3)
# Alignment, observed on its own (``alignment_arrays``): q reads the first half of the
# channels, k and v the second, so changing the second half of token ALIGN_TOKEN changes only
# that token's key and value; its output must change, whatever the form gets wrong elsewhere.
ALIGN_SHAPE, ALIGN_TOKEN = (2, 9, 12, 3), 4
# Per-head decay, observed on its own (``per_head_arrays``): heads with one set of weights that
# differ only in gamma (out_proj the identity, so each head's output is its channels). Head h of
# the run with every head's logit must equal head h of the run where every head has logit h.
PER_HEAD_SHAPE, PER_HEAD_LOGITS = (2, 12, 16, 4), (2.0, -1.0, 0.5, 4.0)
# The recurrent decay, observed on its own (``probe_driver.case_grader_state``): one step from a
# state the grader built and one from the zero state, on the same token; what step adds cancels
# in their difference, which must be gamma_h times the state handed in.
GRADER_STATE_SHAPE = (2, 1, 12, 3)
# Numerics at the notebook's own sizes: Exercise 4 runs 512 tokens at gamma_logit 0 (gamma 0.5),
# the longest sequence and the smallest decay the notebook runs. forward and a chain of steps run
# there in float32 and in float64 (both always), and the float32 run must be finite and agree with
# the same code's float64 run within items.NUMERICS_ROUNDINGS float32 roundings per token.
NUMERICS_SHAPE, NUMERICS_LOGITS = (1, 512, 16, 4), (0.0, 2.0, 0.0, 4.6)
# Exercise 1's sweep, observed (``probe_driver.case_benchmark``): layers at the exercise's sizes
# (the notebook's BENCH_DIM and BENCH_HEADS, which the student's code may read), called twice.
# First as the notebook's grading-mode run calls it (its DECODE_HISTORY_LENGTHS, repeats and
# warmup), so that the times the notebook reports can be held to that observed run; then with
# history lengths of the grader's own, none of them the notebook's, so that a sweep ignoring the
# lengths it is given shows.
BENCHMARK = {"embedding_dim": 128, "num_heads": 4, "history_lengths": [24, 96, 384],
             "notebook_lengths": [64, 128, 256, 512, 1024], "repeats": 15, "warmup": 3,
             "returned": ["full_ms_per_step", "linear_ms_per_step", "kv_cache_bytes", "linear_state_bytes"]}
# Exercise 4 (``probe_driver.case_decay_norms`` and ``case_learned_decays``): a small layer
# stepped through tokens of the grader's under decay logits whose labels are not the notebook's,
# and the three layer patterns with per-head logits of the grader's in each linear layer.
DECAY_NORMS = {"embedding_dim": 16, "num_heads": 4, "tokens": 12, "dtype": "float32",
               "logits": {"40": 40.0, "2.5": 2.5, "-0.5": -0.5}}
NORMS_MAX_STEPS = 120   # as in probe_driver.py
LEARNED_DECAYS = {"vocab_size": 11, "embedding_dim": 16, "num_heads": 4, "max_seq_len": 8, "hidden_dim": 16,
                  "seed": 5, "patterns": {"all_full": ["full"] * 4, "all_linear": ["linear"] * 4,
                                          "hybrid_LLLF": ["linear", "linear", "linear", "full"]}}
# Exercise 2 (``probe_driver.case_training``): the three patterns at a tiny size and budget, on
# random token streams of the grader's (any window of one is found in neither the other nor
# elsewhere in it), over an alphabet that spells the sample prompt.
TRAINING_ALPHABET = "Once upon a time, the cat sat."
TRAINING = {"alphabet": TRAINING_ALPHABET, "seed": 7,
            "model": {"embedding_dim": 16, "num_heads": 4, "hidden_dim": 32, "context": 8},
            "budget": {"steps": 3, "batch_size": 2, "context": 8, "eval_batches": 2, "sample_tokens": 3},
            "patterns": LEARNED_DECAYS["patterns"]}
# Exercise 3 (``probe_driver.case_recall_training`` and ``case_recall_scoring``): train_recall for
# each pattern at a tiny size and budget with a seed of the grader's; recall_accuracy on queries of
# the grader's (the notebook's task sizes: 12 pairs, keys 0..31, values 32..63), answered by a
# model whose logits the grader chose, right more often at short distances.
RECALL_PAIRS, RECALL_KEYS, RECALL_VOCAB = 12, 32, 64
RECALL_TRAINING = {"seed": 6, "model": {"embedding_dim": 16, "num_heads": 4},
                   "budget": {"steps": 3, "batch_size": 4, "lr": 1e-3}, "patterns": LEARNED_DECAYS["patterns"]}
RECALL_SCORING = {"seed": 8, "rows": 24, "vocab_size": RECALL_VOCAB, "embedding_dim": 8, "num_heads": 2,
                  "max_seq_len": 3 * RECALL_PAIRS}
# The notebook's grading-mode run of Exercises 2 to 4 (``probe_driver.case_grading_run``), as its
# run cells make it: the data, budgets, seeds and sizes, the layer patterns in their order. The
# written answers are grounded on what the grader measures in that run (``observed``).
GRADING_RUN_CASE = "grading_run"
GRADING_RUN = {"patterns": LEARNED_DECAYS["patterns"],
               "training": {"stories": 200, "max_chars": 200_000, "eval_seed": 1234,
                            "budget": {"steps": 4, "batch_size": 4, "context": 32, "eval_batches": 1,
                                       "sample_tokens": 24}},
               "recall": {"model": {"embedding_dim": 64, "num_heads": 4}, "eval_seed": 999,
                          "budget": {"steps": 4, "batch_size": 8, "eval_size": 16, "lr": 1e-3}},
               "norms": {"embedding_dim": 128, "num_heads": 4, "tokens": 512, "positions": [1, 8, 64, 128, 256, 512],
                         "logits": {"50": 50.0, "4.6": 4.6, "0": 0.0}}}
GRADING_RUN_LINEAR_LAYERS = 4   # at most, in one model of the patterns
HYBRID = {"vocab_size": 23, "embedding_dim": 16, "num_heads": 4,
          "layer_pattern": ["linear", "linear", "linear", "full"],
          "max_seq_len": 32, "hidden_dim": 32, "seed": 3}


def logits(kind: str, heads: int) -> list[float]:
    """Decay logits per head; 50 gives gamma == 1.0 exactly in float64 and float32."""
    per_head = [4.6, 0.0, 2.0, -1.0]
    return {"none": [50.0] * heads, "mild": [3.0] * heads, "strong": [0.0] * heads,
            "per_head": per_head[:heads]}[kind]


# The hybrid model's parameters whose gradients the checks can read: at least as many as the
# model has (a check raises otherwise), within the probe's arrays per message (MAX_ARRAYS).
HYBRID_MAX_PARAMETERS = 128


# Output names that probe_driver.py writes (it cannot import this module: it runs in the sandbox).
def checkpoint_output(steps: int, part: int) -> str:
    """The name of part ``part`` of the state after ``steps`` steps of the state_growth case."""
    return f"checkpoint_{steps}.{part}"


def state_part_output(stage: str, part: int) -> str:
    """The name of part ``part`` of a state the state_contract case saved at ``stage``:
    ``returned.<t>`` (copied when step returned it for token t), ``kept.<t>`` (the same object
    read after every step), ``twice.<n>`` (call n of the repeated step), ``again`` (the end of
    the re-stepped chain)."""
    return f"{stage}.{part}"


def contract_stages() -> list[str]:
    """Every stage whose states the state_contract case saves."""
    chain = [f"{kind}.{t}" for kind in ("returned", "kept") for t in range(CONTRACT_TOKENS)]
    return [*chain, "twice.0", "twice.1", "again"]


def gradient_output(index: int) -> str:
    """The name of the gradient of the hybrid model's parameter ``index`` (in its own order)."""
    return f"grad.{index}"


# What each kind of case runs (a handler of probe_driver.py) and which of its outputs the checks read.
KEEP = {"forward": ("y", "decay"), "steps": ("y",),
        "state_growth": tuple(checkpoint_output(s, i) for s in STATE_CHECKPOINTS for i in range(MAX_STATE_ARRAYS)),
        "state_contract": ("chain.y", "twice.0.y", "twice.1.y", "again.y",
                           *(state_part_output(s, i) for s in contract_stages() for i in range(MAX_STATE_ARRAYS))),
        "hybrid": ("logits", "loss", *(gradient_output(i) for i in range(HYBRID_MAX_PARAMETERS))),
        "benchmark": (),
        "decay_norms": tuple(f"step.{n}.{part}" for n in range(NORMS_MAX_STEPS) for part in "xSz"),
        "learned_decays": (),
        "training": (),
        "recall_training": (),
        "recall_scoring": (),
        "grader_state": tuple(f"{stage}.{i}" for stage in ("given_after", "from_given", "from_zero")
                              for i in range(MAX_STATE_ARRAYS)),
        "grading_run": ("train.inputs", "recall.tokens",
                        *(f"{run}.{name}.logits" for run in ("train", "recall") for name in GRADING_RUN["patterns"]),
                        *(f"decay.{name}.{i}" for name in GRADING_RUN["patterns"]
                          for i in range(GRADING_RUN_LINEAR_LAYERS)),
                        *(f"norms.{label}.{n}" for label in GRADING_RUN["norms"]["logits"]
                          for n in GRADING_RUN["norms"]["positions"]))}


def token_segments(bounds: list[tuple[int, int]]) -> Segments:
    """A step run cut into workers at ``bounds`` of the tokens; each resumes from the state the
    previous one returned, relayed by the harness, which passes nothing else between them, so a
    step that needs more than (x_t, state) fails there. The trusted side measures the state
    after every segment (one segment: the state after the whole run)."""
    return Segments("x", tuple(bounds), axis=1, unit="tokens", state="a tuple of tensors (S, z)")


def segments(tokens: int) -> Segments:
    """A step run of ``tokens`` cut in two halves (a one-token run stays whole): one cut is what
    shows a step that keeps anything but its state."""
    cuts = sorted({tokens // 2} - {0, tokens})
    bounds = [0, *cuts, tokens]
    return token_segments(list(zip(bounds, bounds[1:])))


def unchanged_rows(batch: int) -> int:
    """The sequences of a causality pair whose tokens up to its cut are the same in both inputs:
    all but the last, which the changed input replaces whole (one sequence alone: that one)."""
    return max(1, batch - 1)


def name(kind: str, shape: int, gamma: str, dtype: str = "float64") -> str:
    return f"{kind}_s{shape}_{gamma}_{dtype}"


def names(kind: str, gammas: tuple[str, ...] = GAMMAS, shapes: tuple[int, ...] | None = None) -> list[str]:
    """The float64 ``forward`` or ``steps`` cases of these decays (and shapes)."""
    return [name(kind, s, g) for s in (range(len(SHAPES)) if shapes is None else shapes) for g in gammas]


def twin_name(case_name: str) -> str:
    return case_name[: -len("float64")] + "float32"


def _weights(rng: np.random.Generator, dim: int) -> dict[str, np.ndarray]:
    bound = 1.0 / math.sqrt(dim)
    arrays = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        arrays[f"{proj}.weight"] = rng.uniform(-bound, bound, (dim, dim))
        arrays[f"{proj}.bias"] = rng.uniform(-bound, bound, dim)
    return arrays


def _layer_inputs(seed: list[int], shape: tuple[int, int, int, int], gamma: str) -> dict[str, np.ndarray]:
    batch, tokens, dim, heads = shape
    rng = np.random.default_rng(seed)
    arrays = _weights(rng, dim)
    arrays["gamma_logit"] = np.array(logits(gamma, heads))
    arrays["x"] = rng.standard_normal((batch, tokens, dim))
    return arrays


FORWARD_BATCH = "forward"
STEPS_BATCH = "steps"


def _both_dtypes(base: str, kind: str, config: dict, arrays: dict[str, np.ndarray],
                 fallback_for: list[str] | None = None, cut: Segments | None = None,
                 batch: str = "") -> list[ProbeCase]:
    """The case and its float32 twin. A twin ``fallback_for`` some float64 cases runs only when
    one of them fails to run: where float32-accurate code is fine in float64 (no comparison
    with a float64 reference), the twin is needed only by code that cannot run in float64."""
    twin = {"only_if_failed": [f"{b}_float64" for b in fallback_for]} if fallback_for else {}
    return [ProbeCase(f"{base}_float64", kind, {**config, "dtype": "float64"}, arrays, KEEP[kind], cut, batch=batch),
            ProbeCase(f"{base}_float32", kind, {**config, "dtype": "float32", **twin}, arrays, KEEP[kind], cut,
                      batch=batch)]


def learned_logits() -> dict[str, np.ndarray]:
    """Per-head gamma_logit of each linear layer of each pattern (``logits.<name>.<i>``, bottom
    to top), all different, so that an order or a head mixed up shows."""
    rng = np.random.default_rng(41)
    heads = LEARNED_DECAYS["num_heads"]
    return {f"logits.{name}.{i}": rng.uniform(-2.0, 5.0, heads)
            for name, pattern in LEARNED_DECAYS["patterns"].items()
            for i in range(pattern.count("linear"))}


def training_streams() -> dict[str, np.ndarray]:
    """Exercise 2's token streams: ``train_ids`` and ``val_ids``, uniform over the alphabet."""
    rng = np.random.default_rng(43)
    vocab = len(set(TRAINING_ALPHABET))
    return {"train_ids": rng.integers(0, vocab, 600).astype(np.float64),
            "val_ids": rng.integers(0, vocab, 300).astype(np.float64)}


def recall_queries() -> dict[str, np.ndarray]:
    """Exercise 3's scoring inputs: ``tokens`` (rows of pairs then queries, as recall_batch makes
    them), ``answers`` and ``distances`` (per query), and the ``logits`` (rows, tokens, vocabulary)
    the grader's model answers with: at a query, the answer's logit is highest with a probability
    that falls with the distance (0.95 at 1 to 0.3 at 12), else another token's is, by a margin;
    elsewhere the highest logit is anywhere."""
    rng = np.random.default_rng(47)
    rows, pairs = RECALL_SCORING["rows"], RECALL_PAIRS
    keys = np.stack([rng.permutation(RECALL_KEYS)[:pairs] for _ in range(rows)])
    values = rng.integers(RECALL_KEYS, RECALL_VOCAB, (rows, pairs))
    asked = np.stack([rng.permutation(pairs) for _ in range(rows)])
    tokens = np.empty((rows, 3 * pairs), dtype=np.int64)
    tokens[:, 0:2 * pairs:2], tokens[:, 1:2 * pairs:2] = keys, values
    tokens[:, 2 * pairs:] = np.take_along_axis(keys, asked, 1)
    answers, distances = np.take_along_axis(values, asked, 1), pairs - asked
    logits = rng.standard_normal((rows, 3 * pairs, RECALL_VOCAB))
    right = rng.random((rows, pairs)) < 0.95 - 0.65 * (distances - 1) / (pairs - 1)
    for b in range(rows):
        for j in range(pairs):
            wrong = (answers[b, j] + rng.integers(1, RECALL_VOCAB)) % RECALL_VOCAB
            logits[b, 2 * pairs + j, answers[b, j] if right[b, j] else wrong] = 4.0
    return {"tokens": tokens.astype(np.float64), "answers": answers.astype(np.float64),
            "distances": distances.astype(np.float64), "logits": logits}


def alignment_arrays() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The alignment pair: weights whose q reads only the first half of the channels and whose
    k and v read only the second, and an input whose token ALIGN_TOKEN has its second half
    replaced in the changed copy (its query stays the same)."""
    batch, tokens, dim, heads = ALIGN_SHAPE
    arrays = _layer_inputs([29], ALIGN_SHAPE, "per_head")
    half = dim // 2
    arrays["q_proj.weight"][:, half:] = 0.0
    arrays["k_proj.weight"][:, :half] = 0.0
    arrays["v_proj.weight"][:, :half] = 0.0
    changed = arrays["x"].copy()
    changed[:, ALIGN_TOKEN, half:] = np.random.default_rng(31).standard_normal((batch, dim - half)) * 2
    return arrays, {**arrays, "x": changed}


def per_head_arrays(logit_of: int | None) -> dict[str, np.ndarray]:
    """Heads with one set of q, k and v weights, out_proj the identity: every head's logit
    (``logit_of`` None) or every head given head ``logit_of``'s logit."""
    batch, tokens, dim, heads = PER_HEAD_SHAPE
    arrays = _layer_inputs([41], PER_HEAD_SHAPE, "mild")
    for proj in ("q_proj", "k_proj", "v_proj"):
        block = arrays[f"{proj}.weight"][: dim // heads]
        arrays[f"{proj}.weight"] = np.tile(block, (heads, 1))
        arrays[f"{proj}.bias"] = np.tile(arrays[f"{proj}.bias"][: dim // heads], heads)
    arrays["out_proj.weight"], arrays["out_proj.bias"] = np.eye(dim), np.zeros(dim)
    logits = np.array(PER_HEAD_LOGITS[:heads])
    arrays["gamma_logit"] = logits if logit_of is None else np.full(heads, logits[logit_of])
    return arrays


def per_head_name(form: str, logit_of: int | None) -> str:
    kind = FORM_KINDS[form]
    return f"heads_{kind}_all_float64" if logit_of is None else f"heads_{kind}_uniform{logit_of}_float64"


FORM_KINDS = {"forward": "forward", "step": "steps"}


def grader_state_arrays() -> dict[str, np.ndarray]:
    """A layer, one token and a state (S, z) of the grader's (``given.0``, ``given.1``; z
    positive, as a real z is)."""
    batch, _, dim, heads = GRADER_STATE_SHAPE
    arrays = _layer_inputs([43], GRADER_STATE_SHAPE, "per_head")
    rng = np.random.default_rng(44)
    d = dim // heads
    arrays["given.0"] = rng.standard_normal((batch, heads, d, d))
    arrays["given.1"] = rng.uniform(0.5, 2.0, (batch, heads, d))
    return arrays


def _isolating_cases() -> list[ProbeCase]:
    """The cases that observe one concern each, whatever else the code gets wrong."""
    found: list[ProbeCase] = []
    original, changed = alignment_arrays()
    dim, heads = ALIGN_SHAPE[2], ALIGN_SHAPE[3]
    config = {"embedding_dim": dim, "num_heads": heads, "token": ALIGN_TOKEN}
    for kind in ("forward", "steps"):
        pair = [f"align_{kind}_original", f"align_{kind}_changed"]
        cut = token_segments([(0, ALIGN_SHAPE[1])]) if kind == "steps" else None
        found += _both_dtypes(pair[0], kind, config, original, pair, cut)
        found += _both_dtypes(pair[1], kind, config, changed, pair, cut)
    dim, heads = PER_HEAD_SHAPE[2], PER_HEAD_SHAPE[3]
    for form, kind in FORM_KINDS.items():
        runs = [None, *range(heads)]
        names = [per_head_name(form, r)[: -len("_float64")] for r in runs]
        cut = token_segments([(0, PER_HEAD_SHAPE[1])]) if kind == "steps" else None
        for run, base in zip(runs, names):
            found += _both_dtypes(base, kind, {"embedding_dim": dim, "num_heads": heads}, per_head_arrays(run),
                                  names, cut)
    dim, heads = GRADER_STATE_SHAPE[2], GRADER_STATE_SHAPE[3]
    found += _both_dtypes("grader_state", "grader_state", {"embedding_dim": dim, "num_heads": heads},
                          grader_state_arrays(), ["grader_state"])
    arrays = _layer_inputs([47], NUMERICS_SHAPE, "strong")
    arrays["gamma_logit"] = np.array(NUMERICS_LOGITS)
    config = {"embedding_dim": NUMERICS_SHAPE[2], "num_heads": NUMERICS_SHAPE[3]}
    found += _both_dtypes("numerics_forward", "forward", config, arrays)
    found += _both_dtypes("numerics_steps", "steps", config, arrays, cut=token_segments([(0, NUMERICS_SHAPE[1])]))
    return found


def probe_cases() -> list[ProbeCase]:
    """Every input the harness runs, generated deterministically: built once per process, so the
    checks' trusted outputs, keyed by these inputs, are shared by every submission it grades."""
    return list(_probe_cases())


@cache
def _probe_cases() -> tuple[ProbeCase, ...]:
    cases: list[ProbeCase] = []
    for kind in ("forward", "steps"):   # the forward cases one after another: they share a worker
        for shape_index, shape in enumerate(SHAPES):
            for gamma in GAMMAS:
                arrays = _layer_inputs([shape_index, GAMMAS.index(gamma)], shape, gamma)
                layer = {"embedding_dim": shape[2], "num_heads": shape[3]}
                base = name(kind, shape_index, gamma)[: -len("_float64")]
                # A step run is a worker per segment: its float32 twin only for code that cannot
                # run in float64 (float32-accurate code is judged on its float64 run), its step or
                # its forward: equivalence then compares the two forms' float32 runs.
                twin_of = [base, base.replace("steps_", "forward_", 1)] if kind == "steps" else None
                cases += _both_dtypes(base, kind, layer, arrays, twin_of,
                                      cut=segments(shape[1]) if kind == "steps" else None,
                                      batch=FORWARD_BATCH if kind == "forward" else STEPS_BATCH)
    # Causality: the same weights on an input whose tokens after `cut` are replaced, and with a
    # batch, every token of its last sequence too: the other sequences' outputs up to `cut` may
    # not change (``unchanged_rows``).
    for shape_index in CAUSAL_SHAPES:
        batch, tokens, dim, heads = SHAPES[shape_index]
        arrays = _layer_inputs([11, shape_index], SHAPES[shape_index], "per_head")
        cut = tokens // 2
        changed = arrays["x"].copy()
        rng = np.random.default_rng([12, shape_index])
        changed[:, cut + 1:] = rng.standard_normal((batch, tokens - cut - 1, dim)) * 3
        if batch > 1:
            changed[-1] = rng.standard_normal((tokens, dim)) * 3
        config = {"embedding_dim": dim, "num_heads": heads, "cut": cut}
        pair = [f"causal_s{shape_index}_original", f"causal_s{shape_index}_changed"]
        cases += _both_dtypes(pair[0], "forward", config, arrays, pair)
        cases += _both_dtypes(pair[1], "forward", config, {**arrays, "x": changed}, pair)
    # State size after 1, 10 and 1000 steps.
    arrays = _layer_inputs([13], (2, 1000, 16, 4), "per_head")
    cases += _both_dtypes("state_growth", "state_growth",
                          {"embedding_dim": 16, "num_heads": 4, "checkpoints": STATE_CHECKPOINTS}, arrays,
                          ["state_growth"])
    # step leaves the states it is given and returns unchanged: stepped twice from one, and back down a chain.
    arrays = _layer_inputs([23], (2, CONTRACT_TOKENS, 12, 3), "per_head")
    cases += _both_dtypes("state_contract", "state_contract",
                          {"embedding_dim": 12, "num_heads": 3, "twice_from": CONTRACT_TWICE_FROM,
                           "back_to": CONTRACT_BACK_TO}, arrays, ["state_contract"])
    # Resuming from a state: one run in a single worker, the same run cut in two workers.
    arrays = _layer_inputs([17], (2, RESUME_TOKENS, 12, 3), "per_head")
    config = {"embedding_dim": 12, "num_heads": 3}
    pair = ["resume_whole", "resume_split"]
    cases += _both_dtypes(pair[0], "steps", config, arrays, pair, token_segments([(0, RESUME_TOKENS)]))
    cases += _both_dtypes(pair[1], "steps", config, arrays, pair, token_segments(RESUME_SEGMENTS))
    cases += _isolating_cases()
    rng = np.random.default_rng(19)
    tokens = rng.integers(0, HYBRID["vocab_size"], (2, 20)).astype(np.float64)
    cases += _both_dtypes("hybrid", "hybrid", HYBRID, {"tokens": tokens}, ["hybrid"])
    cases.append(ProbeCase("benchmark", "benchmark", BENCHMARK, {}, KEEP["benchmark"]))   # float32, as the exercise
    arrays = _layer_inputs([37], (1, DECAY_NORMS["tokens"], DECAY_NORMS["embedding_dim"], DECAY_NORMS["num_heads"]),
                           "mild")
    cases.append(ProbeCase("decay_norms", "decay_norms", DECAY_NORMS, arrays, KEEP["decay_norms"]))
    cases.append(ProbeCase("learned_decays", "learned_decays", LEARNED_DECAYS, learned_logits(),
                           KEEP["learned_decays"]))
    cases.append(ProbeCase("training", "training", TRAINING, training_streams(), KEEP["training"]))
    cases.append(ProbeCase("recall_training", "recall_training", RECALL_TRAINING, {}, KEEP["recall_training"]))
    cases.append(ProbeCase("recall_scoring", "recall_scoring", RECALL_SCORING, recall_queries(),
                           KEEP["recall_scoring"]))
    cases.append(ProbeCase(GRADING_RUN_CASE, "grading_run", GRADING_RUN, {}, KEEP["grading_run"]))
    return tuple(sorted(cases, key=lambda c: "only_if_failed" in c.config))   # fallbacks after what they stand in for
