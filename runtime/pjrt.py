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

from stablehlo_ir.passes import prepare_for_xla
from stablehlo_ir.refine import refine_shapes, shapes_key

from .compile_cache import CompileCache

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


def compile_options():
    """The ``CompileOptions`` every module is compiled with (the defaults, today); the disk cache's key
    covers them, so changing them here can never load an executable built with others."""
    from jaxlib import _jax

    return _jax.CompileOptions()


def fingerprint(mlir_text: str) -> str:
    return hashlib.sha256(mlir_text.encode()).hexdigest()


class Executable:
    """A StableHLO module compiled once per (module fingerprint, platform): in memory for this process and,
    through the disk cache, for later ones. Quant types are legalized to integer math for XLA on a copy
    (the fingerprint is the original text's).

    A module with symbolic (``?``) dims is compiled once per ``arg_shapes`` (the static shape of every
    ``@main`` argument for one call): it is refined to those shapes first (``stablehlo_ir.refine``), and the
    fingerprint is the module's and the shapes' together, so a cache hit refines nothing."""

    def __init__(self, mlir_text: str, platform: str = "cpu", arg_shapes: Sequence[Sequence[int]] | None = None):
        self.platform = platform
        self.client = client(platform)
        self.device = self.client.devices()[0]
        module_fingerprint = fingerprint(mlir_text)
        if arg_shapes is not None:
            module_fingerprint = fingerprint(f"{module_fingerprint}\0{shapes_key(arg_shapes)}")
        key = (module_fingerprint, platform)
        with _COMPILE_LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = self._load_or_compile(mlir_text, key[0], arg_shapes)
        self._loaded = _COMPILED[key]

    def _load_or_compile(self, mlir_text: str, module_fingerprint: str, arg_shapes=None):
        cache = CompileCache.from_environment()
        options = compile_options()
        cache_key = CompileCache.key(module_fingerprint, self.client, options) if cache else None
        executable = cache.load(cache_key, self.client, [self.device]) if cache else None
        if executable is not None:
            STATS["disk_hits"] += 1
            return executable
        refine = None if arg_shapes is None else (lambda text: refine_shapes(text, arg_shapes))
        executable = self.client.compile_and_load(prepare_for_xla(mlir_text, refine), [self.device], options)
        STATS["compiled"] += 1
        if cache:
            try:
                cache.store(cache_key, self.client, executable)
            except OSError:  # a read-only or full disk costs a compile next time, nothing more
                pass
        return executable

    def put(self, arrays: Sequence[np.ndarray]) -> list:
        """Transfer host arrays to this executable's device (e.g. once, for weights)."""
        return put(arrays, self.platform)

    def execute(self, device_arrays: Sequence) -> list[np.ndarray]:
        outputs = self._loaded.execute(list(device_arrays))
        return [np.asarray(o) for o in outputs]


def put(arrays: Sequence[np.ndarray], platform: str = "cpu") -> list:
    """Transfer host arrays to the platform's first device (where every Executable of it runs)."""
    device = client(platform).devices()[0]
    with jax.enable_x64(True):
        return [jax.device_put(a, device) for a in arrays]


def compiled_count() -> int:
    """How many distinct modules this process has compiled (for tests of the cache)."""
    return len(_COMPILED)
