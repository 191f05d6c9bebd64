"""Compiled executables kept on disk, so a second process running the same module compiles nothing.

The key covers the module, the platform and its version, jaxlib's version and the compile
options (their serialized proto, which includes XLA's debug options from ``$XLA_FLAGS``),
so an executable built with other options is never returned.
Entries carry a checksum: a corrupt or unreadable entry is deleted and rebuilt.
Writes go to a temporary file renamed into place, so processes writing at once
are safe; the folder is kept under a size bound by evicting the least recently
used entries.

Location: ``$TORCH_STABLEHLO_CACHE_DIR`` (``off`` disables the cache), else
``~/.cache/torch-stablehlo/executables``; bound: ``$TORCH_STABLEHLO_CACHE_MAX_BYTES``
(default 2 GiB).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import jaxlib

DIR_VARIABLE = "TORCH_STABLEHLO_CACHE_DIR"
MAX_BYTES_VARIABLE = "TORCH_STABLEHLO_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
_MAGIC = b"TSHX1"
_DIGEST = hashlib.sha256().digest_size


class CompileCache:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    @classmethod
    def from_environment(cls) -> "CompileCache | None":
        directory = os.environ.get(DIR_VARIABLE, str(Path.home() / ".cache" / "torch-stablehlo" / "executables"))
        if directory.lower() == "off":
            return None
        return cls(directory, int(os.environ.get(MAX_BYTES_VARIABLE, DEFAULT_MAX_BYTES)))

    @staticmethod
    def key(module_fingerprint: str, client, compile_options=None) -> str:
        """``compile_options``: the ``CompileOptions`` the executable is compiled with (None: the defaults)."""
        parts = (module_fingerprint, client.platform, client.platform_version, jaxlib.__version__,
                 canonical_options(compile_options))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

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

    def store(self, key: str, client, executable) -> None:
        payload = client.serialize_executable(executable)
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".tmp-", delete=False) as handle:
            handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(handle.name, self.directory / key)
        self._evict()

    def _evict(self) -> None:
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
            total -= size


def canonical_options(compile_options=None) -> str:
    """A canonical form of ``CompileOptions`` for the key: the sha256 of its serialized proto, with the
    environment option overrides (a list of pairs, the only unordered part) sorted by name first."""
    from jaxlib import _jax

    options = _jax.CompileOptions() if compile_options is None else compile_options
    overrides = list(options.env_option_overrides)
    if overrides:
        options = _jax.CompileOptions.ParseFromString(options.SerializeAsString())  # a copy
        options.env_option_overrides = sorted(overrides, key=lambda pair: pair[0])
    return hashlib.sha256(options.SerializeAsString()).hexdigest()
