"""Run the master notebook at its real sizes and print the numbers its written answers discuss.

``make realrun`` (or ``.venv/bin/python solutions/linear_attention/realrun.py``) executes
``linear_attention.ipynb`` next to this file with nbclient, without ``G2C_GRADING``: every
exercise runs at the module's sizes, not the grader's small budget. It then reads the answer
variables the rubric declares from the kernel and prints them exercise by exercise. The reference
answers of the notebook's Question/Answer cells quote these numbers, so after changing an
exercise, rerun this and update the answers to what it prints.

This is the instructor's own solution, so it runs outside the sandbox. The kernel's torch uses
``--threads`` threads, by default one per core; on a machine busy with other jobs pass
``--threads 1``, since a second thread there mostly waits for a free core and slows the run
down. On an idle 2-core CPU it takes about 12 minutes (about 21 with one thread), most of it
Exercise 2's three language models. ``--executed PATH`` also keeps the executed notebook, with
the cells' own logs, tables and samples.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

from grader.assignment import Assignment

ASSIGNMENT = Assignment("linear_attention")
NORM_POSITIONS = (1, 8, 64, 128, 256, 512)   # token counts at which Exercise 4's norms are quoted


def run_notebook(path: Path, threads: int, executed: Path | None) -> dict[str, Any]:
    """Execute every code cell of ``path`` in order (stopping at the first error, with its
    traceback) and return the answer variables as plain JSON values."""
    notebook = nbformat.read(str(path), as_version=4)
    os.environ.pop("G2C_GRADING", None)   # the kernel inherits this environment
    os.environ.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    with tempfile.TemporaryDirectory(prefix="la-realrun-") as work:
        answers_path = Path(work) / "answers.json"
        client = NotebookClient(notebook, timeout=None, kernel_name="python3",
                                resources={"metadata": {"path": work}})
        code_cells = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
        started = time.monotonic()
        with client.setup_kernel():
            for n, index in enumerate(code_cells, 1):
                cell = notebook.cells[index]
                cell_started = time.monotonic()
                client.execute_cell(cell, index)
                print(f"[{n:>2}/{len(code_cells)}] {cell.id:<24} {time.monotonic() - cell_started:7.1f} s",
                      flush=True)
            # nbclient stores each executed cell back into the notebook, so the export cell must
            # be one of its cells while it runs; it is not kept in the executed notebook.
            notebook.cells.append(nbformat.v4.new_code_cell(_export_code(answers_path)))
            client.execute_cell(notebook.cells[-1], len(notebook.cells) - 1)
            notebook.cells.pop()
        print(f"notebook ran in {(time.monotonic() - started) / 60:.1f} min\n", flush=True)
        if executed is not None:
            nbformat.write(notebook, str(executed))
        return json.loads(answers_path.read_text(encoding="utf-8"))


def _export_code(path: Path) -> str:
    """Kernel code that writes the rubric's answer variables to ``path`` as JSON (tensors and
    numpy values through their ``tolist``/``item``, as the grader exports them)."""
    names = list(ASSIGNMENT.rubric.answer_variables)
    return ("import json as _json\n"
            "def _plain(value):\n"
            "    for attr in ('tolist', 'item'):\n"
            "        if hasattr(value, attr):\n"
            "            return getattr(value, attr)()\n"
            "    raise TypeError(f'cannot export {type(value).__name__}')\n"
            f"with open({str(path)!r}, 'w') as _file:\n"
            f"    _json.dump({{_n: globals().get(_n) for _n in {names!r}}}, _file, default=_plain)\n")


def report(answers: dict[str, Any]) -> None:
    """Print, per exercise, the numbers its written answer discusses."""
    bench = answers["DECODE_BENCHMARK"]
    print(f"Exercise 1: one decode step (D={bench['embedding_dim']}, H={bench['num_heads']}, "
          f"batch {bench['batch_size']}, {bench['device']})")
    print(f"{'T':>7} {'full ms':>9} {'linear ms':>10} {'KV cache':>12} {'(S, z)':>10}")
    for i, T in enumerate(bench["history_lengths"]):
        print(f"{T:>7} {bench['full_ms_per_step'][i]:>9.4f} {bench['linear_ms_per_step'][i]:>10.4f} "
              f"{bench['kv_cache_bytes'][i] / 1024:>8.0f} KiB {bench['linear_state_bytes'][i] / 1024:>6.1f} KiB")

    print("\nExercise 2: StoryLM-1M, three layer patterns")
    for name, result in answers["TRAINING_RESULTS"].items():
        print(f"{name:<12} {result['parameters']:>9,} parameters  val loss {result['val_loss']:.4f}")
    for name, result in answers["TRAINING_RESULTS"].items():
        print(f"--- {name} sample ---\n{result['sample']}")

    recall = answers["RECALL_RESULTS"]
    print("\nExercise 3: recall accuracy by distance (pairs back)")
    print(f"{'distance':<12}" + "".join(f"{d:>6}" for d in recall["all_full"]["distance_buckets"]) + "   overall")
    for name, result in recall.items():
        print(f"{name:<12}" + "".join(f"{a:>6.3f}" for a in result["accuracy"])
              + f"   {result['overall_accuracy']:.4f}")

    decay = answers["DECAY_RESULTS"]
    print("\nExercise 4: ||S||_F after n tokens")
    print(f"{'gamma_logit':<12}" + "".join(f"{n:>10}" for n in NORM_POSITIONS))
    for label, norms in decay["state_norms"].items():
        print(f"{label:<12}" + "".join(f"{norms[n - 1]:>10.1f}" for n in NORM_POSITIONS))
    print("learned per-head decays (one row per linear layer, bottom to top)")
    for name, layers in decay["learned_decays"].items():
        if not layers:
            print(f"  {name:<12} no linear layers")
        for i, decays in enumerate(layers):
            print(f"  {name:<12} layer {i}: " + "  ".join(f"{g:.4f}" for g in decays))

    print("\nExercise 5: the memory bill at one million tokens")
    for key, value in answers["MEMORY_BILL"].items():
        if key != "grows_with_T":
            print(f"{key:<26} {value:>16,} bytes")
    print("grows with T:", ", ".join(answers["MEMORY_BILL"]["grows_with_T"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads in the kernel (default: one per core)")
    parser.add_argument("--executed", type=Path, help="also write the executed notebook here")
    args = parser.parse_args(argv)
    report(run_notebook(ASSIGNMENT.master_path, args.threads, args.executed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
