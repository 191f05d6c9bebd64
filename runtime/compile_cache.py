"""Compiled executables kept on disk, so a second process running the same module compiles nothing.

The key covers the module, the rewrites made to it before XLA compiles it (``XLA_PREPARATION``), the platform
and its version, jaxlib's version and the compile
options (their serialized proto, which includes XLA's debug options from ``$XLA_FLAGS``),
so an executable built with other options is never returned.
Entries carry their key and a checksum over key and payload, checked on read: a corrupt or unreadable entry, or
one copied over another key's name, is deleted and rebuilt.
Writes go to a temporary file renamed into place, so processes writing at once
are safe (a failed write removes its temporary file); the folder is kept under a size bound by evicting the
least recently used entries, temporary files left by killed writers included. The folder is measured (every entry stat-ed) at a process's first
write, and again only once the bound could be passed or this process has written
1/64 of it since: measuring it at every write made each write cost a walk of
thousands of entries.

Location: ``$TORCH_STABLEHLO_CACHE_DIR`` (``off`` disables the cache), else
``~/.cache/torch-stablehlo/executables``; bound: ``$TORCH_STABLEHLO_CACHE_MAX_BYTES``
(default 2 GiB; ``500MB``, ``4GB`` and the like: see ``runtime.settings``).

Entries are native code this process runs, so the folder must be the user's own: one owned by another user, or
writable by group or others, is refused with one warning and compilation goes on without it, unless
``$TORCH_STABLEHLO_CACHE_SHARED=1`` says the cache is shared on purpose. A folder the cache creates is ``0700``.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import jaxlib
from jaxlib import _jax

from torch_stablehlo.stablehlo_ir.passes import XLA_PREPARATION

from . import settings

DIR_VARIABLE = settings.CACHE_DIR.variable
SHARED_VARIABLE = settings.CACHE_SHARED.variable
_MAGIC = b"TSHX2"  # 2: the entry's key, then a checksum over key and payload
_DIGEST = hashlib.sha256().digest_size
_TEMPORARY = ".tmp-"


class CompileCache:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = settings.CACHE_MAX_BYTES.default):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._measured: int | None = None  # the folder's bytes when last measured (None: not yet)
        self._written = 0  # bytes this process wrote since

    @classmethod
    def from_environment(cls) -> "CompileCache | None":
        """The cache the environment names (one object per folder and bound in a process, so what it measured
        of the folder carries from one write to the next)."""
        directory = settings.CACHE_DIR.value()
        if directory is None or not _usable(str(directory), settings.CACHE_SHARED.value()):
            return None
        return _shared(str(directory), settings.CACHE_MAX_BYTES.value())

    @staticmethod
    def key_parts(module_fingerprint: str, client, compile_options=None) -> dict[str, str]:
        """What an entry's key covers, by name; ``compile_options``: the ``CompileOptions`` the executable is
        compiled with (None: the defaults)."""
        return {"module": module_fingerprint, "xla preparation": XLA_PREPARATION, "platform": client.platform,
                "platform version": client.platform_version, "jaxlib version": jaxlib.__version__,
                "compile options": canonical_options(compile_options)}

    @classmethod
    def key(cls, module_fingerprint: str, client, compile_options=None) -> str:
        """The entry's name: a digest of its ``key_parts``."""
        return digest(cls.key_parts(module_fingerprint, client, compile_options))

    def explain_miss(self, parts: dict[str, str]) -> str:
        """Why no entry matches ``parts``: the key parts an entry for the same module was stored with that
        differ, or that no entry holds this module."""
        differing = []
        for stored in self.directory.glob(".*.parts.json"):
            try:
                other = json.loads(stored.read_text())
            except (OSError, ValueError):
                continue
            if other.get("module") == parts["module"]:
                differing.append(", ".join(name for name in parts if other.get(name) != parts[name]))
        if differing:
            return f"the entry for this module differs in: {min(differing, key=len)}"
        return "no entry for this module (never compiled with this cache, or evicted)"

    def load(self, key: str, client, devices):
        """The cached executable, or None (missing, corrupt or unloadable entries are removed)."""
        path = self.directory / key
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        payload = _payload(blob, key)
        if payload is None:  # corrupt, from an older format, or another key's entry copied over this one
            path.unlink(missing_ok=True)
            return None
        try:
            executable = client.deserialize_executable(payload, devices)
        except Exception:  # written by an incompatible build: rebuild it
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # most recently used
        return executable

    def store(self, parts: dict[str, str], client, executable) -> None:
        """Write the entry for ``parts`` (and, beside it, the parts themselves, for ``explain_miss``)."""
        key = digest(parts)
        payload = client.serialize_executable(executable)
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(dir=self.directory, prefix=_TEMPORARY, delete=False)
        try:
            with handle:
                handle.write(_entry(key, payload))
            os.replace(handle.name, self.directory / key)
        except BaseException:  # a full disk, an interrupt: no temporary file left behind
            Path(handle.name).unlink(missing_ok=True)
            raise
        _parts_file(self.directory / key).write_text(json.dumps(parts))
        self._written += len(payload)
        if (self._measured is None or self._measured + self._written > self.max_bytes
                or self._written > self.max_bytes // 64):
            self._evict()

    def _evict(self) -> None:
        """Measure the folder (entries, and temporary files a killed writer left) and delete the least recently
        used until it is within the bound."""
        entries = []
        for path in self.directory.iterdir():
            try:
                if not path.name.startswith(".") or path.name.startswith(_TEMPORARY):
                    stat = path.stat()
                    entries.append((stat.st_mtime, stat.st_size, path))
            except OSError:  # removed by another process meanwhile
                continue
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            _parts_file(path).unlink(missing_ok=True)
            total -= size
        self._measured, self._written = total, 0


@lru_cache(maxsize=None)
def _shared(directory: str, max_bytes: int) -> CompileCache:
    return CompileCache(directory, max_bytes)


@lru_cache(maxsize=None)
def _usable(directory: str, shared: bool) -> bool:
    """Whether the cache may use ``directory`` (created ``0700`` if missing): the user's own and writable by no one
    else, or ``shared`` on purpose. Warns once per folder when not."""
    try:
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
        status = os.stat(directory)
    except OSError:  # cannot be made: nothing to read, and writes would fail
        return False
    problem = ("it is owned by another user" if status.st_uid != os.getuid() else
               "group or others can write to it" if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) else None)
    if problem is not None and not shared:
        warnings.warn(f"compile cache {directory} is not used: {problem}, and its entries are native code this "
                      f"process would run; compiling without it. Use a folder of your own (${DIR_VARIABLE}), or set "
                      f"${SHARED_VARIABLE}=1 if the cache is shared on purpose", stacklevel=3)
        return False
    return True


def _entry(key: str, payload: bytes) -> bytes:
    """An entry's bytes: magic, its key, a checksum over key and payload, the payload."""
    bound = bytes.fromhex(key)
    return _MAGIC + bound + hashlib.sha256(bound + payload).digest() + payload


def _payload(blob: bytes, key: str) -> bytes | None:
    """The payload of an entry read for ``key``; None unless it was written for that key and is intact."""
    header = len(_MAGIC) + 2 * _DIGEST
    bound, checksum, payload = blob[len(_MAGIC):len(_MAGIC) + _DIGEST], blob[len(_MAGIC) + _DIGEST:header], blob[header:]
    if not blob.startswith(_MAGIC) or bound != bytes.fromhex(key):
        return None
    return payload if hashlib.sha256(bound + payload).digest() == checksum else None


def digest(parts: dict[str, str]) -> str:
    return hashlib.sha256("\0".join(parts.values()).encode()).hexdigest()


def _parts_file(entry: Path) -> Path:
    return entry.with_name(f".{entry.name}.parts.json")


def canonical_options(compile_options=None) -> str:
    """A canonical form of ``CompileOptions`` for the key: the sha256 of its serialized proto, with the
    environment option overrides (a list of pairs, the only unordered part) sorted by name first."""
    options = _jax.CompileOptions() if compile_options is None else compile_options
    overrides = list(options.env_option_overrides)
    if overrides:
        options = _jax.CompileOptions.ParseFromString(options.SerializeAsString())  # a copy
        options.env_option_overrides = sorted(overrides, key=lambda pair: pair[0])
    return hashlib.sha256(options.SerializeAsString()).hexdigest()
