"""Issue 40, part 2: the run a student reports is the run that was observed.

Each attack of the hostile round, on recorded outputs of the probe harness's own case code run in
this process (``probe_in_process``): the figures the notebook reports count only beside the run
the grader observed, the grader's timer is not the student's ``time.perf_counter``, and work done
outside the observed methods inside a timed call or a training call is named. The correct corpora
keep their marks (their own tests run them all; here the master's cell stands for them).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest

from grader import cells
from grader.checks import CheckContext, Verdict, checks_for, grounding_answers
from grader.checks.linear_attention.benchmark import BENCHMARK_CASE, FULL, LINEAR, METHOD_ITEMS, observed_timings
from grader.checks.linear_attention.cases import BENCHMARK, GRADING_RUN, GRADING_RUN_CASE
from grader.checks.linear_attention.observed import observed_answers
from grader.execute import execute_notebook
from grader.graft import submission_module_source
from grader.probe import ProbeResult, run_probe

from conftest import SWEEPS
from probe_in_process import exercise_probe, exercise_verdicts, scaffold_probe

TRAININGS = Path(__file__).parent / "trainings"
SWEEP_CELL = (SWEEPS / "correct_prefill_by_decoding.py").read_text()
FAKE_MS = 1e-6   # what the provided timer returns under the fake clock below: one nanosecond a reading


def sweep_probe(assignment, cell: str) -> ProbeResult:
    return exercise_probe(assignment, "decode_step_sweep", cell, (BENCHMARK_CASE,))


def reported(probe: ProbeResult, scale: float = 1.0, fixed: float | None = None) -> dict:
    """DECODE_BENCHMARK as the notebook's provided cell builds it from a sweep at the notebook's
    grading-mode lengths: the times the observed run returned (times ``scale``), or ``fixed``."""
    returned = probe.cases[BENCHMARK_CASE].info["notebook_run"]["returned"]
    lengths = BENCHMARK["notebook_lengths"]
    times = {key: [fixed if fixed is not None else t * scale for t in returned[key]]
             for key in ("full_ms_per_step", "linear_ms_per_step")}
    return {"history_lengths": lengths, **times, "kv_cache_bytes": [2 * t * 128 * 4 for t in lengths],
            "linear_state_bytes": [4 * (32 * 32 + 32) * 4] * len(lengths), "embedding_dim": 128, "num_heads": 4,
            "batch_size": 1, "bytes_per_element": 4, "device": "cpu"}


def timings_verdict(assignment, probe: ProbeResult | None, bench: dict) -> Verdict:
    """benchmark_timings's verdict on ``bench`` (checked for shape by benchmark_fields) beside ``probe``."""
    context = CheckContext(assignment.rubric, assignment.master_path, probe, None if probe else "not probed here",
                           None, "not executed in this test", {"DECODE_BENCHMARK": bench})
    return observed_timings(context, bench)


@pytest.fixture(scope="module")
def honest(assignment) -> ProbeResult:
    return sweep_probe(assignment, SWEEP_CELL)


def test_made_up_notebook_timings_lose_the_item_and_the_observed_ones_keep_it(assignment, honest):
    """A sweep honest when observed, whose notebook run prints other numbers: the report counts
    only where it agrees with the observed run, and the message names the figure."""
    kept = timings_verdict(assignment, honest, reported(honest))
    made_up = {factor: timings_verdict(assignment, honest, reported(honest, factor)) for factor in (100.0, 0.01)}
    print(f"\nobserved figures reported: {kept.status}; made-up figures (100x, 1/100x): "
          f"{', '.join(v.status for v in made_up.values())}")
    assert kept.status == "passed", kept.message
    for verdict in made_up.values():
        assert verdict.status == "failed"
        assert "DECODE_BENCHMARK['full_ms_per_step'][0]" in verdict.message
        assert "the grader's observed run of your decode_step_sweep measured" in verdict.message


def test_a_report_without_an_observed_run_counts_for_nothing(assignment, honest):
    verdict = timings_verdict(assignment, None, reported(honest))
    assert verdict.status == "failed" and "count only beside the grader's observed run" in verdict.message


FAKE_CLOCK = '''
import itertools as _itertools
_ticks = _itertools.count()
time.perf_counter = lambda: next(_ticks) * 1e-9   # every timer that reads time.perf_counter: 1 ns a call
'''


def test_a_replaced_perf_counter_changes_no_grader_timing(assignment):
    """Student code replaces time.perf_counter: the grader's timer, bound before any student code
    ran, measures real times, and the notebook's times taken with the fake clock disagree."""
    real = time.perf_counter
    try:
        probe = sweep_probe(assignment, FAKE_CLOCK + SWEEP_CELL)
    finally:
        time.perf_counter = real
    run = probe.cases[BENCHMARK_CASE].info["notebook_run"]
    medians = [m["median_ms"] for m in run["measurements"]]
    print(f"\nthe grader's medians under the student's fake clock: {min(medians):.4f} to {max(medians):.4f} ms "
          f"(the fake clock gives {FAKE_MS:g} ms)")
    assert min(medians) > 100 * FAKE_MS
    methods = exercise_verdicts(assignment, probe, METHOD_ITEMS)
    assert {v.status for v in methods.values()} == {"passed"}, methods
    verdict = timings_verdict(assignment, probe, reported(probe, fixed=FAKE_MS))
    assert verdict.status == "failed" and f"= {FAKE_MS:g} ms at T = 64" in verdict.message, verdict.message


# A teacher-forced prefix of T tokens computed inside the timed call, outside the observed methods:
# with raw tensor operations, and with MultiHeadAttention.forward's original taken from the wrapper.
RAW_PREFIX = '''
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM)
    for T in history_lengths:
        history = torch.randn(BENCH_BATCH, T, BENCH_DIM)
        cache = full_attn.init_cache(BENCH_BATCH, capacity=T + 1, device=DEVICE)

        def timed():
            PREFIX
            cache.length = T
            full_attn.decode_step(x_t, cache)
        out["full_ms_per_step"].append(time_median_ms(timed, device=DEVICE))
        out["kv_cache_bytes"].append(2 * T * BENCH_DIM * BYTES_PER_ELEMENT)
        state = [lin_attn.init_state(BENCH_BATCH)]

        def step():
            state[0] = lin_attn.step(x_t, state[0])[1]
        out["linear_ms_per_step"].append(time_median_ms(step, device=DEVICE))
        out["linear_state_bytes"].append(BENCH_HEADS * (BENCH_DIM // BENCH_HEADS + 1) * (BENCH_DIM // BENCH_HEADS) * 4)
    return out
'''
PREFIXES = {
    "raw tensor operations": "q, k, v = (history @ p.weight.T for p in (full_attn.q_proj, full_attn.k_proj, "
                             "full_attn.v_proj))\n            torch.softmax(q @ k.transpose(-1, -2), -1) @ v",
    "the original taken from the wrapper's closure":
        "original = next(c.cell_contents for c in type(full_attn).forward.__closure__ "
        "if getattr(c.cell_contents, '__name__', '') == 'forward')\n            original(full_attn, history)",
}


@pytest.mark.parametrize("how", sorted(PREFIXES))
def test_work_outside_the_observed_methods_in_a_timed_call_is_named(assignment, how):
    probe = sweep_probe(assignment, RAW_PREFIX.replace("PREFIX", PREFIXES[how]))
    verdicts = exercise_verdicts(assignment, probe, METHOD_ITEMS)
    print(f"\nprefix by {how}: {FULL.item} {verdicts[FULL.item].status}, {LINEAR.item} {verdicts[LINEAR.item].status}")
    assert verdicts[FULL.item].status == "failed", verdicts[FULL.item].message
    assert "outside every observed method" in verdicts[FULL.item].message
    assert verdicts[LINEAR.item].status == "passed", verdicts[LINEAR.item].message


def test_the_correct_sweeps_keep_both_method_items(assignment, honest):
    """The correct corpus (all of it in test_benchmark_method.py) and the master's cell are left alone."""
    master = next(cells.source(c) for c in assignment.master.cells if c.id == "ex1-benchmark")
    graded = {name: exercise_verdicts(assignment, sweep_probe(assignment, cell), METHOD_ITEMS)
              for name, cell in [("master", master), *((p.stem, p.read_text()) for p in SWEEPS.glob("correct_*.py"))]}
    passed = [name for name, verdicts in graded.items() if {v.status for v in verdicts.values()} == {"passed"}]
    print(f"\ncorrect sweeps left alone: {len(passed)} of {len(graded)}")
    assert len(passed) == len(graded), graded


# Exercise 2's correct loop (tests/trainings/correct_own_loop.py) with one more backward pass per
# step on the held-out split that no observed forward accounts for.
EXTRA_STEPS = {
    "a step on the held-out split through the model's blocks": '''
            held, _ = get_batch(val_ids, budget["batch_size"], budget["context"], batches)
            hidden = model.token_embedding[held] + model.position_embedding[:held.shape[1]]
            for block in model.blocks:
                hidden = block(hidden)
            (model.ln_final(hidden) @ model.token_embedding.T).logsumexp(-1).mean().backward()
            optimizer.step()''',
    "a second loss through the unwrapped forward": '''
            original = next(c.cell_contents for c in type(model).forward.__closure__
                            if getattr(c.cell_contents, '__name__', '') == 'forward')
            held, _ = get_batch(val_ids, budget["batch_size"], budget["context"], batches)
            original(model, held).logsumexp(-1).mean().backward()
            optimizer.step()''',
}


def _with_extra_step(extra: str) -> str:
    cell = (TRAININGS / "correct_own_loop.py").read_text()
    anchor = "            optimizer.step()\n"
    assert cell.count(anchor) == 1
    return cell.replace(anchor, anchor + extra.lstrip("\n") + "\n")


@pytest.mark.parametrize("how", sorted(EXTRA_STEPS))
def test_gradient_steps_outside_the_observed_forwards_are_named(assignment, how):
    probe = exercise_probe(assignment, "train_and_compare", _with_extra_step(EXTRA_STEPS[how]), ("training",))
    verdicts = exercise_verdicts(assignment, probe, ("training_same_batches",))
    verdict = verdicts["training_same_batches"]
    print(f"\n{how}: training_same_batches {verdict.status}")
    assert verdict.status == "failed", verdict.message
    assert "a loss was backpropagated without a forward pass the grader sees" in verdict.message


def test_the_correct_training_loops_keep_their_items(assignment):
    items = ("training_same_batches", "training_held_out", "training_parameters")
    graded = {p.stem: exercise_verdicts(assignment, exercise_probe(assignment, "train_and_compare", p.read_text(),
                                                                   ("training",)), items)
              for p in sorted(TRAININGS.glob("correct_*.py"))}
    passed = [name for name, verdicts in graded.items() if {v.status for v in verdicts.values()} == {"passed"}]
    print(f"\ncorrect training loops left alone: {len(passed)} of {len(graded)}")
    assert len(passed) == len(graded), graded


# ----------------------------------------------------------------------------- figures the written answers see

# Honest functions whose reports are made up: each exercise function does its work, then reports
# figures of its own (what a notebook run that "prints made-up numbers" exports).
MADE_UP_LOSS, MADE_UP_ACCURACY, MADE_UP_NORM, MADE_UP_DECAY = 0.0123, 0.987, 7.77, 0.4321
LYING_CELLS = {
    "train_and_compare": f'''
def train_and_compare(config, budget, seed=0):
    results, models = {{}}, {{}}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        model = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], pattern, config["num_heads"],
                                    max_seq_len=budget["context"], hidden_dim=config["hidden_dim"])
        train_lm(model, train_ids, steps=budget["steps"], batch_size=budget["batch_size"],
                 context=budget["context"], seed=seed)
        results[name] = {{"parameters": int(model.num_parameters()), "val_loss": {MADE_UP_LOSS}, "sample": "made up"}}
        models[name] = model
    return results, models
''',
    "recall_accuracy": None,   # the master's train_recall, with the recall_accuracy below
    "state_norms": f'''
def state_norms(layer, inputs, logits):
    return {{label: [{MADE_UP_NORM}] * inputs.shape[1] for label in logits}}


def learned_decays(models):
    return {{name: [[{MADE_UP_DECAY}] * 4 for block in model.blocks if block.kind == "linear"]
            for name, model in models.items()}}
''',
}
LYING_RECALL_ACCURACY = f'''

def recall_accuracy(model, tokens, answers, distances):
    return {{"accuracy": [{MADE_UP_ACCURACY}] * RECALL_NUM_PAIRS, "overall_accuracy": {MADE_UP_ACCURACY}}}
'''


def grading_run_probe(assignment, replaced: dict[str, str]) -> ProbeResult:
    """The grading run alone, on the master's scaffold cells with the cells defining each symbol
    of ``replaced`` replaced by its source."""
    return scaffold_probe(assignment, replaced, (GRADING_RUN_CASE,))


def _recall_cell_with_lying_accuracy(assignment) -> str:
    honest = cells.source(next(c for c in assignment.master.cells if c.get("id") == "ex3-recall"))
    return honest[:honest.index("def recall_accuracy")] + LYING_RECALL_ACCURACY.lstrip("\n")


def test_made_up_exercise_figures_never_reach_the_written_answers(assignment):
    """Exercises 2 to 4 done honestly but reported with made-up figures, in the notebook's run
    and in the probe's alike: the written answers are grounded on what the grader measured in its
    observed run of the notebook's cells (the honest code's figures), and no made-up figure
    reaches the request's grounding."""
    lying = {**LYING_CELLS, "recall_accuracy": _recall_cell_with_lying_accuracy(assignment)}
    honest = observed_answers(_context(assignment, grading_run_probe(assignment, {}), {}))
    made_up = {"TRAINING_RESULTS": {n: {"parameters": 1, "val_loss": MADE_UP_LOSS} for n in honest["TRAINING_RESULTS"]},
               "RECALL_RESULTS": {n: {"overall_accuracy": MADE_UP_ACCURACY} for n in honest["RECALL_RESULTS"]},
               "DECAY_RESULTS": {"state_norms": {"0": [MADE_UP_NORM]}, "learned_decays": {}}}
    context = _context(assignment, grading_run_probe(assignment, lying), made_up)
    grounded = grounding_answers(checks_for(assignment.rubric), context)
    for name in ("TRAINING_RESULTS", "RECALL_RESULTS", "DECAY_RESULTS"):
        assert grounded[name] == honest[name], f"{name}: the grounding is not the honest code's observed figures"
    text = json.dumps(grounded)
    found = [v for v in (MADE_UP_LOSS, MADE_UP_ACCURACY, MADE_UP_NORM, MADE_UP_DECAY) if str(v) in text]
    assert not found, f"made-up figures reached the grounding: {found}"
    losses = [entry["val_loss"] for entry in grounded["TRAINING_RESULTS"].values()]
    assert all(2.0 < loss < 6.0 for loss in losses), losses   # a 4-step model of ~40 characters: near ln(40)


def test_a_variable_the_grader_could_not_observe_is_absent_not_the_notebooks(assignment):
    """A train_and_compare that raises in the observed run: TRAINING_RESULTS is not observed, and
    the grounding shows it absent rather than the notebook's figures; the other exercises still
    have their observed figures."""
    broken = {"train_and_compare": "def train_and_compare(config, budget, seed=0):\n"
                                   "    raise RuntimeError('not today')\n"}
    probe = grading_run_probe(assignment, broken)
    assert "not today" in probe.cases[GRADING_RUN_CASE].info["errors"]["training"]
    context = _context(assignment, probe, {"TRAINING_RESULTS": {"all_full": {"val_loss": MADE_UP_LOSS}}})
    grounded = grounding_answers(checks_for(assignment.rubric), context)
    assert grounded["TRAINING_RESULTS"] is None
    assert grounded["RECALL_RESULTS"] is not None and grounded["DECAY_RESULTS"]["state_norms_after_tokens"]
    assert grounded["DECAY_RESULTS"]["learned_decays"] is None   # they are the Exercise 2 models'


def _context(assignment, probe: ProbeResult, answers: dict) -> CheckContext:
    return CheckContext(assignment.rubric, assignment.master_path, probe, None, None, "not executed in this test",
                        answers)


PROBE_SEES_GRADING_MODE = '''
import os
if os.environ.get("G2C_GRADING") != "1":
    raise RuntimeError("the probe is not in grading mode: " + repr(os.environ.get("G2C_GRADING")))
'''


def test_the_probe_runs_in_the_notebooks_grading_mode(sandbox, tmp_path):
    """Student code cannot tell the probe from the notebook's run by G2C_GRADING: in the real
    sandbox, a module that refuses to import outside grading mode imports."""
    result = run_probe(PROBE_SEES_GRADING_MODE, [], sandbox, tmp_path, 30.0)
    assert result.import_status == "ok", result.import_error


# What student code can read of its process's seccomp filter, and whether it can run a program.
READ_FILTER = """
import subprocess
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
try:
    subprocess.run(["/bin/true"])
    ran = "ran"
except PermissionError:
    ran = "denied"
FILTER = "|".join([status["NoNewPrivs"], status["Seccomp"], status.get("Seccomp_filters", "?"), ran])
"""


def test_the_notebooks_kernel_and_the_probe_share_one_seccomp_filter(sandbox, tmp_path, assignment):
    """Student code cannot tell the probe from the notebook's run by the probe's seccomp filter:
    in the real sandbox, the kernel reads the same filter lines in /proc/self/status as a probe
    worker and is denied exec as the worker is. IPython's ways of running a program print the
    grader's note instead of failing, and the cells after them run."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "notebook").mkdir()
    probe = run_probe(READ_FILTER + "raise RuntimeError('FILTER=' + FILTER)\n", [], sandbox, tmp_path / "probe", 30.0)
    seen_by_probe = re.search(r"FILTER=(\S+)", probe.import_error or "")
    assert seen_by_probe, probe.import_error
    assert seen_by_probe.group(1) == "1|2|1|denied"   # no new privileges, a filter, exec denied
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        READ_FILTER + "print('FILTER=' + FILTER)", "!echo shell", "listing = !ls\nprint('listing', listing)",
        "%pip install numpy", "%%bash\necho bash", "print('after')")]
    result = execute_notebook(notebook, sandbox, tmp_path / "notebook", assignment.rubric.limits, ())
    assert [run.status for run in result.cells] == ["ok"] * 6, result.problems()
    outputs = ["".join(output.get("text", "") for output in cell.outputs)
               for cell in nbformat.reads(result.executed_notebook.decode(), as_version=4).cells]
    assert f"FILTER={seen_by_probe.group(1)}" in outputs[0], outputs[0]
    for index, what in ((1, "the command 'echo shell'"), (2, "the command 'ls'"), (3, "pip install numpy"),
                        (4, "this %%script cell (bash)")):
        assert "the grader runs no other programs" in outputs[index] and what in outputs[index], outputs[index]
    assert "listing []" in outputs[2] and "shell" not in outputs[1].splitlines()   # echo never ran
    assert outputs[5] == "after\n"


@pytest.mark.parametrize("how", sorted(EXTRA_STEPS))
def test_figures_of_a_training_the_grader_did_not_see_whole_are_not_shown(assignment, how):
    """The grading run, where the training runs as in the notebook (torch's optimizers, its
    globals, grading mode): a loop with gradient steps no observed forward accounts for gives no
    TRAINING_RESULTS to ground the answers on; the same loop without them does."""
    honest = grading_run_probe(assignment, {"train_and_compare": (TRAININGS / "correct_own_loop.py").read_text()})
    extra = grading_run_probe(assignment, {"train_and_compare": _with_extra_step(EXTRA_STEPS[how])})
    assert observed_answers(_context(assignment, honest, {}))["TRAINING_RESULTS"] is not None
    assert observed_answers(_context(assignment, extra, {}))["TRAINING_RESULTS"] is None


# ----------------------------------------------------------------------------- items judged on the grading run

# Training that cheats only where torch's own optimizer runs (as in the notebook), and trains as
# asked beside the stand-ins of the item's own case: the extra step only when AdamW is torch's
# class, looked at past its name (a stand-in named AdamW is no torch Optimizer).
ONLY_WITH_TORCHS_OPTIMIZER = ("if issubclass(torch.optim.AdamW, torch.optim.Optimizer) "
                              "and torch.optim.AdamW.__module__ == 'torch.optim.adamw':\n")
RECALL_EXTRA_STEP = '''
        held = recall_batch(budget["batch_size"], torch.Generator().manual_seed(seed + 1))[0]
        hidden = model.token_embedding[held] + model.position_embedding[:held.shape[1]]
        for block in model.blocks:
            hidden = block(hidden)
        (model.ln_final(hidden) @ model.token_embedding.T).logsumexp(-1).mean().backward()
        optimizer.step()'''


def _only_when_real(extra: str, indent: str) -> str:
    body = "\n".join("    " + line if line.strip() else line for line in extra.strip("\n").splitlines())
    return indent + ONLY_WITH_TORCHS_OPTIMIZER + body


def _exercise_and_grading_run(assignment, symbol: str, cell: str, case: str) -> ProbeResult:
    return scaffold_probe(assignment, {symbol: cell}, (case, GRADING_RUN_CASE))


def test_training_that_cheats_only_beside_torchs_optimizers_loses_its_item(assignment):
    """Exercises 2 and 3 with an extra gradient step taken only when torch's own AdamW runs (the
    notebook's run, and the grader's run of the notebook's cells), never beside the item's own
    case's stand-ins: the item's own case passes, and the grading run fails the item, naming it."""
    # its own generator, so that the training batches stay the seed's: only the extra step differs
    extra = EXTRA_STEPS["a step on the held-out split through the model's blocks"].replace(
        "batches)", "torch.Generator().manual_seed(seed + 1))")
    ex2 = _with_extra_step(_only_when_real(extra, "            "))
    ex3_cell = (Path(__file__).parent / "recalls" / "correct_masked_loss.py").read_text()
    anchor = "        optimizer.step()\n    return model\n"
    assert ex3_cell.count(anchor) == 1
    ex3 = ex3_cell.replace(anchor, "        optimizer.step()\n" + _only_when_real(RECALL_EXTRA_STEP, "        ")
                           + "\n    return model\n")
    for symbol, cell, case, item in (("train_and_compare", ex2, "training", "training_same_batches"),
                                     ("train_recall", ex3, "recall_training", "recall_batches")):
        probe = _exercise_and_grading_run(assignment, symbol, cell, case)
        alone = ProbeResult(probe.import_status, probe.import_error,
                            {k: v for k, v in probe.cases.items() if k != GRADING_RUN_CASE})
        assert exercise_verdicts(assignment, alone, (item,))[item].status == "passed"   # the cheat hides there
        verdict = exercise_verdicts(assignment, probe, (item,))[item]
        print(f"\n{symbol}: {item} {verdict.status}: {verdict.message[:160]}")
        assert verdict.status == "failed", verdict.message
        assert "in the grader's run of the notebook's" in verdict.message
        assert "a loss was backpropagated without a forward pass the grader sees" in verdict.message


def test_a_loss_that_scores_every_position_only_beside_torchs_optimizer_loses_its_item(assignment):
    """Exercise 3 scoring the queries alone beside the item's own case's stand-ins, and next-token
    prediction over every position where torch's own AdamW trains (the notebook's run, and the
    grader's run of its cell): recall_query_loss passes on its own case and fails through the
    grading run, naming the positions."""
    cell = (Path(__file__).parent / "recalls" / "correct_masked_loss.py").read_text()
    anchor = "        targets[:, 2 * RECALL_NUM_PAIRS:] = answers\n"
    assert cell.count(anchor) == 1
    cheat = cell.replace(anchor, anchor + _only_when_real("        targets[:, :-1] = tokens[:, 1:]", "        ") + "\n")
    probe = _exercise_and_grading_run(assignment, "train_recall", cheat, "recall_training")
    alone = ProbeResult(probe.import_status, probe.import_error,
                        {k: v for k, v in probe.cases.items() if k != GRADING_RUN_CASE})
    item = "recall_query_loss"
    assert exercise_verdicts(assignment, alone, (item,))[item].status == "passed"   # the cheat hides there
    verdict = exercise_verdicts(assignment, probe, (item,))[item]
    print(f"\n{item} {verdict.status}: {verdict.message[:200]}")
    assert verdict.status == "failed" and "in the grader's run of the notebook's Exercise 3 cell" in verdict.message
    assert "which are not queries" in verdict.message, verdict.message


def test_the_correct_trainings_keep_their_items_in_the_grading_run_too(assignment):
    """The correct corpora, judged with the grading run beside their own case: no item lost."""
    corpora = [("train_and_compare", p, "training", "training_same_batches")
               for p in sorted(TRAININGS.glob("correct_*.py"))]
    corpora += [("train_recall", p, "recall_training", item)
                for p in sorted((Path(__file__).parent / "recalls").glob("correct_*.py"))
                for item in ("recall_batches", "recall_query_loss")]
    graded = {f"{p.stem}: {item}": exercise_verdicts(
        assignment, _exercise_and_grading_run(assignment, symbol, p.read_text(), case), (item,))[item]
        for symbol, p, case, item in corpora}
    passed = [name for name, verdict in graded.items() if verdict.status == "passed"]
    print(f"\ncorrect training cells keeping their item beside the grading run: {len(passed)} of {len(graded)}")
    assert len(passed) == len(graded), {n: v.message for n, v in graded.items() if v.status != "passed"}


def test_the_grading_run_trains_in_the_real_sandbox(sandbox, tmp_path, assignment):
    """In the real probe (read-only, its audit hook on), the grading run trains Exercises 2 and 3
    as the notebook does and every figure is observed: torch's own optimizers cannot be built
    there until the driver has built them once before the workers fork (``_warm_optimizers``)."""
    found = {c.id: cells.source(c) for c in assignment.master.cells if cells.SCAFFOLD in cells.tags(c)}
    module, _ = submission_module_source(assignment.master, found)
    checks = checks_for(assignment.rubric)
    cases = [c for c in checks.probe_cases(assignment.rubric) if c.name == GRADING_RUN_CASE]
    probe = run_probe(module, cases, sandbox, tmp_path, assignment.rubric.limits.probe_case_timeout_s,
                      checks.PROBE_DRIVER)
    out = probe.cases[GRADING_RUN_CASE]
    assert out.status == "ok" and not out.info["errors"], (out.error, out.info.get("errors"))
    observed = observed_answers(_context(assignment, probe, {}))
    for name in ("TRAINING_RESULTS", "RECALL_RESULTS"):
        assert observed[name] is not None and set(observed[name]) == set(GRADING_RUN["patterns"]), name
    assert observed["DECAY_RESULTS"]["learned_decays"] is not None
    assert all(2.0 < entry["val_loss"] < 6.0 for entry in observed["TRAINING_RESULTS"].values())
