"""The command line of a run: bubblewrap's mount plan (an empty root with only Python and the
caller's paths bound in, the grader package masked), its namespaces, the trusted launcher that
sets the rlimits and drops to the sandbox uid, the environment, and ``unshare`` for the levels
without bubblewrap (see the package's docstring)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from grader.sandbox.limits import ONE_THREAD_ENV, Limits


_CPU_KILL_GRACE = 5  # seconds between SIGXCPU (soft CPU limit) and SIGKILL (hard limit)


def _bwrap_argv(limits: Limits, read_only_paths: Sequence[Path], scratch: Path, uid: int,
                argv: Sequence[str], read_only: bool = False) -> list[str]:
    """bwrap ... -- launcher ... argv, for ``scratch`` and sandbox ``uid`` (-1: keep ours)."""
    tmp_size = str(max(limits.memory_bytes // 4, 16 * 2**20))
    plan = _MountPlan()
    for path in sorted({*_python_paths(), *read_only_paths}, key=lambda p: len(p.parts)):
        plan.bind("--ro-bind", path)
    plan.mask(_package_dir())
    plan.bind("--ro-bind" if read_only else "--bind", scratch)
    frozen = ["--remount-ro", "/tmp", "--remount-ro", "/dev/shm"] if read_only else []
    return [
        shutil.which("bwrap") or "bwrap", *_namespace_flags(),
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
        *_system_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", tmp_size, "--tmpfs", "/tmp",
        "--perms", "1777", "--size", tmp_size, "--tmpfs", "/dev/shm",
        *plan.args, *frozen,
        "--chdir", str(scratch),
        "--", *_launcher_argv(limits, uid, argv),
    ]


def _namespace_flags() -> list[str]:
    """bwrap's namespace options for the user the grader runs as (see the docstring of grader.sandbox)."""
    if os.geteuid() == 0:
        # No user namespace: the launcher drops to a real unprivileged uid instead.
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try"]
    return ["--unshare-all"]


# Run as ``python -I -S -c _LAUNCHER UID LIMITS ARGV...``: the last trusted code before the
# command. Brings loopback up (a network namespace made by ``unshare`` starts with it down,
# and a Jupyter kernel needs it; bwrap's is up already), sets the rlimits, volunteers for the
# OOM killer, lowers its priority, drops to UID (if >= 0), execs.
_LAUNCHER = """\
import fcntl, os, resource, socket, struct, sys
uid, limits, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
except OSError:
    pass
for item in limits.split(","):
    name, values = item.split("=")
    soft, hard = map(int, values.split(":"))
    resource.setrlimit(getattr(resource, name), (soft, hard))
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
os.nice(10)
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
os.execvp(argv[0], argv)
"""


def _launcher_argv(limits: Limits, uid: int, argv: Sequence[str]) -> list[str]:
    rlimits = {
        "RLIMIT_AS": (limits.memory_bytes, limits.memory_bytes),
        "RLIMIT_CPU": (limits.cpu_seconds, limits.cpu_seconds + _CPU_KILL_GRACE),
        "RLIMIT_NPROC": (limits.max_processes, limits.max_processes),
        "RLIMIT_FSIZE": (limits.file_size_bytes, limits.file_size_bytes),
        "RLIMIT_CORE": (0, 0),
    }
    spec = ",".join(f"{name}={soft}:{hard}" for name, (soft, hard) in rlimits.items())
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(uid), spec, *argv]


def _environment(scratch: Path, tmp: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The command's whole environment: sandbox defaults, then the caller's ``env``."""
    defaults = {
        "PATH": f"{Path(sys.prefix).resolve()}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "LANG": "C.UTF-8",
        "USER": "sandbox",  # no passwd entry is needed: getpass.getuser() reads these
        "LOGNAME": "sandbox",
        "TMPDIR": tmp,
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": f"{tmp}/matplotlib",
        "XDG_CACHE_HOME": f"{tmp}/cache",
        "IPYTHONDIR": f"{tmp}/ipython",
        "JUPYTER_RUNTIME_DIR": f"{tmp}/jupyter-runtime",
        **ONE_THREAD_ENV,
    }
    return {**defaults, **(env or {})}


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
    """The strongest ``unshare`` wrapper that works here, for the levels without bwrap."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in (("--net", "--pid", "--fork", "--kill-child"), ("--net",)):
        try:
            ok = subprocess.run([unshare, *flags, "true"], stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return (unshare, *flags, "--")
    return ()


# --------------------------------------------------------------------------------------
# The filesystem the sandbox sees
# --------------------------------------------------------------------------------------

_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
              "nsswitch.conf", "alternatives")
_ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _system_binds() -> list[str]:
    """Read-only ``/usr``, the ``/bin``-style entries of ``/`` and a minimal ``/etc``."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_ENTRIES:
        host = Path("/") / name
        if host.is_symlink():  # merged /usr (Debian): /bin -> usr/bin
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in _ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python_paths() -> list[Path]:
    """The Python installation and the virtualenv the grader runs, outside ``/usr``."""
    paths = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(sys.executable).resolve().parent.parent]
    return [p for p in paths if not _is_within(p, Path("/usr"))]


def _package_dir() -> Path:
    """The grader package's folder: it holds the hidden checks and must never be visible."""
    return Path(__file__).resolve().parent.parent


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class _MountPlan:
    """bwrap arguments for binds at their host paths, with tidy parent directories.

    bwrap would create the missing parents of a bind as mode 0700 directories, which the
    unprivileged sandbox user could not traverse. They are created first as 0711
    (traversable, not listable), except where a parent comes from a bind already.
    """

    def __init__(self) -> None:
        self.args: list[str] = []
        self._binds: list[Path] = [Path("/usr")]
        self._made: set[Path] = set()

    def _in_bind(self, path: Path) -> bool:
        return any(_is_within(path, bound) for bound in self._binds)

    def bind(self, option: str, path: Path) -> None:
        if self._in_bind(path):
            if option == "--ro-bind":
                return  # visible already, read-only, through an enclosing bind
        else:
            for parent in reversed(path.parents):
                if parent != Path("/") and parent not in self._made and not self._in_bind(parent):
                    self.args += ["--perms", "0711", "--dir", str(parent)]
                    self._made.add(parent)
        self.args += [option, str(path), str(path)]
        self._binds.append(path)

    def mask(self, path: Path) -> None:
        """Hide ``path`` behind an empty, inaccessible tmpfs if a bind shows it."""
        if self._in_bind(path) and path.is_dir():
            self.args += ["--perms", "0000", "--tmpfs", str(path)]
