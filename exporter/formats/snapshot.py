"""One bundle folder as it was when opened: every file read relative to the folder's descriptor, so a save that
swaps another folder in meanwhile cannot hand a reader one version's module and another's weights.

A save builds a new folder and exchanges it with the old one (``folders``); it never writes into a folder that a
reader may hold. So a reader that opens the folder once (``os.open(O_DIRECTORY)``) and every file relative to it
(``openat``, ``O_NOFOLLOW``: a link is refused, not followed) reads one version whatever is swapped in at the
path meanwhile, or finds a file already removed (the retired copy is deleted after the swap): ``replaced`` then
says the path holds another folder, and the caller starts over on it. Each file's bytes are read once, and its
size and sha256 are checked on the very bytes that are parsed (``checked_bytes``).
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
from pathlib import Path

from ..errors import BundleError
from .manifest_schema import plain_file_name

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block
_LINK_ERRORS = (errno.ELOOP, errno.EMLINK)  # what openat(O_NOFOLLOW) says of a link (Linux, BSD)
_BLOCK = 1 << 22


class FolderSnapshot:
    """The folder at ``path``, opened once (a context manager: closed at the end)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            raise BundleError(f"{path}: no such bundle folder") from None
        self._identity = _identity(os.fstat(self._descriptor))

    def __enter__(self) -> "FolderSnapshot":
        return self

    def __exit__(self, *error) -> None:
        os.close(self._descriptor)

    def replaced(self) -> bool:
        """Whether the path now holds another folder than the one opened (a save swapped one in)."""
        try:
            return _identity(os.stat(self.path)) != self._identity
        except OSError:
            return True

    def open(self, name: str):
        """A binary file object of the regular file ``name`` right inside the folder (not a link, not a FIFO or
        folder), opened relative to the folder's descriptor."""
        if not plain_file_name(name):
            raise BundleError(f"{self.path}: the manifest names the file {name!r}; a bundle's files are plain names "
                              "inside it")
        try:
            descriptor = os.open(name, _OPEN_FLAGS, dir_fd=self._descriptor)
        except FileNotFoundError:
            raise BundleError(f"{self.path}: {name} is missing") from None
        except OSError as error:
            what = "a link" if error.errno in _LINK_ERRORS else f"unreadable ({error.strerror})"
            raise BundleError(f"{self.path}: {name} is {what}; a bundle's files are regular files inside its "
                              "folder") from None
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise BundleError(f"{self.path}: {name} is not a regular file; a bundle's files are regular files "
                              "inside its folder")
        return os.fdopen(descriptor, "rb", buffering=0)

    def read(self, name: str, max_bytes: int, setting: str) -> bytearray:
        """The whole file ``name``, refused unread when it is over ``max_bytes`` (``setting`` raises the bound)."""
        with self.open(name) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise BundleError(f"{self.path / name} is {size} bytes, over the {max_bytes} bytes a bundle's {name} "
                                  f"may have (${setting} raises the bound)")
            return _read_exactly(handle, size, self.path / name)


def checked_bytes(handle, file: Path, record: dict) -> bytearray:
    """The bytes of the open ``file``, read once, once their size and sha256 are the manifest's ``record``."""
    _check_size(file, os.fstat(handle.fileno()).st_size, record)
    data = _read_exactly(handle, record["bytes"], file)
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise BundleError(f"{file} is corrupt: its sha256 differs from the manifest's")
    return data


def checked_mapping(handle, file: Path, record: dict):
    """The open ``file`` mapped into memory (copy-on-write: writable, shared with the page cache until written),
    once the size and sha256 of the mapping are the manifest's ``record``. As fast as safetensors' own reader
    (which maps the file too): the tensors made from it are views of the very mapping that was checked."""
    _check_size(file, os.fstat(handle.fileno()).st_size, record)
    data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if record["bytes"] else bytearray()
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise BundleError(f"{file} is corrupt: its sha256 differs from the manifest's")
    return data


def check_stream(handle, file: Path, record: dict) -> None:
    """Raise BundleError unless the open ``file`` has the size and sha256 of ``record`` (read in blocks, not kept)."""
    _check_size(file, os.fstat(handle.fileno()).st_size, record)
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(_BLOCK), b""):
        digest.update(block)
    if digest.hexdigest() != record["sha256"]:
        raise BundleError(f"{file} is corrupt: its sha256 differs from the manifest's")


def handle_path(handle) -> str:
    """A path that opens the very file ``handle`` holds (for libraries that take a path), not whatever is at its
    name now."""
    return f"/dev/fd/{handle.fileno()}"


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _check_size(file: Path, size: int, record: dict) -> None:
    if size < record["bytes"]:
        raise BundleError(f"{file} is truncated: {size} of {record['bytes']} bytes")
    if size != record["bytes"]:
        raise BundleError(f"{file} is corrupt: {size} bytes, the manifest says {record['bytes']}")


def _read_exactly(handle, size: int, file: Path) -> bytearray:
    """``size`` bytes of ``handle``, into one buffer (a raw read returns at most about 2 GB at once)."""
    data = bytearray(size)
    view, done = memoryview(data), 0
    while done < size:
        count = handle.readinto(view[done:])
        if not count:
            raise BundleError(f"{file} is truncated: {done} of {size} bytes")
        done += count
    return data
