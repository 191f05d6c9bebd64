"""Writing an output folder atomically: build it in a hidden sibling, then swap it into place.

A save replaces an existing folder only if it is one this toolkit wrote and holds nothing but the files it
lists: a bundle's manifest lists them; other folders (a SavedModel) get a listing of their own (``LISTING``).
Anything else there is an error, raised before anything is written.

The swap is one atomic exchange of the two folders (Linux ``renameat2(RENAME_EXCHANGE)``), so the path never
stands empty; the retired copy, now at the sibling's name, is removed after. Where the exchange is not
available, two renames are made (the old folder to ``.NAME.xxxxxxxx.old``, then the new one into place); a
process killed between them leaves no folder at the path, and ``recover_interrupted_swap`` (run by the next
save and by ``load_artifact``) puts the surviving copy back.

The sibling (``.NAME.xxxxxxxx``) is locked while a save writes it (``flock`` on ``.NAME.xxxxxxxx.lock``, which
the kernel releases when the writing process ends, however it ends). A save that was killed leaves its
sibling behind; the next save to the same path removes every sibling whose lock is free, never one that a
live save in another process holds. Files and folders get the permissions the user's umask gives.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

UNLOCKED_GRACE_SECONDS = 600
"""A sibling with no lock file (a save between making its folder and its lock) is left alone this long."""
LISTING = ".torch-stablehlo-files.json"
"""The listing a staged folder without a manifest of its own gets: its kind and every file written there."""
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

WrittenFiles = Callable[[Path], "set[str] | None"]
"""A folder's files this toolkit wrote there (paths relative to it), or None if it is not such a folder."""


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike, kind: str, written_files: WrittenFiles | None = None):
    """Yield an empty staging folder; when the block succeeds it becomes ``path``.

    A failure (or an interrupt) removes the staging folder, so ``path`` is never half-written. An existing
    folder at ``path`` is replaced only if it is empty, or it is a ``kind`` folder this toolkit wrote holding
    nothing but the files ``written_files`` reads from it (default: the folder's ``LISTING``, which this
    function writes into every folder it stages without ``written_files``); anything else is an error, raised
    before anything is written.
    """
    path = Path(path)
    check_replaceable(path, kind, written_files or _listed_files(kind))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    with _locked(_lock_file(staging)):
        try:
            yield staging
            if written_files is None:
                (staging / LISTING).write_text(json.dumps({"kind": kind, "files": sorted(_files_under(staging))}))
            _apply_umask(staging)
            _swap_into_place(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def check_replaceable(path: Path, kind: str, written_files: WrittenFiles) -> None:
    """Raise FileExistsError unless ``path`` is free, an empty folder, or a ``kind`` folder holding only files this
    toolkit wrote there."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise FileExistsError(f"{path} exists and is not {kind} nor an empty folder (it is a "
                              f"{'link' if path.is_symlink() else 'file'}); choose a new path or remove it")
    if not any(path.iterdir()):
        return
    listed = written_files(path)
    if listed is None:
        raise FileExistsError(f"{path} exists and is not {kind} nor an empty folder (no listing of files this "
                              "toolkit wrote there); choose a new path or remove it")
    others = sorted(_files_under(path) - listed)
    if others:
        shown = ", ".join(others[:5]) + (f", ... ({len(others)} in all)" if len(others) > 5 else "")
        raise FileExistsError(f"{path} is {kind} but also holds files this toolkit did not write there ({shown}); "
                              "nothing was touched: move them out, or choose a new path")


def _listed_files(kind: str) -> WrittenFiles:
    def listed(folder: Path) -> set[str] | None:
        try:
            listing = json.loads((folder / LISTING).read_text())
        except (OSError, ValueError, RecursionError):
            return None
        files = listing.get("files") if isinstance(listing, dict) and listing.get("kind") == kind else None
        if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
            return None
        return {*files, LISTING}
    return listed


def _files_under(folder: Path) -> set[str]:
    """Every entry under ``folder`` that is not a folder (links included, never followed), relative to it."""
    found = set()
    for root, dirs, files in os.walk(folder):
        links = [name for name in dirs if os.path.islink(os.path.join(root, name))]
        found.update(os.path.relpath(os.path.join(root, name), folder) for name in [*files, *links])
    return found


def _swap_into_place(staging: Path, path: Path) -> None:
    """Make ``staging`` the folder at ``path``; an old folder there is retired and removed once the new one is in
    place (see the module docstring)."""
    if not os.path.lexists(path):
        os.replace(staging, path)
    elif _exchange(staging, path):
        shutil.rmtree(staging)  # now the retired folder
    else:
        retired = staging.with_name(staging.name + ".old")
        os.replace(path, retired)
        try:
            os.replace(staging, path)
        except BaseException:
            os.replace(retired, path)  # put the previous folder back
            raise
        shutil.rmtree(retired)


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this kernel or file system cannot exchange
        return False
    raise OSError(error, os.strerror(error), str(second))


def recover_interrupted_swap(path: Path) -> bool:
    """Where a save was killed between its two renames (no folder at ``path``, its previous copy retired to a
    ``.old`` sibling no live save holds), move that copy back. Returns whether it did."""
    path = Path(path)
    if os.path.lexists(path):
        return False
    retired = [sibling for sibling in path.parent.glob(f".{path.name}.*.old") if sibling.is_dir()
               and _abandoned(sibling, _lock_file(sibling.with_name(sibling.name.removesuffix(".old"))))]
    if not retired:
        return False
    os.replace(max(retired, key=lambda sibling: sibling.stat().st_mtime), path)
    return True


def remove_abandoned_staging(path: Path) -> list[Path]:
    """Remove the staging siblings of ``path`` that no live save holds (see the module docstring), after putting
    back a retired copy an interrupted swap left as the only one."""
    recover_interrupted_swap(path)
    removed = []
    for sibling in path.parent.glob(f".{path.name}.*"):
        if not sibling.is_dir() or sibling.name.endswith(".lock"):
            continue
        lock = _lock_file(sibling.with_name(sibling.name.removesuffix(".old")))
        if _abandoned(sibling, lock):
            shutil.rmtree(sibling, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(sibling)
    return removed


def _lock_file(staging: Path) -> Path:
    return staging.with_name(staging.name + ".lock")


@contextlib.contextmanager
def _locked(lock: Path):
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(descriptor)


def _abandoned(sibling: Path, lock: Path) -> bool:
    """Whether no live save holds ``sibling``: its lock is free, or it has had no lock for the grace period."""
    try:
        descriptor = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return time.time() - sibling.stat().st_mtime > UNLOCKED_GRACE_SECONDS
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def current_umask() -> int:
    """The process's umask, read without changing it where /proc says it (Linux), else set and restored."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _apply_umask(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only entries; give them what the user's umask gives new files."""
    mask = current_umask()
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)
