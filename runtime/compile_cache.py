"""Compiled executables kept on disk, so a second process running the same module compiles nothing.

The key covers the module, the rewrites made to it before XLA compiles it (``XLA_PREPARATION``), the platform
and its version, jaxlib's version and the compile
options (their serialized proto, which includes XLA's debug options from ``$XLA_FLAGS``),
so an executable built with other options is never returned.
Entries carry a checksum: a corrupt or unreadable entry is deleted and rebuilt.
Writes go to a temporary file renamed into place, so processes writing at once
are safe; the folder is kept under a size bound by evicting the least recently
used entries. The folder is measured (every entry stat-ed) at a process's first
write, and again only once the bound could be passed or this process has written
1/64 of it since: measuring it at every write made each write cost a walk of
thousands of entries.

Location: ``$TORCH_STABLEHLO_CACHE_DIR`` (``off`` disables the cache), else
``~/.cache/torch-stablehlo/executables``; bound: ``$TORCH_STABLEHLO_CACHE_MAX_BYTES``
(default 2 GiB).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import jaxlib
from jaxlib import _jax

from torch_stablehlo.stablehlo_ir.passes import XLA_PREPARATION

DIR_VARIABLE = "TORCH_STABLEHLO_CACHE_DIR"
MAX_BYTES_VARIABLE = "TORCH_STABLEHLO_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
_MAGIC = b"TSHX1"
_DIGEST = hashlib.sha256().digest_size


class CompileCache:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._measured: int | None = None  # the folder's bytes when last measured (None: not yet)
        self._written = 0  # bytes this process wrote since

    @classmethod
    def from_environment(cls) -> "CompileCache | None":
        """The cache the environment names (one object per folder and bound in a process, so what it measured
        of the folder carries from one write to the next)."""
        directory = os.environ.get(DIR_VARIABLE, str(Path.home() / ".cache" / "torch-stablehlo" / "executables"))
        if directory.lower() == "off":
            return None
        return _shared(directory, int(os.environ.get(MAX_BYTES_VARIABLE, DEFAULT_MAX_BYTES)))

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
        payload = blob[len(_MAGIC) + _DIGEST:]
        if not blob.startswith(_MAGIC) or blob[len(_MAGIC):len(_MAGIC) + _DIGEST] != hashlib.sha256(payload).digest():
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
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".tmp-", delete=False) as handle:
            handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(handle.name, self.directory / key)
        _parts_file(self.directory / key).write_text(json.dumps(parts))
        self._written += len(payload)
        if (self._measured is None or self._measured + self._written > self.max_bytes
                or self._written > self.max_bytes // 64):
            self._evict()

    def _evict(self) -> None:
        """Measure the folder and delete least recently used entries until it is within the bound."""
        entries = []
        for path in self.directory.iterdir():
            try:
                if not path.name.startswith("."):
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
