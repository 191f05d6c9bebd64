"""What work costs on a mesh's devices, measured there: the rates the sharding search prices its plans with.

Measured with every device of the mesh busy at once (on CPU, N virtual devices share the host's cores, so one
device's rate alone would flatter splitting): the f32 product rate, the elementwise memory rate, and for each
mesh axis the all-reduce and all-gather time as latency + seconds per byte (a line through two sizes). Kept as
JSON per platform, device kind, device count and mesh in ``$TORCH_STABLEHLO_DEVICE_COSTS`` (default
``~/.cache/torch-stablehlo/device_costs.json``), so each is measured once per machine.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from . import pjrt

FILE_VARIABLE = "TORCH_STABLEHLO_DEVICE_COSTS"
_SMALL, _LARGE = 1 << 12, 1 << 22  # bytes per device of the two collective sizes timed


@dataclass(frozen=True)
class Collective:
    """Time of one collective over an axis: ``latency`` seconds plus ``per_byte`` per byte of its result."""
    latency: float
    per_byte: float

    def seconds(self, nbytes: float) -> float:
        return self.latency + nbytes * self.per_byte


@dataclass(frozen=True)
class DeviceCosts:
    """Rates of one device while all of the mesh's devices work: products (flop/s), elementwise (bytes/s),
    and per mesh axis its all-reduce and all-gather."""
    flops: float
    memory: float
    all_reduce: dict[str, Collective]
    all_gather: dict[str, Collective]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "DeviceCosts":
        return cls(data["flops"], data["memory"], {a: Collective(**c) for a, c in data["all_reduce"].items()},
                   {a: Collective(**c) for a, c in data["all_gather"].items()})


def device_costs(mesh: dict[str, int], platform: str = "cpu") -> DeviceCosts:
    """The costs on ``mesh``'s devices of ``platform``: read from the cache file, else measured (a few seconds)
    and written there. Raises ``MeshError`` when the platform has fewer devices than the mesh."""
    devices = pjrt.device_mesh(platform, tuple(mesh.items()))
    key = costs_key(mesh, platform)
    path = costs_file()
    known = _read(path)
    if key not in known:
        known[key] = _measure(devices).to_json()
        _write(path, known)
    return DeviceCosts.from_json(known[key])


def costs_key(mesh: dict[str, int], platform: str = "cpu") -> str:
    """The cache file's key for ``mesh`` on this process's ``platform`` devices."""
    devices = jax.devices(platform)
    return f"{platform}/{devices[0].device_kind}/{len(devices)}/" + ",".join(f"{a}={n}" for a, n in mesh.items())


def costs_file() -> Path:
    return Path(os.environ.get(FILE_VARIABLE, Path.home() / ".cache" / "torch-stablehlo" / "device_costs.json"))


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: Path, data: dict) -> None:
    """Written to a temporary file renamed into place (processes measuring at once do not tear it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump(data, handle, indent=1)
        os.replace(handle.name, path)
    except OSError:  # an unwritable cache only costs a measurement next time
        pass


def _seconds(fn, *args) -> float:
    """The best of a few timed runs of a compiled ``fn`` (after one warm-up)."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def _measure(mesh: jax.sharding.Mesh) -> DeviceCosts:
    every = tuple(mesh.axis_names)
    split = NamedSharding(mesh, PartitionSpec(every))
    n, size = mesh.size, 256
    a = jax.device_put(np.ones((n * size, size), np.float32), split)
    b = jax.device_put(np.ones((size, size), np.float32), NamedSharding(mesh, PartitionSpec()))
    flops = 2.0 * size ** 3 / _seconds(jax.jit(jnp.matmul), a, b)
    x = jax.device_put(np.ones((n * (_LARGE // 4),), np.float32), split)
    memory = 2.0 * _LARGE / _seconds(jax.jit(lambda v: v * 2.0 + 1.0), x)
    all_reduce, all_gather = {}, {}
    for axis in every:
        reduce_times, gather_times = [], []
        for nbytes in (_SMALL, _LARGE):
            values = jax.device_put(np.ones((n * (nbytes // 4),), np.float32), split)
            reduce_times.append(_seconds(_collective(mesh, partial(jax.lax.psum, axis_name=axis)), values))
            gather_times.append(_seconds(_collective(mesh, partial(jax.lax.all_gather, axis_name=axis,
                                                                   tiled=True)), values))
        # all-gather: timed on shards of nbytes, its result is mesh.shape[axis] times larger
        all_reduce[axis] = _line(reduce_times, (_SMALL, _LARGE))
        all_gather[axis] = _line(gather_times, (_SMALL * mesh.shape[axis], _LARGE * mesh.shape[axis]))
    return DeviceCosts(flops, memory, all_reduce, all_gather)


def _collective(mesh: jax.sharding.Mesh, body):
    spec = PartitionSpec(tuple(mesh.axis_names))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


def _line(times: list[float], sizes: tuple[int, int]) -> Collective:
    per_byte = max((times[1] - times[0]) / (sizes[1] - sizes[0]), 1e-13)
    return Collective(max(times[0] - per_byte * sizes[0], 1e-7), per_byte)
