"""Reading what sandboxed code wrote, without trusting it.

Everything in a scratch directory belongs to the submission after a run: any file may be a
symlink to a host path, huge, or garbage. These readers refuse paths that resolve outside
the scratch root, never follow a final symlink, read only regular files up to a size limit,
and parse JSON and npy with pickle disabled. Given a ``sha256``, they also refuse a file
whose digest differs (what a trusted process inside the sandbox vouched for, see
``harness/run_notebook.py``): pass ``""`` for a file nobody vouched for, to refuse it. Bytes
that came through a pipe are parsed with the same care (``json_object``, ``float_array``).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np


def read_regular(path: Path, root: Path, max_bytes: int, truncate: bool = False) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None), or (None, why not): ``path`` must resolve inside ``root``, not be
    a link itself, and be a regular file of at most ``max_bytes`` (``truncate``: its first
    ``max_bytes`` bytes instead). Never blocks (a FIFO is refused, not opened for reading) and
    never reads more than ``max_bytes`` + 1 bytes, whatever stat said."""
    try:
        if os.path.islink(path):
            return None, "a symbolic link (submit the file itself)"
        if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root)):
            return None, "outside its folder (through a linked folder)"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > max_bytes and not truncate:
            return None, "too large"
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + (0 if truncate else 1))
        if len(data) > max_bytes:
            return None, "too large"
        return data, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    finally:
        os.close(fd)


def read_bytes(path: Path, root: Path, max_bytes: int, sha256: str | None = None) -> bytes | None:
    """The file's bytes, or None when it is absent, not a regular file, outside root, too big,
    or (``sha256`` given) not the file whose digest that is (see ``read_regular``)."""
    data, _ = read_regular(path, root, max_bytes)
    if data is None or (sha256 is not None and hashlib.sha256(data).hexdigest() != sha256):
        return None
    return data


def json_object(data: bytes) -> dict[str, Any] | None:
    """A JSON object parsed from untrusted bytes, or None when it is not one."""
    try:
        value = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def float_array(data: bytes) -> np.ndarray | None:
    """A floating-point array parsed from untrusted npy bytes (pickle disabled), or None."""
    try:
        value = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None
    return value if isinstance(value, np.ndarray) and value.dtype.kind == "f" else None


def read_json(path: Path, root: Path, max_bytes: int, sha256: str | None = None) -> dict[str, Any] | None:
    """A JSON object, or None when unreadable (see read_bytes) or not a JSON object."""
    data = read_bytes(path, root, max_bytes, sha256)
    return None if data is None else json_object(data)


VOUCHER_LINE = re.compile(r"G2C-FILE ([0-9a-f]{64}) (\S+)")


def vouched_files(stdout: str) -> dict[str, str]:
    """File name -> SHA-256 from the ``G2C-FILE <sha256> <name>`` lines that a trusted process
    inside the sandbox printed on its own stdout (the last line for a name wins)."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        match = VOUCHER_LINE.fullmatch(line.strip())
        if match:
            found[match.group(2)] = match.group(1)
    return found


MAX_STAGES = 10_000          # timed stages a run may record (one per code cell, and a few)
MAX_STAGE_NAME = 200
MAX_STAGE_SECONDS = 86_400.0


def stages(value: Any, strict: bool) -> list[tuple[str, float]] | None:
    """Timed stages read back as ``(name, seconds)`` pairs from a list of ``[name, seconds]``
    (names capped, seconds as :func:`seconds` reads them, at most ``MAX_STAGES``). ``strict``:
    None when the list or any entry is not well formed (a kept run is then not trusted);
    otherwise what is not well formed is left out (results.json only shows them)."""
    if not isinstance(value, list) or len(value) > MAX_STAGES:
        return None if strict else []
    found = []
    for entry in value:
        duration = seconds(entry[1], MAX_STAGE_SECONDS) if isinstance(entry, list) and len(entry) == 2 else None
        if duration is None or not isinstance(entry[0], str) or len(entry[0]) > MAX_STAGE_NAME:
            if strict:
                return None
            continue
        found.append((entry[0], duration))
    return found


def seconds(value: Any, limit: float) -> float | None:
    """A duration reported from inside a sandbox, as a number of seconds in ``[0, limit]``
    rounded to milliseconds, or None when it is not a finite number (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:   # an int past float's range
        return None
    return round(min(max(number, 0.0), float(limit)), 3) if math.isfinite(number) else None
