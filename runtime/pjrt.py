"""Compile and run StableHLO on a PJRT client from jaxlib (CPU by default).

Global JAX config is never changed: 64-bit inputs are placed on the device
inside ``jax.enable_x64`` (a scoped setting) so int64/float64 stay 64-bit.
"""
from __future__ import annotations

import hashlib
import threading
from functools import lru_cache
from typing import Sequence

import jax
import numpy as np
from jax.extend.backend import get_backend

from .compile_cache import CompileCache
from .passes import prepare_for_xla

_COMPILED: dict[tuple[str, str], object] = {}
_COMPILE_LOCK = threading.Lock()
STATS = {"compiled": 0, "disk_hits": 0}  # this process: XLA compilations, and loads from the disk cache


@lru_cache(maxsize=None)
def client(platform: str = "cpu"):
    try:
        return get_backend(platform)
    except RuntimeError as error:
        raise RuntimeError(f"no PJRT client for platform '{platform}' ({error}); "
                           "'cpu' is always available, 'cuda'/'tpu' need their jax plugin") from error


def fingerprint(mlir_text: str) -> str:
    return hashlib.sha256(mlir_text.encode()).hexdigest()


class Executable:
    """A StableHLO module compiled once per (module fingerprint, platform): in memory for this process and,
    through the disk cache, for later ones. Quant types are legalized to integer math for XLA on a copy
    (the fingerprint is the original text's)."""

    def __init__(self, mlir_text: str, platform: str = "cpu"):
        self.platform = platform
        self.client = client(platform)
        self.device = self.client.devices()[0]
        key = (fingerprint(mlir_text), platform)
        with _COMPILE_LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = self._load_or_compile(mlir_text, key[0])
        self._loaded = _COMPILED[key]

    def _load_or_compile(self, mlir_text: str, module_fingerprint: str):
        cache = CompileCache.from_environment()
        cache_key = CompileCache.key(module_fingerprint, self.client) if cache else None
        executable = cache.load(cache_key, self.client, [self.device]) if cache else None
        if executable is not None:
            STATS["disk_hits"] += 1
            return executable
        executable = self.client.compile_and_load(prepare_for_xla(mlir_text), [self.device])
        STATS["compiled"] += 1
        if cache:
            try:
                cache.store(cache_key, self.client, executable)
            except OSError:  # a read-only or full disk costs a compile next time, nothing more
                pass
        return executable

    def put(self, arrays: Sequence[np.ndarray]) -> list:
        """Transfer host arrays to this executable's device (e.g. once, for weights)."""
        with jax.enable_x64(True):
            return [jax.device_put(a, self.device) for a in arrays]

    def execute(self, device_arrays: Sequence) -> list[np.ndarray]:
        outputs = self._loaded.execute(list(device_arrays))
        return [np.asarray(o) for o in outputs]


def compiled_count() -> int:
    """How many distinct modules this process has compiled (for tests of the cache)."""
    return len(_COMPILED)
