"""Exercise 3's method: ``train_recall`` and ``recall_accuracy`` called by the probe with inputs
of the grader's (``probe_driver.case_recall_training`` and ``case_recall_scoring``).

- ``recall_batches``: ``train_recall`` run for each layer pattern with the grader's seed trains a
  model of that pattern for the budget's steps on the recall batches that seed draws, in order
  (so every pattern trained with one seed sees the same batches), and on nothing else
  (``training.unobserved_gradients``). The batches are recomputed here with the master's
  ``recall_batch``.
- ``recall_query_loss``: the loss reaches the query positions only, each pulling up the value its
  query asks for. Read from the gradient each training step's logits received, observed from the
  grader's side: a cross-entropy's gradient is nonzero at the positions it scores and lowest at
  each one's target.
- ``recall_scoring``: ``recall_accuracy`` on queries of the grader's, answered by a model whose
  logits the grader chose, returns the accuracy by distance and overall that the grader's own
  scoring of those logits gives.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from grader.checks import CheckContext, Verdict
from grader.checks.linear_attention.cases import GRADING_RUN, RECALL_PAIRS, RECALL_TRAINING, recall_queries
from grader.checks.linear_attention.items import exercise_run
from grader.checks.linear_attention.training import (Draws, also_in_grading_run, grading_run,
                                                     grading_run_batches_problem, in_grading_run, seeded_draws,
                                                     unobserved_gradients)
from grader.reference import reference_namespace

RECALL_ITEMS = ("recall_batches", "recall_query_loss", "recall_scoring")
QUERIES = range(2 * RECALL_PAIRS, 3 * RECALL_PAIRS)   # the positions of the queries in a row
ATOL = 1e-6   # accuracies are shares of at most a few hundred answers: any miscount is far larger


def recall_checks(context: CheckContext) -> dict[str, Callable[[], Verdict]]:
    return {"recall_batches": lambda: also_in_grading_run(_trained(context, _batches), grading_run_problem(context)),
            "recall_query_loss": lambda: also_in_grading_run(_trained(context, _query_loss),
                                                             grading_run_query_problem(context)),
            "recall_scoring": lambda: judge_scoring(context)}


def _trained(context: CheckContext, judge: Callable[[Path, dict[str, Any]], Verdict]) -> Verdict:
    info, decided = exercise_run(context, "recall_training", "train_recall", "sizes, budget and seed",
                                 "train_recall stopped when a model's forward")
    if decided:
        return decided
    for name, pattern in RECALL_TRAINING["patterns"].items():
        model = info["models"][name]
        if model["kinds"] != pattern:
            return Verdict("failed", f"train_recall({pattern}, ...) returned a model of layers {model['kinds']}: build "
                                     "the model of the pattern it is given")
        if model["index"] is None:
            return Verdict("failed", f"the model train_recall returned for {name} never ran forward: return the "
                                     "model it trained")
    return judge(context.master_path, info)


def _training_steps(info: dict[str, Any], name: str) -> list[dict[str, Any]]:
    index = info["models"][name]["index"]
    return [call for call in info["calls"] if call["model"] == index and call["training"]]


@lru_cache(maxsize=2)
def seeded_batches(master_path: Path, draws: int) -> Draws:
    """The first ``draws`` batches the master's recall_batch draws from the grader's seed."""
    recall_batch = reference_namespace(master_path)["recall_batch"]
    size = RECALL_TRAINING["budget"]["batch_size"]
    return seeded_draws(lambda generator: recall_batch(size, generator)[0], draws, RECALL_TRAINING["seed"])


def _batches(master_path: Path, info: dict[str, Any]) -> Verdict:
    steps, patterns = RECALL_TRAINING["budget"]["steps"], RECALL_TRAINING["patterns"]
    stream = seeded_batches(master_path, steps * (len(patterns) + 1))
    for name in patterns:
        seen = [tuple(tuple(row) for row in call["tokens"] or ()) for call in _training_steps(info, name)]
        if len(seen) != steps:
            return Verdict("failed", f"{name} ran {len(seen)} training forward passes (with gradients); the budget "
                                     f"given has {steps} steps: train for exactly the budget's steps")
        for step, batch in enumerate(seen):
            if batch == stream[step]:
                continue
            where = f"{name}'s training batch {step + 1}"
            if batch in stream:
                return Verdict("failed", f"{where} is draw {stream.index(batch) + 1} of the seed's generator, not "
                                         f"draw {step + 1}: a generator carried over from an earlier call (draw from "
                                         "a new torch.Generator().manual_seed(seed) in each call, so that every "
                                         "pattern sees the same batches)")
            if step and batch == seen[step - 1]:
                return Verdict("failed", f"{where} repeats batch {step}: draw a new batch every step")
            return Verdict("failed", f"{where} is not draw {step + 1} of recall_batch from "
                                     "torch.Generator().manual_seed(seed): draw every batch from a generator seeded "
                                     "with the seed given, so that every pattern sees the same batches")
        unobserved = unobserved_gradients(name, info["models"][name])
        if unobserved:
            return Verdict("failed", unobserved)
    return Verdict("passed", f"each pattern trained {steps} steps on the batches the seed draws, in order")


def grading_run_problem(context: CheckContext) -> str | None:
    """Exercise 3 in the grading run (``training.grading_run``): each model trained on the batches
    recall_batch draws with seed 0 at the notebook's batch size, in order, by nothing but observed
    forwards."""
    record = grading_run(context, "recall")
    if record is None:
        return None
    budget = GRADING_RUN["recall"]["budget"]
    recall_batch = reference_namespace(context.master_path)["recall_batch"]
    draws = seeded_draws(lambda generator: recall_batch(budget["batch_size"], generator)[0], budget["steps"], 0)
    return grading_run_batches_problem(record, draws, "Exercise 3")


def _answers(row: list[int]) -> list[int]:
    """The value each query of a recall row asks for, read from the row's own pairs."""
    value_of = {row[i]: row[i + 1] for i in range(0, 2 * RECALL_PAIRS, 2)}
    return [value_of.get(row[q], -1) for q in QUERIES]


def _spans(positions: list[int]) -> str:
    listed = ", ".join(str(p) for p in positions[:6]) + (", ..." if len(positions) > 6 else "")
    return f"position {listed}" if len(positions) == 1 else f"positions {listed}"


def grading_run_query_problem(context: CheckContext) -> str | None:
    """Exercise 3's loss in the grading run (``training.grading_run``), at the notebook's sizes:
    every training step's gradient reached the query positions only, each at its answer."""
    record = grading_run(context, "recall")
    if record is None:
        return None
    verdict = _query_loss(context.master_path, record)
    return None if verdict.status == "passed" else f"{in_grading_run('Exercise 3')}, {verdict.message}"


def _query_loss(master_path: Path, info: dict[str, Any]) -> Verdict:
    """Whether every training step of each model of ``info`` scored the queries only, each
    against its answer."""
    queries = list(QUERIES)
    for name in info["models"]:
        for step, call in enumerate(_training_steps(info, name), 1):
            gradient, tokens = call.get("gradient"), call["tokens"] or []
            where = f"{name}'s training step {step}"
            if gradient is None:
                return Verdict("failed", f"no gradient reached the logits of {where}: compute the loss from the "
                                         "logits the model returns, and backpropagate it")
            for row, (positions, targets) in enumerate(zip(gradient["positions"], gradient["targets"])):
                extra, missing = sorted(set(positions) - set(queries)), sorted(set(queries) - set(positions))
                shifted = " (the logits shifted one position, as for next-token prediction?)" if (
                    extra == [queries[0] - 1] and missing == [queries[-1]]) else ""
                if extra:
                    return Verdict("failed", f"the loss of {where} reached {_spans(extra)} of row {row}, which are "
                                             f"not queries (the queries are positions {queries[0]} to {queries[-1]}; "
                                             f"the pairs are random){shifted}: score the logits at the last "
                                             "RECALL_NUM_PAIRS positions only")
                if missing:
                    return Verdict("failed", f"the loss of {where} did not reach query {_spans(missing)} of row {row}: "
                                             "score every query")
                for position, target, answer in zip(positions, targets, _answers(tokens[row])):
                    if target != answer:
                        return Verdict("failed", f"at {where}, row {row}, the loss at query position {position} "
                                                 f"(key {tokens[row][position]}) pulls up token {target}; the value "
                                                 f"stored with that key is {answer}: score each query against "
                                                 "answers, in the order of the queries")
    return Verdict("passed", "each training step's loss reached the query positions only, each pulling up the value "
                             "its query asks for")


def _accuracy(predictions: np.ndarray, answers: np.ndarray, buckets: np.ndarray) -> tuple[list[float], float]:
    correct = (predictions == answers).astype(float)
    return [float(correct[buckets == d].mean()) for d in range(1, RECALL_PAIRS + 1)], float(correct.mean())


@lru_cache(maxsize=1)
def scorings() -> dict[str, tuple[list[float], float]]:
    """The grader's scoring of its model's answers (``right``), and the named mistakes'."""
    q = recall_queries()
    answers, distances = q["answers"].astype(int), q["distances"].astype(int)
    argmax = q["logits"].argmax(axis=-1)
    at_queries, one_early = argmax[:, list(QUERIES)], argmax[:, QUERIES.start - 1:QUERIES.stop - 1]
    order = np.broadcast_to(np.arange(1, RECALL_PAIRS + 1), answers.shape)
    right = _accuracy(at_queries, answers, distances)
    return {"right": right,
            "the predictions one position early (the logits at positions 23 to 34)":
                _accuracy(one_early, answers, distances),
            "bucketed by query order, not by distance": _accuracy(at_queries, answers, order),
            "listed from distance 12 down to 1": (right[0][::-1], right[1])}


def _listed(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def judge_scoring(context: CheckContext) -> Verdict:
    info, decided = exercise_run(context, "recall_scoring", "recall_accuracy", "model and queries", "")
    if decided:
        return decided
    returned = info.get("returned")
    accuracy = (returned or {}).get("accuracy")
    overall = (returned or {}).get("overall_accuracy")
    if not isinstance(accuracy, list) or len(accuracy) != RECALL_PAIRS or overall is None:
        return Verdict("failed", f"recall_accuracy returned {info.get('type')} {returned if returned else ''}; "
                                 f"expected {{'accuracy': [{RECALL_PAIRS} shares, distance 1 to {RECALL_PAIRS}], "
                                 "'overall_accuracy': share}")
    if not info.get("rows_scored"):
        return Verdict("failed", "recall_accuracy never ran the model it was given: score that model's own "
                                 "predictions on the queries given")
    options = scorings()
    expected, expected_overall = options["right"]
    if np.allclose(accuracy, expected, rtol=0, atol=ATOL) and abs(overall - expected_overall) <= ATOL:
        return Verdict("passed", "recall_accuracy's accuracy by distance and overall equal the grader's scoring of "
                                 "the same model's answers to the grader's queries")
    diagnosis = next((f" ({name}?)" for name, (by_distance, _) in options.items()
                      if name != "right" and np.allclose(accuracy, by_distance, rtol=0, atol=ATOL)), "")
    if not np.allclose(accuracy, expected, rtol=0, atol=ATOL):
        return Verdict("failed", f"recall_accuracy returned accuracy {_listed(accuracy)} by distance 1 to "
                                 f"{RECALL_PAIRS}; the grader's scoring of the same answers gives "
                                 f"{_listed(expected)}{diagnosis}")
    return Verdict("failed", f"recall_accuracy returned overall_accuracy {overall:.4f}; the share of the model's "
                             f"answers that are right is {expected_overall:.4f}")
