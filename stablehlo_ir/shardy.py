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


def shard_main(module: ir.Module, main, mesh: dict[str, int], specs: Sequence[Spec | None],
               result_specs: Sequence[Spec] | None = None) -> None:
    """Make ``module`` SPMD over ``mesh``, as a lowered ``@main`` is: the mesh declared (where it is not yet),
    ``main``'s arguments split as ``specs`` say (None: left to propagation), its results as ``result_specs`` say
    (each with an entry per dim; left out: replicated); the other argument and result attributes kept (a
    donation's ``tf.aliasing_output``)."""
    if not any(op.operation.name == "sdy.mesh" for op in module.body.operations):
        declare_mesh(module, mesh)
    results = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results
    if result_specs is None:
        result_specs = [((),) * ir.RankedTensorType(t).rank for t in results]
    main.attributes["arg_attrs"] = _with_shardings(main, "arg_attrs", specs)
    main.attributes["res_attrs"] = _with_shardings(main, "res_attrs", result_specs)


def _with_shardings(main, name: str, specs: Sequence[Spec | None]) -> ir.ArrayAttr:
    """``main``'s ``name`` attributes (``arg_attrs`` or ``res_attrs``) with each entry's sharding set from ``specs``
    (None: none), its other attributes kept."""
    old = [ir.DictAttr(a) for a in ir.ArrayAttr(main.attributes[name])] if name in main.attributes else \
        [None] * len(specs)
    return ir.ArrayAttr.get([ir.DictAttr.get({**({n.name: n.attr for n in entries if n.name != SHARDING_ATTR}
                                                  if entries is not None else {}),
                                               **({SHARDING_ATTR: sharding_attr(spec)} if spec is not None else {})})
                             for entries, spec in zip(old, specs)])


def as_callee(module: ir.Module) -> None:
    """``module`` (over a mesh, parsed to have its functions moved into another module) without its mesh and
    without shardings at its functions' boundaries: the module that calls them declares the mesh; each argument's
    static sharding becomes a constraint at the function's entry (what the caller passes is laid out as the
    function was partitioned to take it; a dynamic one's is left to the caller's), and its results' go (a
    ``@main``'s replicated results would gather them at every call: what flows out takes the layout its producer
    gives it)."""
    for op in list(module.body.operations):
        if op.operation.name == "sdy.mesh":
            op.operation.erase()
            continue
        if "arg_attrs" in op.attributes:
            block = op.regions[0].blocks[0]
            attrs = [ir.DictAttr(a) for a in ir.ArrayAttr(op.attributes["arg_attrs"])]
            for argument, entries in zip(block.arguments, attrs):
                if SHARDING_ATTR in entries and list(argument.uses) and \
                        ir.RankedTensorType(argument.type).has_static_shape:  # (shape refinement keeps no constraint)
                    with ir.InsertionPoint.at_block_begin(block), argument.location:
                        held = sdy.ShardingConstraintOp(argument, entries[SHARDING_ATTR])
                    argument.replace_all_uses_except(held.result, held.operation)
            op.attributes["arg_attrs"] = _without_shardings(attrs)
        if "res_attrs" in op.attributes:
            op.attributes["res_attrs"] = _without_shardings(ir.ArrayAttr(op.attributes["res_attrs"]))


def _without_shardings(attrs) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DictAttr.get({n.name: n.attr for n in ir.DictAttr(a) if n.name != SHARDING_ATTR})
                             for a in attrs])


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
