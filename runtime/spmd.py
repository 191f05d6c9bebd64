"""SPMD over a device mesh: the devices, the compile options, inputs split onto the devices, results gathered.

A mesh is an ordered ``{axis: size}``; a spec has one entry per dim, the tuple of axes that dim is split over
(None for a whole argument: replicated). Arguments are placed as the compiled program lays them out (the
module's shardings, and XLA's propagated choice for arguments the module leaves open); results are
replicated on every device (``@main`` says so: the program gathers them), so each process reads them from its
own first device. With ``jax.distributed`` initialised, the client's devices are every process's; each
process places and holds only the shards of its own devices.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import numpy as np
from jax._src.lib import xla_client
from jax._src.op_shardings import get_num_ways_dim_sharded
from jax._src.sharding_impls import GSPMDSharding  # jax's own form of a compiled program's layouts
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from jaxlib import _jax

MeshAxes = dict[str, int]


class MeshError(RuntimeError):
    """The mesh needs more devices than the PJRT client has."""


def device_mesh(client, axes: MeshAxes) -> Mesh:
    """The first ``prod(axes)`` devices of ``client`` (every process's) laid out as ``axes``."""
    count = math.prod(axes.values())
    devices = sorted(client.devices(), key=lambda d: d.id)
    if len(devices) < count:
        hint = (f"on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={count} or "
                f"jax.config.update('jax_num_cpu_devices', {count}) before the first client starts"
                if client.platform == "cpu" else "run where that many devices are visible")
        raise MeshError(f"the mesh {axes} needs {count} devices; the '{client.platform}' client has "
                        f"{len(devices)} ({hint})")
    return Mesh(np.array(devices[:count]).reshape(tuple(axes.values())), tuple(axes),
                axis_types=(AxisType.Auto,) * len(axes))


def sharding(mesh: Mesh, spec) -> NamedSharding:
    """The layout of one argument: split as ``spec`` says, replicated where ``spec`` is None."""
    return NamedSharding(mesh, PartitionSpec() if spec is None else PartitionSpec(*[tuple(a) or None for a in spec]))


def compile_options(options, mesh: Mesh):
    """``options`` for SPMD over ``mesh``: one partition per device (in the mesh's order), Shardy's partitioner."""
    options.num_replicas = 1
    options.num_partitions = mesh.size
    build = options.executable_build_options
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True
    # one replica of N partitions: the array is [replicas, partitions] (its transpose made N replicas of one
    # partition, and XLA then partitioned products without their all-reduces: wrong numbers)
    options.device_assignment = _jax.DeviceAssignment.create(np.array([[d.id for d in mesh.devices.flat]]))
    return options


def parameter_layouts(loaded, mesh: Mesh) -> list[GSPMDSharding]:
    """How the compiled SPMD program takes each argument (a one-device mesh's program reports none: whole)."""
    shardings = loaded.get_parameter_shardings()
    if shardings is None:
        return [SingleDeviceSharding(mesh.devices.flat[0])] * len(loaded.get_parameter_layouts())
    return [GSPMDSharding(tuple(mesh.devices.flat), s) for s in shardings]


def place(shape: Sequence[int], layout: jax.sharding.Sharding, read: Callable[[tuple], np.ndarray]) -> jax.Array:
    """A global array of ``shape`` laid out as ``layout``; ``read(index)`` gives the host data of one shard
    (a tuple of slices), called once per distinct shard of this process's devices."""
    parts: dict[tuple, np.ndarray] = {}

    def read_once(index: tuple) -> np.ndarray:
        key = tuple((part.start, part.stop, part.step) for part in index)
        if key not in parts:
            parts[key] = read(index)
        return parts[key]

    with jax.enable_x64(True):
        return jax.make_array_from_callback(tuple(shape), layout, read_once)


def execute(loaded, arguments: Sequence[jax.Array]) -> list[jax.Array]:
    """Run an SPMD executable; each result from this process's first device (results are replicated). Returns
    once every local device has finished: a process that went on (or exited) while its other devices were still in
    a collective would leave the other processes waiting for them."""
    results = loaded.execute_sharded(list(arguments)).disassemble_into_single_device_arrays()
    for shards in results:
        for shard in shards:
            shard.block_until_ready()
    return [shards[0] for shards in results]


def execute_laid_out(loaded, mesh: Mesh, arguments: Sequence[jax.Array]) -> list[jax.Array]:
    """Run an SPMD executable; its results as global arrays laid out as the program returns them (each device
    keeping its shard), for a caller that passes them on to the next call (an engine's decode state) rather than
    reading them."""
    results = loaded.execute_sharded(list(arguments)).disassemble_into_single_device_arrays()
    arrays = []
    with jax.enable_x64(True):
        for shards, given in zip(results, loaded.get_output_shardings()):
            layout = xla_client.HloSharding.from_proto(given)
            ways = get_num_ways_dim_sharded(layout)[0] or [1] * shards[0].ndim
            shape = tuple(size * split for size, split in zip(shards[0].shape, ways))
            arrays.append(jax.make_array_from_single_device_arrays(
                shape, GSPMDSharding(tuple(mesh.devices.flat), layout), shards))
    return arrays
