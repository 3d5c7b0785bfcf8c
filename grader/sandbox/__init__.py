"""Run one command for an untrusted submission, isolated and bounded.

Everything the grader executes on behalf of a student (the notebook kernel, the probe
harness) goes through :class:`Sandbox`. The trust model (DESIGN.md) says the student's code
may try to read the hidden checks, reach the network, fork without bound, eat memory or
disk, flood output or hang; the sandbox makes each of those fail or stop, and says what it
stopped in :attr:`SandboxResult.stopped`.

The package, one concern a module, each importing only those listed before it:

* ``limits``: what a run may use and what it reports (:class:`Limits`, :class:`MemoryShare`,
  :class:`SandboxResult`);
* ``mounts``: the command line of a run: bubblewrap's mount plan and namespaces, the trusted
  launcher (rlimits, nice, the uid switch), the environment, ``unshare``;
* ``watch``: the processes of a run, found, measured (memory, tmpfs, address space, disk) and
  killed, and its exit awaited without reaping it;
* ``uids``: the sandbox uids' leases, scratch handed over and back, leftovers and orphans;
* ``levels``: which isolation level works here (:func:`check_bubblewrap`,
  :func:`check_unprivileged_user`);
* ``guard``: the :class:`Guard` process that stops what a grader that died left;
* ``readers``: the capped readers of a run's output;
* ``run``: :class:`Sandbox`: a run at the chosen level, its watchdog, and how it ended;
* ``factory``: the sandbox of a command (``make_sandbox``) from the rubric's limits, and the
  assignment's files it hides (``hidden_paths``); not imported here (it reads the rubric and
  the checks' folder).

Everything other modules use is imported from this package: ``from grader.sandbox import X``.

Isolation levels
----------------
:attr:`Sandbox.isolation` names how commands are isolated, strongest first. It is chosen
once, when the ``Sandbox`` is made (``isolation="auto"``: bubblewrap if it works here, else
unprivileged-user if it is safe here, else ``"none"`` if the caller allows it), and the
results of a submission record it:

* ``"bubblewrap"``: namespaces and an empty filesystem with only Python bound in (below).
* ``"unprivileged-user"``: for containers where bubblewrap cannot create namespaces (the
  Gradescope image): the grader runs as root, the command as a dedicated unprivileged uid,
  and the hidden material is hidden by its file permissions only (see below).
* ``"none"``: rlimits only, for trusted code (the unsandboxed fallback, below).

How a command is isolated (bubblewrap, ``bwrap``)
-------------------------------------------------
* **Namespaces**: new mount, PID, network, IPC, UTS and (when possible) cgroup namespaces.
  The network namespace has only its own loopback: nothing outside can be reached, while a
  Jupyter kernel and its client that *both* run inside still talk over 127.0.0.1. In the
  PID namespace the command sees only its own processes; bubblewrap's reaper is PID 1
  there, and when it dies the kernel kills every process of the namespace.
* **Filesystem**: an empty root with read-only binds of only what running Python needs:
  ``/usr`` (with the ``/bin``, ``/lib``... symlinks or directories), a few files of ``/etc``
  (dynamic-loader cache, time zone, nsswitch), the Python installation
  (``sys.base_prefix``), the virtualenv (``sys.prefix``) and the caller's
  ``read_only_paths``. Nothing else of the host is visible: not the repository (the venv
  may live inside it; only that folder is bound), not the hidden checks, not
  ``/work/shared``, not other submissions, not the host's ``/tmp``. If the ``grader``
  package itself lies inside a bound folder (a non-editable install in the venv), its
  folder is masked by an empty, inaccessible tmpfs. The directories made to hold the binds
  (``/root``, ``/work``...) are mode 0711: traversable, not listable. ``/proc`` and
  ``/dev`` are fresh; ``/tmp`` and ``/dev/shm`` are private tmpfs of a quarter of the
  memory limit each.
* **Scratch**: the caller's ``scratch`` directory is bound read-write *at its own host
  path* and the command starts there (cwd and ``HOME``), so argv can name files in scratch
  by their host paths. Everything in scratch is handed to the sandbox user before each run
  (ownership changed, symlinks not followed), and back to the grader before that uid is
  free again: whatever is found there afterwards was possibly written by the student, and
  the trusted side must read it as such.
* **An unprivileged user**: ``RLIMIT_NPROC`` is not enforced for root, nor for a user
  namespace's user mapped onto host root (the kernel exempts kuid 0), and bwrap run by root
  keeps every capability in the sandbox. So when the grader runs as root, bwrap gets *no*
  user namespace and a tiny trusted launcher drops to a dedicated uid/gid
  (``SANDBOX_UID_BASE + slot``), one per concurrent run, reserved with a lock file. That
  uid owns no file outside scratch and has no capabilities (bwrap also sets no-new-privs);
  the kernel counts its processes, so a fork bomb stops at ``max_processes`` and
  ``kill(-1)`` reaches only the submission's own processes. When the grader is not root,
  bwrap makes a user namespace instead and the limit counts the processes inside it.
* **Resource limits** (set by the launcher, inherited by all descendants): ``RLIMIT_AS`` =
  ``memory_bytes`` per process (a single-process memory bomb gets a ``MemoryError``;
  ``import torch`` and a matmul need under 1 GiB of address space), ``RLIMIT_CPU`` (SIGXCPU
  at the limit, SIGKILL 5 s later), ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_CORE`` = 0,
  and an OOM score of 1000 so that the kernel's OOM killer picks the sandbox before the
  grader. The memory of the *whole* sandbox is watched too: every 0.25 s the watchdog adds
  up the proportional set sizes of its processes and what its private ``/tmp`` and
  ``/dev/shm`` hold (RAM too), and kills them all above ``memory_bytes`` (many processes
  each under the per-process limit). A process that runs into ``RLIMIT_AS`` is not killed: its
  allocation fails (``MemoryError``) and it may go on, print nothing, or catch the error. The
  watchdog therefore also keeps the highest address space (``VmPeak``) a process of the run
  reached, read at every check and once more before the run's processes are killed; a peak
  within ``run._address_space_slack`` of ``memory_bytes`` says "memory limit reached", with
  or without a ``MemoryError`` on stderr. Runs of one submission that run at the same time (its
  notebook and its probe) share that limit through a :class:`MemoryShare`: their sum is
  held to it, and the run holding the most is stopped. Each has its own uid and scratch:
  neither can signal the other's processes or change (under bubblewrap: see) its files.
  Once a second it also walks scratch, the only host disk the command can write: above
  ``disk_bytes`` or ``max_files`` in total, everything is killed (``RLIMIT_FSIZE`` alone
  bounds one file, not how many). cgroups are not used: they are not reliably delegated to
  the grader, so instead of CPU shares the command runs at nice 10, which keeps the grader
  itself responsive on a busy machine.
* **Watchdog**: after the wall-clock timeout, or once the run's processes together have used
  ``cpu_limit`` CPU seconds (when the caller sets one: the wall-clock timeout is then only its
  backstop, for a command that sleeps or hangs), the whole tree is killed (bwrap, whose
  ``--die-with-parent`` takes the PID namespace down, its session, and every process of the
  sandbox uid) and the result has ``timed_out=True``, ``returncode=None``. With an
  ``idle_limit``, a run whose processes make no CPU progress while they could run (asleep,
  blocked, stopped: ``cpu_time.IdleWatch`` reads their threads' states, so a run starved by a
  busy machine is not idle) is killed as hung after that long (``hung=True``). The CPU is read
  every 0.25 s from /proc (``grader.harness.cpu_time``): each process's own and what it
  reaped, so processes that exited in between count too; at the levels without a PID
  namespace, a process whose parent exits is reparented out of the run and, once it exits,
  its CPU is no longer counted (``RLIMIT_CPU`` still bounds each process). Nothing of a run
  outlives it, timed out or not, nor when the watch is cut short (an exception in the
  grader's thread, such as its worker told to stop). Nothing outlives the grader either:
  bwrap dies with the thread that started it (``--die-with-parent``), and a :class:`Guard`
  kills what a grader that died left of the unprivileged level, where no PID namespace
  may hold the run's processes. stdout and stderr are read concurrently; beyond
  ``output_bytes`` each, output is read and discarded, so the child never blocks on a full
  pipe and the grader's memory stays bounded.

The unprivileged-user level (no namespaces)
-------------------------------------------
Docker containers usually may not create namespaces, so bubblewrap fails there. When the
grader runs as root, the same trusted launcher then drops to a sandbox uid of its own
(``SANDBOX_UID_BASE + slot``, leased as above) with the same rlimits, nice level, watchdog
(per-uid memory, scratch disk, wall clock) and output caps, and new network and PID
namespaces only if ``unshare`` can still make them. Scratch is handed to that uid (or, for
``read_only``, made readable but not writable by it), HOME and TMPDIR point into it. After
the run, once every process of the uid is killed, scratch is given back to the grader and
everything the uid left in the shared temporary folders (``/tmp``, ``/var/tmp``,
``/dev/shm``, ``/run/lock``) is deleted: the next run on that uid, another student's,
finds nothing of this one. The kernel keeps the command from the grader's files only
through their permissions: before choosing this level, :func:`check_unprivileged_user`
runs a process as a sandbox uid that must start Python, import what the harness needs,
and fail to open every file and list every folder under ``protected_paths`` (always
including this package, the hidden checks); otherwise the level is refused. The Gradescope bundle's ``lock_down.sh``
sets those permissions (root-only bundle and installed ``grader`` package, world-readable
virtualenv).

What it does NOT protect: the host filesystem is visible (world-readable files, such as
``/etc/passwd`` or other software, can be read); world-writable folders can be written
during the run (so ``read_only`` cannot keep the probe's workers from leaving each other
files there, as bubblewrap's read-only ``/tmp`` does); memory held in ``/dev/shm`` is not
counted. Without ``unshare``: the network and the host's loopback services are reachable,
``/proc`` shows the host's processes (not their memory or environment), and the probe's
supervisor can kill only a worker's process group (see :attr:`Sandbox.own_pid_namespace`),
so a worker process that leaves its group lives on until the run ends. Hidden material
stays hidden only as long as nothing makes it readable to all again.

The unsandboxed fallback
------------------------
Where neither level works (bubblewrap unusable, and not root or the permissions not locked
down) and the caller explicitly allows it, the command runs as a plain subprocess with the
same limits, watchdog and output caps, in a new session, in new network and PID namespaces
when ``unshare`` (util-linux) can make them, as the grader's own user. It hides nothing of
the host, and the process limit does not bind root, so results say ``sandboxed=False``: it
is for trusted code and for machines where nothing else is possible, not for grading real
submissions.
"""
from __future__ import annotations

from grader.sandbox.guard import GUARD_GRACE, Guard
from grader.sandbox.levels import ISOLATION_LEVELS, SandboxUnavailable, check_bubblewrap, check_unprivileged_user
from grader.sandbox.limits import ONE_THREAD_ENV, Limits, MemoryShare, SandboxResult
from grader.sandbox.run import Sandbox
from grader.sandbox.uids import SANDBOX_UID_BASE, SANDBOX_UID_SLOTS, _UidLease, kill_orphans

__all__ = [
    "Limits",
    "MemoryShare",
    "SandboxResult",
    "SandboxUnavailable",
    "Sandbox",
    "check_bubblewrap",
    "check_unprivileged_user",
    "kill_orphans",
    "Guard",
    "GUARD_GRACE",
    "ISOLATION_LEVELS",
    "ONE_THREAD_ENV",
    "SANDBOX_UID_BASE",
    "SANDBOX_UID_SLOTS",
    "_UidLease",
]
