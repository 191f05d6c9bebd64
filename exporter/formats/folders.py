"""Writing an output folder atomically: build it in a hidden sibling, then rename it into place.

The sibling (``.NAME.xxxxxxxx``) is locked while a save writes it (``flock`` on ``.NAME.xxxxxxxx.lock``, which
the kernel releases when the writing process ends, however it ends). A save that was killed leaves its
sibling behind; the next save to the same path removes every sibling whose lock is free, never one that a
live save in another process holds.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

UNLOCKED_GRACE_SECONDS = 600
"""A sibling with no lock file (a save between making its folder and its lock) is left alone this long."""


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike, marker: str, kind: str):
    """Yield an empty staging folder; when the block succeeds it becomes ``path``.

    A failure (or an interrupt) removes the staging folder, so ``path`` is never
    half-written. An existing folder at ``path`` is replaced only if it is empty or
    holds ``marker`` (i.e. it is a ``kind`` folder written earlier); anything else
    there is an error, raised before anything is written.
    """
    path = Path(path)
    if path.exists() and not (path / marker).is_file() and not _empty_folder(path):
        raise FileExistsError(f"{path} exists and is not {kind} nor an empty folder; choose a new path or "
                              "remove it")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    with _locked(_lock_file(staging)):
        try:
            yield staging
            _make_readable(staging)
            if path.exists():
                retired = staging.with_name(staging.name + ".old")
                os.replace(path, retired)
                try:
                    os.replace(staging, path)
                except BaseException:
                    os.replace(retired, path)  # put the previous folder back
                    raise
                shutil.rmtree(retired)
            else:
                os.replace(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def remove_abandoned_staging(path: Path) -> list[Path]:
    """Remove the staging siblings of ``path`` that no live save holds (see the module docstring)."""
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


def _empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _make_readable(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only entries; artifacts are meant to be shared."""
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
