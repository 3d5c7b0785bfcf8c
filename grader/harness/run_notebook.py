"""Notebook driver: execute a notebook cell by cell with nbclient, inside the sandbox.

Usage (inside the sandbox): python run_notebook.py PLAN_JSON
Both the client and the kernel run here, so the kernel's loopback sockets never leave the
sandbox's network namespace. The kernel starts through ``kernel_launcher.py``, under the probe's
seccomp filter. Results are written after every cell, so a kill by the outer
watchdog still leaves what was done.

A cell's limit is in CPU seconds, summed over the kernel and everything it started
(``cpu_time.ChildrenMeter``; this driver is their subreaper, so orphans are counted too): past
it the kernel is interrupted, and killed if it keeps using CPU. nbclient's own per-cell
timeout is the wall-clock backstop. A cell whose processes make no CPU progress while they could
run (``cpu_time.IdleWatch``: sleeping, or waiting on something that never comes) for
``idle_timeout`` seconds is interrupted as hung long before that. A cell stopped any of these
ways is recorded as a timeout that says which limit it reached; a second timeout in a row, a
dead kernel, or ``idle_cells_give_up`` cells stopped as hung end execution. The answer export
runs student code too (a ``tolist`` of its own), under the same watch.

The kernel runs student code as the same user as this driver, so it can rewrite any file
here. The driver therefore vouches for what it writes on a channel the kernel cannot reach:
after each write it prints ``G2C-FILE <sha256> <name>`` on its own stdout, and ``G2C-DONE``
when it finishes. The kernel never gets that stdout (it inherits the sandbox's stderr as
its stdout), and the driver is not dumpable, so ``/proc/<pid>/fd`` and ptrace are closed to
the kernel. The trusted side reads only files whose digest was printed.

The report's ``timings`` say when the driver started (``started``, on the monotonic clock,
which the sandbox shares with the grader) and how long the kernel took to start
(``kernel_start``): where the time went, for TAs; they decide nothing.
"""
import ctypes
import hashlib
import json
import os
import signal
import sys
import threading
import time

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

import cpu_time  # copied next to this file

PLAN = json.loads(open(sys.argv[1]).read())
KERNEL_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_launcher.py")   # copied here
REPORT_FD = -1   # this driver's stdout, kept away from the kernel (see main)
TRUNCATED = "[output truncated by the grader: this cell printed more than {limit} KiB]\n"
CPU_POLL_S = 0.25       # seconds between two readings of a running cell's CPU
# CPU seconds an interrupted cell may still use before its kernel is killed: its own limit again,
# at most 10 (enough for a KeyboardInterrupt handler; a small limit ends a loop ignoring SIGINT sooner).
KILL_AFTER_CPU_S = min(10, PLAN["cell_timeout"])
# Seconds an interrupted cell may stay idle before its kernel is killed (a KeyboardInterrupt
# handler needs CPU; one that waits on instead ignores the interrupt).
KILL_AFTER_IDLE_S = min(10, PLAN["idle_timeout"])
CPU_STOP = f"the cell {cpu_time.cpu_limit_message(PLAN['cell_timeout'])} and was interrupted"
BACKSTOP_STOP = f"the cell was {cpu_time.backstop_message(PLAN['cell_backstop'])}"


class LimitedClient(NotebookClient):
    """NotebookClient that keeps at most PLAN['output_limit'] bytes of output per cell."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_bytes = {}
        self.truncated_cells = set()

    def output(self, outs, msg, display_id, cell_index):
        size = len(json.dumps(msg.get("content", {}), default=str))
        used = self.output_bytes.get(cell_index, 0) + size
        self.output_bytes[cell_index] = used
        if used > PLAN["output_limit"]:
            if cell_index not in self.truncated_cells:
                self.truncated_cells.add(cell_index)
                outs.append(nbformat.v4.new_output(
                    "stream", name="stderr", text=TRUNCATED.format(limit=PLAN["output_limit"] // 1024)))
            return None
        return super().output(outs, msg, display_id, cell_index)


class FilteredKernelManager(AsyncKernelManager):
    """Starts the kernel through ``kernel_launcher.py``: the probe's seccomp filter, then ipykernel."""

    def format_kernel_cmd(self, extra_arguments=None):
        return [sys.executable, KERNEL_LAUNCHER, "-f", os.path.realpath(self.connection_file), *(extra_arguments or [])]


class CellWatch(threading.Thread):
    """Watches one cell's processes: past its CPU limit, or idle for ``idle_timeout`` seconds
    (``AFTER_HUNG_S`` once an earlier cell was stopped so: ``hung_before``), the kernel is
    interrupted (``stop_reason`` says which), and killed if it goes on (it ignores the
    interrupt). Reaps the orphans this driver inherits, so that their CPU stays counted and
    they do not pile up as zombies."""

    def __init__(self, kernel, hung_before=False):
        super().__init__(daemon=True)
        self.kernel = kernel   # the kernel's provisioner: its pid and process group
        self.meter = cpu_time.ChildrenMeter()
        limit, first = cpu_time.idle_limits(PLAN["idle_timeout"], hung_before)
        self.idle = cpu_time.IdleWatch(limit, CPU_POLL_S)
        self.idle_stop = f"the cell was {cpu_time.idle_message(limit, first)}; it was interrupted"
        self.finished = threading.Event()
        self.stop_reason = None   # CPU_STOP or idle_stop once the cell is interrupted
        self.killed = False
        self.start()

    def run(self):
        used_at_stop = 0.0
        while not self.finished.wait(CPU_POLL_S):
            used, pids = self.meter.reading()
            reap_orphans(self.kernel.pid)
            hung = self.idle.hung(used, pids)
            if self.stop_reason is None and (used > PLAN["cell_timeout"] or hung):
                self.stop_reason, used_at_stop = (self.idle_stop if hung else CPU_STOP), used
                # A fresh window: the interrupted cell is killed if it stays idle this long.
                self.idle = cpu_time.IdleWatch(KILL_AFTER_IDLE_S, CPU_POLL_S)
                self.signal(signal.SIGINT)
            elif self.stop_reason is not None and (used > used_at_stop + KILL_AFTER_CPU_S or hung):
                self.killed = True
                self.signal(signal.SIGKILL)
                return

    def signal(self, number):
        """Its process group, as Jupyter interrupts a kernel, and the kernel itself if it left it."""
        for send, target in ((os.killpg, self.kernel.pgid), (os.kill, self.kernel.pid)):
            try:
                if target:
                    send(target, number)
            except OSError:
                pass

    def stop(self):
        """CPU seconds the cell used."""
        self.finished.set()
        self.join()
        return self.meter.used()


def reap_orphans(kernel_pid):
    """Reap the exited children of this driver other than the kernel (orphans it inherited)."""
    me = os.getpid()
    for process in cpu_time.processes():
        if process.ppid == me and process.zombie and process.pid != kernel_pid:
            try:
                os.waitpid(process.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def cell_error(cell):
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), str(output.get("evalue", ""))[:500]
    return None


class ExportStopped(Exception):
    """The answer export was stopped by its watch (its message says why)."""


def export_answers(client, index):
    """Dump the declared answer variables to JSON from inside the kernel."""
    code = (
        "import json as _g2c_json\n"
        "def _g2c_plain(value):\n"
        "    for attr in ('tolist', 'item'):\n"
        "        if hasattr(value, attr):\n"
        "            return getattr(value, attr)()\n"
        "    return None\n"
        f"with open({PLAN['answers']!r}, 'w') as _g2c_file:\n"
        f"    _g2c_file.write(_g2c_json.dumps({{_n: globals().get(_n) for _n in {PLAN['answer_variables']!r}}},"
        " default=_g2c_plain))\n"
    )
    # nbclient writes a cell's outputs back into the notebook by index, so the export cell must
    # be one of its cells while it runs (an output from it would otherwise raise IndexError).
    client.nb.cells.append(nbformat.v4.new_code_cell(code))
    watch = CellWatch(client.km.provisioner)
    try:
        client.execute_cell(client.nb.cells[-1], index, store_history=False)
    finally:
        watch.stop()
        client.nb.cells.pop()
    if watch.stop_reason:
        raise ExportStopped(watch.stop_reason)


def report(line):
    data = (line + "\n").encode()
    while data:
        data = data[os.write(REPORT_FD, data):]


def write_vouched(path, data):
    """Write ``path`` and print its digest: the trusted side accepts no other version of it."""
    with open(path, "wb") as handle:
        handle.write(data)
    report(f"G2C-FILE {hashlib.sha256(data).hexdigest()} {os.path.basename(path)}")


def guard_driver():
    """Keep the kernel away from this process: not dumpable, and stdout out of its reach.
    Become the subreaper of what the kernel starts, so that no process leaves the cell's CPU."""
    global REPORT_FD
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE = 0
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER = 1
    except (OSError, AttributeError):
        pass
    REPORT_FD = os.dup(1)  # not inheritable; the kernel is started with close_fds anyway
    os.dup2(2, 1)          # the kernel inherits this fd 1: the sandbox's stderr


def main():
    driver_started = time.monotonic()
    guard_driver()
    notebook = nbformat.read(PLAN["notebook"], as_version=4)
    client = LimitedClient(
        notebook, timeout=PLAN["cell_backstop"], kernel_name="python3", kernel_manager_class=FilteredKernelManager,
        allow_errors=True, interrupt_on_timeout=True, record_timing=False,
        # A kernel killed by its cell's watch is noticed within a second (nbclient checks it is
        # alive each time this interval passes without a reply; 5 s by default).
        shell_timeout_interval=1,
        # Without an error reply nbclient keeps interrupting a kernel that ignores SIGINT forever.
        error_on_timeout={"ename": "CellTimeoutError", "evalue": BACKSTOP_STOP},
        resources={"metadata": {"path": PLAN["workdir"]}})
    records = []
    state = {"kernel": "ok"}
    timings = {"started": driver_started}

    def save():
        write_vouched(PLAN["results"], json.dumps({"cells": records, "kernel": state["kernel"], "timings": timings,
                                                   "truncated_cells": sorted(client.truncated_cells)}).encode())

    save()
    try:
        kernel_starting = time.monotonic()
        with client.setup_kernel():
            timings["kernel_start"] = round(time.monotonic() - kernel_starting, 3)
            previous_timed_out, idle_cells = False, 0
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                record = {"index": index, "id": cell.get("id"), "status": "ok"}
                records.append(record)
                if state["kernel"] != "ok":
                    record["status"] = "not_run"
                    continue
                started = time.monotonic()
                watch = CellWatch(client.km.provisioner, idle_cells > 0)
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError:
                    state["kernel"] = "hung" if watch.killed else "died"
                    record.update(status="error", ename="DeadKernelError",
                                  evalue="the kernel died (out of memory, or the process exited)")
                except CellTimeoutError as exc:
                    state["kernel"] = "hung"
                    record.update(status="timeout", ename="CellTimeoutError", evalue=str(exc)[:300])
                except Exception as exc:  # student code controls the kernel's messages too
                    state["kernel"] = "broken"
                    record.update(status="error", ename=type(exc).__name__,
                                  evalue=f"the kernel broke the Jupyter protocol: {exc}"[:300])
                cpu_seconds = watch.stop()
                record["seconds"] = round(time.monotonic() - started, 3)
                error = cell_error(cell)
                if watch.stop_reason:
                    record.update(status="timeout", ename="CellTimeoutError", evalue=watch.stop_reason)
                elif record["status"] == "ok" and cpu_seconds > PLAN["cell_timeout"]:
                    record.update(status="timeout", ename="CellTimeoutError", evalue=CPU_STOP)
                elif record["status"] == "ok" and record["seconds"] >= PLAN["cell_backstop"]:
                    record.update(status="timeout", ename="CellTimeoutError", evalue=BACKSTOP_STOP)
                elif record["status"] == "ok" and error:
                    record.update(status="error", ename=error[0], evalue=error[1])
                idle_cells += watch.stop_reason == watch.idle_stop
                # The interrupt did not free the kernel, or its code keeps waiting.
                if record["status"] == "timeout" and previous_timed_out or idle_cells >= PLAN["idle_cells_give_up"]:
                    state["kernel"] = "hung"
                previous_timed_out = record["status"] == "timeout"
                save()
            if state["kernel"] == "ok":
                try:
                    export_answers(client, len(notebook.cells))
                except ExportStopped as exc:
                    state["kernel"] = f"answer export failed: {exc}"
                except Exception as exc:  # the kernel may die here too; answers are then missing
                    state["kernel"] = f"answer export failed: {type(exc).__name__}"
            save()
    except Exception as exc:  # the kernel failed to start, or broke the protocol at shutdown
        if state["kernel"] == "ok":
            state["kernel"] = f"failed: {type(exc).__name__}"
        save()
    write_vouched(PLAN["executed"], nbformat.writes(notebook).encode())
    report("G2C-DONE")


if __name__ == "__main__":
    main()
    os._exit(0)
