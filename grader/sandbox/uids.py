"""Sandbox uids, for a grader running as root: one uid of a reserved range per run at once,
leased with a lock file (:class:`_UidLease`); scratch handed to the uid and back; what a uid
left in the shared temporary folders removed; and the orphans of free uids killed
(:func:`kill_orphans`)."""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

from grader.harness.cpu_time import processes
from grader.sandbox.watch import _kill_processes


#: First uid (and gid) of the range the sandbox runs as when the grader runs as root:
#: far above regular users (1000-59999) and the usual subordinate-uid ranges.
SANDBOX_UID_BASE = 1_900_000_000
#: How many sandboxes may run at the same time on one machine (one uid each).
SANDBOX_UID_SLOTS = 256


#: The lock files of the uid leases. The uids are the whole machine's, so every grader must use
#: the same folder whatever its TMPDIR; /run is root's, as the leases are.
_UID_LOCK_DIR = Path("/run/g2c-grader-sandbox-uids")


class _UidLease:
    """Reserve a uid of the sandbox range for one run (a lock file is held meanwhile)."""

    def __init__(self) -> None:
        lock_dir = _lock_dir()
        for slot in range(SANDBOX_UID_SLOTS):
            if self._take(lock_dir, slot):
                return
        raise RuntimeError(f"all {SANDBOX_UID_SLOTS} sandbox uids are in use")

    @classmethod
    def of_slot(cls, slot: int) -> _UidLease | None:
        """The lease of that one slot, or None while a run holds it."""
        lease = cls.__new__(cls)
        return lease if lease._take(_lock_dir(), slot) else None

    def _take(self, lock_dir: Path, slot: int) -> bool:
        fd = os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        self._fd = fd
        self.uid = SANDBOX_UID_BASE + slot
        _kill_processes(self.uid, None)  # leftovers of a grader that crashed
        return True

    def release(self) -> None:
        os.close(self._fd)


def _lock_dir() -> Path:
    lock_dir = _UID_LOCK_DIR
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    info = lock_dir.lstat()
    if lock_dir.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{lock_dir} is not a private directory of this user")
    return lock_dir


def kill_orphans() -> None:
    """SIGKILL every process of a sandbox uid that no run holds (its lease free): what a
    grader that died left, wherever it was reparented. A no-op unless root (no uids then)."""
    if os.geteuid() != 0:
        return
    for uid in sorted({p.uid for p in processes()
                       if SANDBOX_UID_BASE <= p.uid < SANDBOX_UID_BASE + SANDBOX_UID_SLOTS}):
        lease = _UidLease.of_slot(uid - SANDBOX_UID_BASE)   # kills them as it is taken
        if lease:
            lease.release()


def _give_to(scratch: Path, uid: int) -> None:
    """chown scratch and everything in it to ``uid``, never following a symlink."""
    os.chown(scratch, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(scratch, followlinks=False):
        for name in dirnames + filenames:
            try:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
            except FileNotFoundError:
                pass


def _lend_read_only(scratch: Path) -> None:
    """Make scratch readable, not writable, by any sandbox uid (unprivileged-user level):
    everything owned by the grader, folders 0755, files without write bits for others.
    Symlinks are left as they are (their mode means nothing; they are never followed)."""
    me = os.geteuid()
    os.chown(scratch, me, me)
    os.chmod(scratch, 0o755)
    for dirpath, dirnames, filenames in os.walk(scratch, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    continue
                os.chown(path, me, me, follow_symlinks=False)
                mode = 0o755 if stat.S_ISDIR(info.st_mode) else stat.S_IMODE(info.st_mode) & 0o755 | 0o444
                os.chmod(path, mode)
            except FileNotFoundError:
                pass


#: World-writable folders of a usual host: without a mount namespace the sandbox uid can
#: leave files there (and in world-writable folders inside them).
_SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _remove_leftovers(uid: int) -> None:
    """Delete what ``uid`` left in the shared temporary folders (unprivileged-user level, its
    scratch given back to the grader already). Only world-writable folders are searched: the
    uid can create nothing elsewhere but in its own folders, which go whole. Symlinks are
    removed, never followed."""
    pending = sorted({*_SHARED_TMP, tempfile.gettempdir()})
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid == uid and stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                elif info.st_uid == uid:
                    os.unlink(entry.path)
                elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                    pending.append(entry.path)
            except OSError:
                continue
