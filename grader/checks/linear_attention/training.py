"""Exercise 2's method: ``train_and_compare`` called by the probe on token streams, sizes and a
budget of the grader's (``probe_driver.case_training``), with every forward pass of the language
models observed from the grader's side.

- ``training_same_batches``: one model per layer pattern, each trained for the budget's steps
  on the seed's sequence of batches in order (the batches ``get_batch`` draws from a generator
  seeded with the seed given, as ``train_lm`` draws them, so every pattern sees the same ones),
  with one optimizer and one schedule across the run, and by nothing else: every gradient its
  parameters received came from an observed forward (``unobserved_gradients``).
- ``training_held_out``: each model evaluated on windows of the held-out stream only.
- ``training_parameters``: the counts returned are the models' own, and each model has the
  count the config builds (the patterns then differ by their decay logits only).

The streams are random tokens, so any window is found in one stream at one place only: which
batches a model saw is read from the tokens themselves, never from what the code reports.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict, torch
from grader.checks.linear_attention.cases import GRADING_RUN, GRADING_RUN_CASE, TRAINING, training_streams
from grader.checks.linear_attention.items import exercise_run
from grader.reference import reference_namespace

TRAINING_ITEMS = ("training_same_batches", "training_held_out", "training_parameters")


def training_checks(context: CheckContext) -> dict[str, Callable[[], Verdict]]:
    return {"training_same_batches": lambda: also_in_grading_run(
                _decided(context, lambda info: _same_batches(context.master_path, info)), grading_run_problem(context)),
            "training_held_out": lambda: _decided(context, _held_out),
            "training_parameters": lambda: _decided(context, _parameters)}


def also_in_grading_run(verdict: Verdict, problem: str | None) -> Verdict:
    """An item's verdict on its own case, failed by what the grader's run of the notebook's
    cells (``probe_driver.case_grading_run``) showed wrong: that run is the one student code
    cannot tell from the notebook's, so work done only when unobserved shows there."""
    if verdict.status != "passed" or problem is None:
        return verdict
    return Verdict("failed", problem)


def grading_run_output(context: CheckContext) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The grading run's (info, arrays), or None when it did not finish: every reader of that run
    starts here."""
    out = context.probe.cases.get(GRADING_RUN_CASE) if context.probe is not None else None
    return (out.info, out.arrays) if out is not None and out.status == "ok" else None


def grading_run(context: CheckContext, exercise: str) -> dict[str, Any] | None:
    """The grading run's record of ``exercise`` (``training`` or ``recall``): its ``models`` and
    ``calls``; None when the run or that exercise did not finish (the item's own case speaks)."""
    run = grading_run_output(context)
    if run is None or exercise in (run[0].get("errors") or {}):
        return None
    record = run[0] if exercise == "training" else run[0].get("recall")
    return record if isinstance(record, dict) and isinstance(record.get("models"), dict) else None


Draws = tuple[tuple[tuple[int, ...], ...], ...]   # batches of rows of token ids, in the order drawn


def seeded_draws(draw: Callable[[torch.Generator], torch.Tensor], count: int, seed: int) -> Draws:
    """The inputs of ``count`` batches ``draw(generator)`` returns one after another from a
    generator seeded with ``seed``: what a training loop that draws its batches in order sees."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(tuple(tuple(row) for row in draw(generator).tolist()) for _ in range(count))


def in_grading_run(exercise: str) -> str:
    """Where a grading-run problem was seen, as its message says it."""
    return (f"in the grader's run of the notebook's {exercise} cell (grading mode: the notebook's data, sizes, seeds "
            "and optimizers)")


def grading_run_batches_problem(record: dict[str, Any], draws: Draws, exercise: str) -> str | None:
    """Whether each model of a grading-run ``record`` trained on exactly the seed's ``draws``, in
    order, every gradient from an observed forward (None: it did)."""
    where = in_grading_run(exercise)
    for name, model in record["models"].items():
        seen = tuple(tuple(_rows(call)) for call in record.get("calls") or ()
                     if call.get("model") == model.get("index") and call.get("training"))
        if seen != draws:
            step = next((i for i, (a, b) in enumerate(zip(seen, draws)) if a != b), min(len(seen), len(draws)))
            return (f"{where}, {name} did not train on the seed's batches in order: its training step {step + 1} "
                    f"{'is missing' if step >= len(seen) else 'is not draw ' + str(step + 1)} ({len(seen)} steps "
                    f"where the budget has {len(draws)}), though the grader's own call of the function trained as "
                    "asked: train the same way however the function is called")
        unobserved = unobserved_gradients(name, model)
        if unobserved:
            return f"{where}: {unobserved}"
    return None


@lru_cache(maxsize=2)
def notebook_corpus(master_path: Path) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The grading-mode Exercise 2 corpus as the notebook's data cell makes it, from the master's
    own helpers: the training ids, the held-out ids and the vocabulary size."""
    ns = reference_namespace(master_path)
    setup = GRADING_RUN["training"]
    text = ns["load_story_text"](None, num_stories=setup["stories"], seed=0, max_chars=setup["max_chars"])
    tokenizer = ns["CharTokenizer"](text)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], tokenizer.vocab_size


def grading_run_problem(context: CheckContext) -> str | None:
    """Exercise 2 in the grading run: each model trained on the batches ``train_lm`` draws with
    seed 0 from the notebook's training ids, in order, by nothing but observed forwards."""
    record = grading_run(context, "training")
    if record is None:
        return None
    budget = GRADING_RUN["training"]["budget"]
    train_ids, _, _ = notebook_corpus(context.master_path)
    get_batch = reference_namespace(context.master_path)["get_batch"]
    draws = seeded_draws(lambda generator: get_batch(train_ids, budget["batch_size"], budget["context"], generator)[0],
                         budget["steps"], 0)
    return grading_run_batches_problem(record, draws, "Exercise 2")


def _decided(context: CheckContext, judge: Callable[[dict[str, Any]], Verdict]) -> Verdict:
    info, decided = exercise_run(context, "training", "train_and_compare", "data and budget",
                                 "train_and_compare stopped when a model's forward")
    if decided:
        return decided
    patterns = TRAINING["patterns"]
    models = info.get("models") or {}
    if set(models) != set(patterns) or any(models[name]["kinds"] != patterns[name] for name in patterns):
        found = {name: model["kinds"] for name, model in models.items()}
        return Verdict("failed", f"train_and_compare returned the models {found or 'none'}; expected one model per "
                                 f"layer pattern: {patterns}")
    return judge(info)


def _windows(stream: np.ndarray, length: int) -> set[tuple[int, ...]]:
    tokens = stream.astype(int).tolist()
    return {tuple(tokens[i:i + length]) for i in range(len(tokens) - length + 1)}


def _streams() -> tuple[set, set]:
    streams, context = training_streams(), TRAINING["budget"]["context"]
    return _windows(streams["train_ids"], context), _windows(streams["val_ids"], context)


def _rows(call: dict[str, Any]) -> list[tuple[int, ...]]:
    tokens = call.get("tokens")
    return [tuple(row) for row in tokens] if isinstance(tokens, list) and tokens and isinstance(tokens[0], list) else []


def _same_batches(master_path: Path, info: dict[str, Any]) -> Verdict:
    steps = TRAINING["budget"]["steps"]
    train, held_out = _streams()
    batches = {name: [_rows(c) for c in info["calls"] if c["model"] == model["index"] and c["training"]]
               for name, model in info["models"].items()}
    for name, seen in batches.items():
        if len(seen) != steps:
            return Verdict("failed", f"{name} ran {len(seen)} training forward passes (with gradients); the budget "
                                     f"given has {steps} steps: train every pattern for exactly the budget's steps")
        if any(row in held_out for batch in seen for row in batch):
            return Verdict("failed", f"{name} trained on windows of the validation split: train on train_ids only")
        if any(row not in train for batch in seen for row in batch):
            return Verdict("failed", f"{name} trained on inputs that are no windows of train_ids (of the context "
                                     "given): train on windows of the training split")
    for name, model in info["models"].items():
        unobserved = unobserved_gradients(name, model)
        if unobserved:
            return Verdict("failed", unobserved)
    first, *others = batches
    for name in others:
        step = next((i for i, (a, b) in enumerate(zip(batches[first], batches[name])) if a != b), None)
        if step is not None:
            return Verdict("failed", f"{name}'s training batch {step + 1} differs from {first}'s: every pattern "
                                     "must see the same batches in the same order (give train_lm the same seed)")
    for name, seen in batches.items():
        problem = _sequence_problem(master_path, name, seen) or _optimizer_problem(name, info["models"][name])
        if problem:
            return Verdict("failed", problem)
    return Verdict("passed", f"each pattern trained {steps} steps on the seed's batches in order (the same for every "
                             "pattern, all windows of the training split), with one optimizer and one schedule")


@lru_cache(maxsize=2)
def seeded_batches(master_path: Path) -> Draws:
    """The inputs of the batches the master's ``get_batch`` draws, one per step, from a generator
    seeded with the grader's seed on the grader's training stream (as ``train_lm`` draws them),
    plus as many again, to name a draw taken out of place."""
    budget = TRAINING["budget"]
    data = torch.tensor(training_streams()["train_ids"], dtype=torch.long)
    get_batch = reference_namespace(master_path)["get_batch"]
    return seeded_draws(lambda generator: get_batch(data, budget["batch_size"], budget["context"], generator)[0],
                        2 * budget["steps"], TRAINING["seed"])


def _sequence_problem(master_path: Path, name: str, seen: list[list[tuple[int, ...]]]) -> str | None:
    """Whether the batches of ``name``'s training steps are the seed's draws, in order (None)."""
    stream = seeded_batches(master_path)
    for step, batch in enumerate(tuple(b) for b in seen):
        if batch == stream[step]:
            continue
        where = f"{name}'s training batch {step + 1}"
        if step and batch == stream[0] and all(tuple(b) == stream[0] for b in seen[:step]):
            return (f"{where} is the seed's first batch again, as is every batch before it: the batch generator was "
                    f"seeded anew at every step. Diagnosis: the optimizer, its schedule and the generator are "
                    f"restarted at every step (train_lm called once per step?); call train_lm once per model with "
                    f"steps=budget['steps'], so one optimizer and one schedule run across the budget's "
                    f"{len(seen)} steps on the seed's batches in order")
        if batch in stream:
            return (f"{where} is draw {stream.index(batch) + 1} of the seed's generator, not draw {step + 1}: draw "
                    "the batches in order from one generator seeded with the seed given")
        return (f"{where} is not draw {step + 1} of get_batch from torch.Generator().manual_seed(seed): draw every "
                "batch from a generator seeded with the seed given (as train_lm does)")
    return None


def _optimizer_problem(name: str, model: dict[str, Any]) -> str | None:
    """Whether one optimizer and at most one schedule trained the model across the run (None)."""
    built = model.get("optimizers") or {}
    optimizers, schedules = built.get("optimizers", 0), built.get("schedules", 0)
    if optimizers <= 1 and schedules <= 1:
        return None
    return (f"{name} was trained by {optimizers} optimizers and {schedules} schedules over its parameters. "
            "Diagnosis: the optimizer and its schedule are restarted during the run (built anew at every step?), so "
            "the learning-rate warmup and the optimizer's moments start again; build one optimizer and one schedule "
            "per model and step them across the budget's steps (train_lm does)")


def unobserved_gradients(name: str, model: dict[str, Any]) -> str | None:
    """Whether gradients reached the model's parameters that no observed forward accounts for
    (``ObservedForwards.gradient_counts``): each backward pass from a loss on observed logits
    computes one gradient for each parameter it reaches, so no parameter may get more than the
    logits did, and one must get as many (None: they agree). Read from hooks in the student's
    process: student code that removes them there hides its extra steps, and gradients taken
    with ``torch.autograd.grad`` on copies of the parameters are not counted."""
    counts = model.get("gradients") or {}
    received, parameters = counts.get("logits", 0), counts.get("parameters")
    if not parameters:
        return None
    name_of, most = max(parameters.items(), key=lambda item: item[1])
    if most > received:
        return (f"{name}: gradients were computed {most} times for its parameter {name_of}, but the logits of its "
                f"forward passes the grader observed received {received}: a loss was backpropagated without a forward "
                "pass the grader sees (through the model's blocks, or through the forward's original taken from "
                "elsewhere?). Compute every loss from model(tokens)")
    if most < received:
        return (f"{name}: the logits of its observed forward passes received {received} gradients, but its "
                f"parameters at most {most}: the grader's count of its parameters' gradients was removed")
    return None


def _held_out(info: dict[str, Any]) -> Verdict:
    budget = TRAINING["budget"]
    train, held_out = _streams()
    for name, model in info["models"].items():
        evaluated = [_rows(c) for c in info["calls"] if c["model"] == model["index"] and not c["training"]
                     and len(_rows(c)) == budget["batch_size"] and len(_rows(c)[0]) == budget["context"]]
        rows = [row for batch in evaluated for row in batch]
        if not rows:
            return Verdict("failed", f"{name} was never evaluated on a batch of the budget's size without gradients: "
                                     "measure evaluate_loss on the validation split")
        if any(row in train for row in rows):
            return Verdict("failed", f"{name} was evaluated on windows of the training split: evaluate on val_ids, "
                                     "the held-out text")
        if any(row not in held_out for row in rows):
            return Verdict("failed", f"{name} was evaluated on inputs that are no windows of val_ids")
    return Verdict("passed", "each pattern was evaluated on windows of the held-out split only")


def _parameters(info: dict[str, Any]) -> Verdict:
    expected, returned = info["expected_parameters"], info.get("returned") or {}
    for name, model in info["models"].items():
        reported = (returned.get(name) or {}).get("parameters")
        if model["parameters"] != expected[name]:
            return Verdict("failed", f"{name} has {model['parameters']:,} parameters; built from the config given it "
                                     f"has {expected[name]:,}: build each model from the config and vocabulary given")
        if reported != model["parameters"]:
            return Verdict("failed", f"results[{name!r}]['parameters'] = {reported}; the model returned has "
                                     f"{model['parameters']:,} (model.num_parameters())")
    return Verdict("passed", "each model has the count its config builds, and the counts returned are the models' own")
