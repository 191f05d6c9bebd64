"""Compile and run StableHLO on a PJRT client from jaxlib (CPU by default).

Global JAX config is never changed: 64-bit inputs are placed on the device as 64-bit (the transfer told so, or
inside ``jax.enable_x64``, a scoped setting) so int64/float64 stay 64-bit.
A module partitioned over a device mesh runs SPMD on its devices (see ``runtime.spmd``).

Compiled executables stay in memory, at most ``$TORCH_STABLEHLO_MAX_EXECUTABLES`` (``runtime.settings``, default
64) in this process and as many per artifact (one per shape signature of a dynamic module); past that the least
recently used is dropped (a later call at its shapes loads it from the disk cache, or compiles it again).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
from collections import OrderedDict
import time
from functools import lru_cache
from typing import Sequence

import jax
import numpy as np
from jax.extend.backend import get_backend
from jaxlib import _jax

from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla
from torch_stablehlo.stablehlo_ir.refine import refine_shapes, shapes_key

from . import settings, spmd
from .analysis import ANALYSIS
from .compile_cache import CompileCache, digest


class LeastRecentlyUsed(OrderedDict):
    """A dict of at most ``maxsize`` items (None: ``$TORCH_STABLEHLO_MAX_EXECUTABLES`` as it is when one is added):
    reading one makes it the most recent, and adding one past the bound drops the least recently used."""

    def __init__(self, maxsize: int | None = None):
        super().__init__()
        self.maxsize = maxsize

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > (self.maxsize or settings.MAX_EXECUTABLES.value()):
            self.popitem(last=False)


_COMPILED: LeastRecentlyUsed = LeastRecentlyUsed()  # (module fingerprint, platform, extra options) -> executable
_COMPILE_LOCK = threading.Lock()
STATS = {"compiled": 0, "disk_hits": 0}  # this process: XLA compilations, and loads from the disk cache


@lru_cache(maxsize=None)
def client(platform: str = "cpu"):
    try:
        return get_backend(platform)
    except RuntimeError as error:
        raise RuntimeError(f"no PJRT client for platform '{platform}' ({error}); "
                           "'cpu' is always available, 'cuda'/'tpu' need their jax plugin") from error


# XLA options every module is compiled with. Region analysis lets XLA CPU's copy insertion see that a state
# argument donated to its new value (``tf.aliasing_output``: a KV cache written by dynamic_update_slice) may be
# read before the write and updated in place, instead of copying it (2-3 whole copies of each cache per call).
XLA_OPTIONS = (("xla_cpu_copy_insertion_use_region_analysis", True),)
_EXTRA_OPTIONS: contextvars.ContextVar[tuple] = contextvars.ContextVar("extra_xla_options", default=())


@contextlib.contextmanager
def extra_xla_options(*pairs: tuple[str, object]):
    """Modules compiled inside are compiled with these XLA options too (e.g. a lower LLVM optimisation level for
    programs compiled only to be timed against each other); the in-memory and disk caches key on them, so an
    executable built with them never serves a compile without them."""
    token = _EXTRA_OPTIONS.set(_EXTRA_OPTIONS.get() + tuple(pairs))
    try:
        yield
    finally:
        _EXTRA_OPTIONS.reset(token)


def compile_options():
    """The ``CompileOptions`` every module is compiled with (``XLA_OPTIONS``, and any ``extra_xla_options`` in
    force); the disk cache's key covers them, so changing them here can never load an executable built with
    others."""
    options = _jax.CompileOptions()
    options.env_option_overrides = list(XLA_OPTIONS) + list(_EXTRA_OPTIONS.get())
    return options


def fingerprint(mlir_text: str) -> str:
    return hashlib.sha256(mlir_text.encode()).hexdigest()


class Executable:
    """A StableHLO module compiled once per (module fingerprint, platform): in memory for this process and,
    through the disk cache, for later ones. Quant types are legalized to integer math for XLA on a copy
    (the fingerprint is the original text's).

    A module with symbolic (``?``) dims is compiled once per ``arg_shapes`` (the static shape of every
    ``@main`` argument for one call): it is refined to those shapes first (``stablehlo_ir.refine``), and the
    fingerprint is the module's and the shapes' together, so a cache hit refines nothing.

    With ``mesh`` (axis -> size, the module's ``sdy.mesh``) it is compiled for SPMD over that many devices (the
    mesh is part of the key); ``MeshError`` if the client has fewer."""

    def __init__(self, mlir_text: str, platform: str = "cpu", arg_shapes: Sequence[Sequence[int]] | None = None,
                 mesh: spmd.MeshAxes | None = None):
        self.platform = platform
        self.client = client(platform)
        self.mesh = device_mesh(platform, tuple(mesh.items())) if mesh else None
        self.devices = list(self.mesh.devices.flat) if mesh else [first_device(platform)]
        module_fingerprint = fingerprint(mlir_text)
        self.module = module_fingerprint[:12]  # names the module in the analysis (runtime.analysis)
        self.shapes = shapes_key(arg_shapes) if arg_shapes is not None else "static"
        if arg_shapes is not None or mesh:
            module_fingerprint = fingerprint(f"{module_fingerprint}\0{shapes_key(arg_shapes or [])}\0{mesh}")
        key = (module_fingerprint, platform, _EXTRA_OPTIONS.get())
        with _COMPILE_LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = self._load_or_compile(mlir_text, key[0], arg_shapes)
            self._loaded = _COMPILED[key]
        self._layouts = None

    def _load_or_compile(self, mlir_text: str, module_fingerprint: str, arg_shapes=None):
        start, cause = time.perf_counter(), ANALYSIS.cause(self.module, self.shapes)
        cache = CompileCache.from_environment()
        options = compile_options() if self.mesh is None else spmd.compile_options(compile_options(), self.mesh)
        parts = CompileCache.key_parts(module_fingerprint, self.client, options)
        executable = cache.load(digest(parts), self.client, self.devices) if cache else None
        if executable is not None:
            STATS["disk_hits"] += 1
            disk = "hit"
        else:
            refine = None if arg_shapes is None else (lambda text: refine_shapes(text, arg_shapes))
            executable = self.client.compile_and_load(prepare_for_xla(mlir_text, refine, self.platform), self.devices,
                                                     options)
            STATS["compiled"] += 1
            disk = "off" if not cache else f"miss ({cache.explain_miss(parts)})" if ANALYSIS.enabled else "miss"
            if cache:
                try:
                    cache.store(parts, self.client, executable)
                    disk += ", written"
                except OSError:  # a read-only or full disk costs a compile next time, nothing more
                    disk += ", not written"
        if ANALYSIS.enabled:
            ANALYSIS.compiled(mlir_text, self.module, self.shapes, cause, disk, time.perf_counter() - start)
        return executable

    def put(self, arrays: Sequence, first: int = 0) -> list:
        """Transfer host arrays, this executable's arguments ``first``, ``first + 1``, ..., to its device; over a
        mesh, split as the compiled program takes them, each device getting its shard only (there an array may
        be anything with ``shape`` whose ``[index]`` reads one shard as numpy, e.g. a lazy reader of a weights
        file: only this process's shards are read)."""
        if self.mesh is None:
            return put(arrays, self.platform)
        return [spmd.place(a.shape, layout, a.__getitem__) for a, layout in zip(arrays, self.layouts[first:])]

    def holds(self, argument: int, array) -> bool:
        """Whether a placed ``array`` is laid out as this executable takes ``argument`` (so can be reused)."""
        if self.mesh is None:
            return True
        return array.sharding.is_equivalent_to(self.layouts[argument], array.ndim)

    @property
    def layouts(self) -> list:
        """Over a mesh, the sharding of each argument as the compiled program takes it."""
        if self._layouts is None:
            self._layouts = spmd.parameter_layouts(self._loaded, self.mesh)
        return self._layouts

    @property
    def loaded(self):
        """The compiled ``LoadedExecutable`` (its HLO, memory figures, shardings)."""
        return self._loaded

    def execute(self, device_arrays: Sequence, laid_out: bool = False) -> list[jax.Array]:
        """The results, computed (each one device's array: over a mesh, from this process's first device; with
        ``laid_out``, global arrays split as the program returns them, to pass on to another call);
        ``np.asarray`` or ``stablehlo_ir.dtypes.to_torch`` reads them (on CPU, without a copy)."""
        start = time.perf_counter()
        if self.mesh is not None:
            outputs = (spmd.execute_laid_out(self._loaded, self.mesh, device_arrays) if laid_out else
                       spmd.execute(self._loaded, device_arrays))
        else:
            outputs = self._loaded.execute(list(device_arrays))
            if outputs:  # one execution's results are ready together: waiting on each costs a call apiece
                outputs[0].block_until_ready()
        if ANALYSIS.enabled:
            ANALYSIS.executed(self.module, self.shapes, time.perf_counter() - start)
        return outputs


def put(arrays: Sequence[np.ndarray], platform: str = "cpu", mesh: spmd.MeshAxes | None = None,
        specs: Sequence | None = None) -> list:
    """Transfer host arrays to the platform's first device (where every single-device Executable runs); with
    ``mesh``, split over its devices as ``specs`` say (one per array; None: replicated), each device getting
    only its shard."""
    if mesh:
        devices = device_mesh(platform, tuple(mesh.items()))
        return [spmd.place(a.shape, spmd.sharding(devices, spec), a.__getitem__) for a, spec in zip(arrays, specs)]
    device = first_device(platform)
    return [_placed(a, device) for a in arrays]


def _placed(array, device) -> jax.Array:
    """``jax.device_put(array, device)`` with 64-bit types kept, for a numpy array without jax's dispatch around
    the transfer (the same call, with the same semantics, a tenth of the time: a per-token decode call places its
    token and position at each step)."""
    if not isinstance(array, np.ndarray):
        with jax.enable_x64(True):
            return jax.device_put(array, device)
    return _jax.batched_device_put(jax.core.ShapedArray(array.shape, array.dtype), _on_one(device), [array],
                                   [device], True, enable_x64=True)


@lru_cache(maxsize=None)
def first_device(platform: str = "cpu"):
    """The platform's first device, where every single-device Executable runs."""
    return client(platform).devices()[0]


@lru_cache(maxsize=None)
def _on_one(device) -> jax.sharding.SingleDeviceSharding:
    return jax.sharding.SingleDeviceSharding(device)


@lru_cache(maxsize=None)
def device_mesh(platform: str, axes: tuple[tuple[str, int], ...]) -> jax.sharding.Mesh:
    """The platform's devices laid out as the mesh ``axes`` (see ``spmd.device_mesh``)."""
    return spmd.device_mesh(client(platform), dict(axes))


def compiled_count() -> int:
    """How many compiled modules this process holds (at most ``$TORCH_STABLEHLO_MAX_EXECUTABLES``; for tests of the cache)."""
    return len(_COMPILED)
