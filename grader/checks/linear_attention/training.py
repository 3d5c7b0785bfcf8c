"""Exercise 2's method: ``train_and_compare`` called by the probe on token streams, sizes and a
budget of the grader's (``probe_driver.case_training``), with every forward pass of the language
models observed from the grader's side.

- ``training_same_batches``: one model per layer pattern, each trained for the budget's steps
  on the same batches in the same order, drawn from the training stream, and by nothing else:
  every gradient its parameters received came from an observed forward (``unobserved_gradients``).
- ``training_held_out``: each model evaluated on windows of the held-out stream only.
- ``training_parameters``: the counts returned are the models' own, and each model has the
  count the config builds (the patterns then differ by their decay logits only).

The streams are random tokens, so any window is found in one stream at one place only: which
batches a model saw is read from the tokens themselves, never from what the code reports.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict
from grader.checks.linear_attention.cases import TRAINING, training_streams
from grader.checks.linear_attention.items import exercise_run

TRAINING_ITEMS = ("training_same_batches", "training_held_out", "training_parameters")


def training_checks(context: CheckContext) -> dict[str, Callable[[], Verdict]]:
    return {name: (lambda judge=judge: _decided(context, judge)) for name, judge in (
        ("training_same_batches", _same_batches), ("training_held_out", _held_out),
        ("training_parameters", _parameters))}


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


def _same_batches(info: dict[str, Any]) -> Verdict:
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
    return Verdict("passed", f"each pattern trained {steps} steps on the same batches in the same order, all "
                             "windows of the training split")


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
