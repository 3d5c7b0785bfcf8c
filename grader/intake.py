"""The one way in: what a student hands in, found, named and read without trusting it.

Everything a submission is made of is the student's: the name of its file or folder, what
its folder holds (links, devices, FIFOs, directories named like notebooks, trees of any
depth), and the size of every file. ``grade``, ``check``, the Gradescope step and ``report``
take submissions only through here:

- **Discovery** (:func:`discover`, :func:`find_submission`) lists folders with ``lstat``,
  iteratively, with a bound on depth and on entries, and never follows a link below a path
  named on the command line (those may be links: the TA chose them). A link, a device, a FIFO
  or a directory where a notebook or a package file would be is refused with a reason for
  that submission only; it still gets a result.
- **Ids** (:func:`safe_id`) are derived once, here. An id is safe for paths, HTML, CSV and
  terminals, and never one of the names the grader writes at the top of the output folder.
  The name as submitted is kept as display text (``SubmissionPath.original``).
- **Reads** (:func:`read_file`) take regular files inside the submission's own folder only,
  and stop at a size limit decided before the read starts.

Nothing about one submission raises out of this module into a batch: every problem is a
reason on that submission.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grader.untrusted import read_regular

NOTEBOOK_SUFFIX = ".ipynb"
#: What an id may be unchanged: the alphabet of file names that are safe everywhere.
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Every file or folder the grader writes at the top of an output folder: a submission named
#: like one would overwrite it, or be overwritten (tests check this list against the grader).
RESERVED_IDS = frozenset({"gradebook.csv", "summary.html", "overrides.yaml", "overrides_applied.json",
                          "score_changes.json", "llm_usage.json", "llm_batch.json", "canvas_import.csv",
                          ".llm-cache", "release.json", "queue", "similarity.json", "similarity.html",
                          "published.json"})
_HASHED_STEM_CHARS = 54      # + "-" + 8 hex digits stays within SAFE_ID's 64
#: Folder walks stop here: deeper or larger submission folders are refused with the reason.
MAX_DEPTH = 16
MAX_ENTRIES = 5000
#: Names never looked at inside a submission (editor and OS litter).
_IGNORED = re.compile(r"^(\.|__MACOSX$|__pycache__$)")


def safe_id(name: str) -> str:
    """The submission id for a file or folder ``name`` (a notebook's without ``.ipynb``).

    A name that already matches ``SAFE_ID`` and is not one of ``RESERVED_IDS`` stays as it is,
    so resumed batches, overrides and rosters keep working. Any other name becomes its safe
    characters (the rest replaced by ``_``) plus ``-`` and 8 hex digits of the sha256 of the
    name: two different names never meet by accident."""
    if SAFE_ID.fullmatch(name) and name.casefold() not in RESERVED_IDS:
        return name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:_HASHED_STEM_CHARS] or "submission"
    if not stem[0].isalnum():
        stem = "s" + stem[: _HASHED_STEM_CHARS - 1]
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{stem}-{digest}"


def display_name(name: str) -> str:
    """A file name as text that every output can hold: bytes that are not UTF-8 (which Python
    keeps as lone surrogates) become U+FFFD. Escaping for HTML, CSV or a terminal is still the
    output's job."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class SubmissionPath:
    """One submission as discovered: where its notebook and package files are, or why it cannot
    be graded at all."""

    submission_id: str
    path: Path | None           # the notebook; None when there is none
    problem: str | None = None  # why the submission cannot be graded at all
    folder: Path | None = None  # a ``<id>/`` folder, which may hold package files; None for a lone notebook
    original: str = ""          # the name as submitted (display text), when the id differs from it
    notes: tuple[str, ...] = field(default=())   # what was left out of the folder, and why


# ----------------------------------------------------------------------------- folder walks

@dataclass
class Walk:
    """What a folder holds, found without following links: regular files and what was refused
    (relative paths), or why the walk was stopped."""

    files: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)   # relative path -> why it is not read
    problem: str | None = None


def walk(folder: Path, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Walk:
    """Every regular file under ``folder`` (``folder`` itself may be a link), depth first,
    iteratively. Links, devices, FIFOs and sockets are refused, never followed or opened;
    hidden entries and editor litter are skipped; past ``max_depth`` levels or ``max_entries``
    entries the walk stops with ``problem`` set."""
    found = Walk()
    seen = 0
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        relative, depth = stack.pop()
        try:
            with os.scandir(folder / relative if relative else folder) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            found.refused[relative or "."] = f"cannot be listed ({exc.strerror})"
            continue
        for entry in listed:
            if _IGNORED.match(entry.name):
                continue
            seen += 1
            if seen > max_entries:
                found.problem = f"the folder holds more than {max_entries} files and folders"
                return found
            path = f"{relative}/{entry.name}" if relative else entry.name
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                found.refused[path] = f"cannot be read ({exc.strerror})"
                continue
            if stat.S_ISDIR(mode) and entry.name.endswith(NOTEBOOK_SUFFIX):
                found.refused[path] = _kind(mode)
            elif stat.S_ISDIR(mode):
                if depth + 1 >= max_depth:
                    found.problem = f"the folder is nested more than {max_depth} levels deep"
                    return found
                stack.append((path, depth + 1))
            elif stat.S_ISREG(mode):
                found.files.append(path)
            else:
                found.refused[path] = _kind(mode)
    found.files.sort()
    return found


def _kind(mode: int) -> str:
    """Why an entry that is not a regular file is refused where a file belongs."""
    if stat.S_ISDIR(mode):
        return "a folder, not a notebook file"
    if stat.S_ISLNK(mode):
        return "a symbolic link (submit the file itself)"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return "not a regular file"


# ----------------------------------------------------------------------------- discovery

def discover(paths: Sequence[Path], package_files: Sequence[str] = ()) -> list[SubmissionPath]:
    """A notebook, or a folder of ``<id>.ipynb`` files and ``<id>/`` folders, each holding one
    notebook and/or ``package_files`` (the assignment's, relative to ``<id>/``).

    Raises FileNotFoundError only for a path named on the command line that does not exist;
    everything a submission holds becomes that submission's reason. Ids are unique: submissions
    whose ids collide are each given a reason naming the others."""
    found: list[SubmissionPath] = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such notebook or folder")
        if path.is_dir():   # a link the TA named is followed: it is the TA's choice
            found.extend(_folder_entries(path, package_files))
        else:
            found.append(_lone_notebook(path.name, path.resolve(), os.stat(path).st_mode))
    return _unique(found)


def _lone_notebook(name: str, path: Path, mode: int) -> SubmissionPath:
    stem = name.removesuffix(NOTEBOOK_SUFFIX) or name
    submission_id = safe_id(stem)
    original = display_name(name) if submission_id != stem else ""
    if not stat.S_ISREG(mode):
        return SubmissionPath(submission_id, None, f"{display_name(name)!r} is {_kind(mode)}", original=original)
    return SubmissionPath(submission_id, path, original=original)


def _folder_entries(folder: Path, package_files: Sequence[str]) -> list[SubmissionPath]:
    """The submissions at the top of ``folder``: every entry named like a notebook (whatever it
    is) and every folder; links to anything else, and other files, are not submissions."""
    found = []
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as exc:
        raise FileNotFoundError(f"{folder}: cannot be listed ({exc.strerror})") from exc
    for entry in entries:
        if _IGNORED.match(entry.name):
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue
        looks_like_notebook = entry.name.endswith(NOTEBOOK_SUFFIX)
        if stat.S_ISDIR(mode) and not looks_like_notebook:
            found.append(_submission_folder(entry.name, Path(entry.path), package_files))
        elif looks_like_notebook or stat.S_ISLNK(mode):
            if stat.S_ISLNK(mode) and not looks_like_notebook and not _is_dir(Path(entry.path)):
                continue   # a link to some other file is no submission
            found.append(_lone_notebook(entry.name, Path(entry.path), mode))
    return found


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _submission_folder(name: str, folder: Path, package_files: Sequence[str],
                       lone_notebook_folder: bool = True) -> SubmissionPath:
    """One ``<id>/`` folder: one notebook and/or the package files, anything else a reason.
    Without package files the notebook is graded with ``folder`` as its folder, or as a lone
    notebook when ``lone_notebook_folder`` is false (an upload's nesting means nothing)."""
    submission_id = safe_id(name)
    original = display_name(name) if submission_id != name else ""
    found = walk(folder)
    choice = found.problem or _choose(found, package_files)
    if isinstance(choice, str):
        return SubmissionPath(submission_id, None, choice, original=original)
    notebook, root, notes = choice
    path = folder / notebook if notebook else None
    if root is None and not lone_notebook_folder:
        return SubmissionPath(submission_id, path, original=original, notes=notes)
    return SubmissionPath(submission_id, path, folder=folder / root if root else folder,
                          original=original, notes=notes)


def _choose(found: Walk, package_files: Sequence[str]) -> tuple[str | None, str | None, tuple[str, ...]] | str:
    """(notebook, package root, notes) from a walk, relative to the walked folder (root None:
    no package file), or why the folder is not one submission. A refused entry where a notebook
    or a package file would be makes the folder ungradable; other refused entries are named."""
    package_parts = {part for name in package_files for part in name.split("/")}
    for path, why in found.refused.items():
        if (path.endswith(NOTEBOOK_SUFFIX) or path.rsplit("/", 1)[-1] in package_parts
                or any(path == p or path.endswith("/" + p) for p in package_files)):
            return f"{display_name(path)} is {why}"
    notebooks = [p for p in found.files if p.endswith(NOTEBOOK_SUFFIX)]
    # The folder a package file sits in as the course lays it out: where its path starts.
    roots = sorted({p[: -len(name)].rstrip("/") for name in package_files for p in found.files
                    if p == name or p.endswith("/" + name)})
    listed = display_name(", ".join(notebooks))
    if len(notebooks) > 1:
        return f"the folder holds {len(notebooks)} notebooks ({listed}); submit exactly one"
    if not notebooks and not roots:
        return "the folder holds no .ipynb notebook" + (f" and no {', '.join(package_files)}" if package_files else "")
    if len(roots) > 1:
        return f"submit one copy of the package files (found under {display_name(', '.join(r or '.' for r in roots))})"
    root = roots[0] if roots else None
    if notebooks and root and not notebooks[0].startswith(root + "/"):
        return f"put the notebook and the package folder side by side (found {listed} outside {display_name(root)})"
    notes = tuple(f"not read: {display_name(path)} is {why}" for path, why in found.refused.items())
    return (notebooks[0] if notebooks else None), root, notes


def find_submission(submission_id: str, folder: Path, package_files: Sequence[str]) -> SubmissionPath:
    """An upload (Gradescope's submission folder, unpacked zips included): one ``.ipynb``
    and/or the assignment's package files at any depth, side by side, as one submission with
    the id ``safe_id(submission_id)``. Anything else is a submission the batch scores 0 with
    the reason."""
    return _submission_folder(submission_id, folder, package_files, lone_notebook_folder=False)


def _unique(found: list[SubmissionPath]) -> list[SubmissionPath]:
    """Submissions whose ids collide keep their place, each under an id of its own (made from
    its position), with a reason naming the others: the batch goes on."""
    by_id: dict[str, list[int]] = {}
    for index, submission in enumerate(found):
        by_id.setdefault(submission.submission_id, []).append(index)
    unique = list(found)
    for submission_id, indices in by_id.items():
        if len(indices) < 2:
            continue
        names = ", ".join(repr(found[i].original or found[i].submission_id) for i in indices)
        for n, index in enumerate(indices, start=1):
            submission = found[index]
            unique[index] = SubmissionPath(
                safe_id(f"{submission_id}#{n}"), None,
                f"{len(indices)} submissions have the id {submission_id!r} ({names}); rename all but one "
                "and grade again", original=submission.original or submission.submission_id)
    return unique


# ----------------------------------------------------------------------------- reads

class Refused(ValueError):
    """A file of the submission that the grader does not read, with the reason (``too_large``:
    the reason is its size)."""

    def __init__(self, reason: str, too_large: bool = False):
        super().__init__(reason)
        self.too_large = too_large


def read_file(path: Path, root: Path, max_bytes: int, label: str) -> bytes:
    """The bytes of ``path``, a regular file inside ``root`` (no link on the way), read only up
    to ``max_bytes``; raises Refused with a reason that names ``label`` otherwise."""
    data, why = read_regular(path, root, max_bytes)
    if data is not None:
        return data
    if why == "too large":
        try:
            size = f"{os.lstat(path).st_size / 2**20:.1f} MiB, "
        except OSError:
            size = ""
        raise Refused(f"{label} is {size}over the {max_bytes / 2**20:.0f} MiB limit", too_large=True)
    raise Refused(f"{label} is {why}")


def submission_files(notebook: Path | None, folder: Path | None, declared: Iterable[str]) -> dict[str, Path]:
    """Everything graded, by its path relative to the submission folder (a lone notebook: its
    name): the notebook and each ``declared`` package file that the folder holds as a regular
    file."""
    files = {} if notebook is None else {relative_name(notebook, folder): notebook}
    if folder is not None:
        files.update({name: folder / name for name in declared
                      if read_regular(folder / name, folder, 0, truncate=True)[0] is not None})
    return files


def submission_sha256(files: dict[str, Path], root: Path | None, max_bytes: int) -> str:
    """The digest results, caches and overrides follow. One file (a plain notebook): its own
    sha256, the digest a notebook always had, so earlier results stay valid. Several: the sha256
    of their sorted ``relative path NUL sha256 LF`` lines, so changing, adding, removing or
    moving any one of them changes it. Each file is read only up to ``max_bytes`` + 1 bytes (a
    larger one is refused at load anyway); one that cannot be read hashes as its reason."""
    def digest(path: Path) -> str:
        data, why = read_regular(path, root or path.parent, max_bytes + 1, truncate=True)
        return hashlib.sha256(data if data is not None else f"refused: {why}".encode()).hexdigest()

    if len(files) == 1:
        return digest(next(iter(files.values())))
    lines = "".join(f"{name}\0{digest(files[name])}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def relative_name(path: Path, folder: Path | None) -> str:
    """How a submission's file is named in results: relative to its folder (a lone notebook: its
    name), as display text."""
    return display_name(path.relative_to(folder).as_posix() if folder is not None else path.name)
