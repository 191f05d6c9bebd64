"""Shardy (``sdy``) annotations: the device mesh, per-argument shardings and sharding constraints.

This is the form jax 0.10 emits by default (``jax_use_shardy_partitioner`` is on) and the one XLA's
partitioner consumes: ``sdy.mesh @mesh = <["data"=2, "model"=4]>`` at module level, ``mhlo.num_partitions``
on the module, ``{sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}`` on ``@main``'s arguments and
``sdy.sharding_constraint`` on values inside. A *spec* has one entry per tensor dim: the tuple of mesh axes that
dim is split over (``()``: not split).
"""
from __future__ import annotations

import json
import math
from typing import Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

MESH_NAME = "mesh"
NUM_PARTITIONS_ATTR = "mhlo.num_partitions"
SHARDING_ATTR = "sdy.sharding"

Spec = tuple[tuple[str, ...], ...]


def num_devices(mesh: dict[str, int] | None) -> int:
    """How many devices ``mesh`` (axis name -> size) spans; 1 without a mesh."""
    return math.prod(mesh.values()) if mesh else 1


def mesh_text(mesh: dict[str, int]) -> str:
    axes = ", ".join(f"{json.dumps(name)}={size}" for name, size in mesh.items())
    return f"sdy.mesh @{MESH_NAME} = <[{axes}]>"


def sharding_text(spec: Spec) -> str:
    """``#sdy.sharding<@mesh, [{"data"}, {}]>``: each dim's axes closed (the partitioner splits it only so)."""
    dims = ", ".join("{" + ", ".join(json.dumps(axis) for axis in axes) + "}" for axes in spec)
    return f"#sdy.sharding<@{MESH_NAME}, [{dims}]>"


def sharding_attr(spec: Spec) -> ir.Attribute:
    return ir.Attribute.parse(sharding_text(spec))


def declare_mesh(module: ir.Module, mesh: dict[str, int]) -> None:
    """Put ``sdy.mesh @mesh`` first in ``module`` and its partition count on it (in its context)."""
    i32 = ir.IntegerType.get_signless(32)
    module.operation.attributes[NUM_PARTITIONS_ATTR] = ir.IntegerAttr.get(i32, num_devices(mesh))
    module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
    ir.InsertionPoint.at_block_begin(module.body).insert(ir.Operation.parse(mesh_text(mesh)))


def argument_attributes(specs: Sequence[Spec | None]) -> ir.ArrayAttr:
    """``@main``'s ``arg_attrs``: the sharding of each argument that has one (the others: left to propagation)."""
    return ir.ArrayAttr.get([ir.DictAttr.get({SHARDING_ATTR: sharding_attr(spec)} if spec is not None else {})
                             for spec in specs])


def replicated_results(types: Sequence[ir.Type]) -> ir.ArrayAttr:
    """``@main``'s ``res_attrs``: every result replicated, so each device ends with the whole of it (the program
    gathers it; the caller reads it from any one device)."""
    return ir.ArrayAttr.get([ir.DictAttr.get({SHARDING_ATTR: sharding_attr(((),) * ir.RankedTensorType(t).rank)})
                             for t in types])


def constrain(value: ir.Value, spec: Spec) -> ir.Value:
    """``value`` under ``sdy.sharding_constraint``: the partitioner lays it out as ``spec`` says."""
    return sdy.ShardingConstraintOp(value, sharding_attr(spec)).result


def normalize_spec(spec) -> Spec:
    """A user's spec (per dim: a mesh axis name, a tuple of them, or None) as a ``Spec``."""
    if isinstance(spec, str) or not isinstance(spec, Sequence):
        raise TypeError(f"a sharding spec is a tuple with one entry per tensor dim (an axis name, a tuple of "
                        f"axis names, or None), got {spec!r}")
    dims = []
    for entry in spec:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else \
            tuple(entry) if isinstance(entry, Sequence) else (entry,)
        if not all(isinstance(axis, str) for axis in axes):
            raise TypeError(f"sharding spec {spec!r}: each dim is a mesh axis name, a tuple of them, or None; "
                            f"got {entry!r}")
        dims.append(axes)
    return tuple(dims)


def spec_text(spec: Spec) -> str:
    """A spec as the user writes it: ``("data", None)``, ``(("data", "model"), None)``."""
    entries = ["None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(axes) for axes in spec]
    return "(" + ", ".join(entries) + ("," if len(entries) == 1 else "") + ")"
