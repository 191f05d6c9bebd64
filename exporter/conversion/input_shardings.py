"""The ``mesh`` and ``shardings`` given to ``export_to_stablehlo``: checked and resolved against the signature.

``mesh`` is an ordered mapping of axis name -> size (their product is the device count); ``shardings`` maps
signature input names and weight names (``fnmatch`` patterns allowed) to specs with one entry per tensor dim:
a mesh axis, a tuple of axes, or None. A tensor-parallel plan (``ColwiseParallel``/``RowwiseParallel`` per
module name, as ``parallelize_module`` takes) is translated to weight specs by ``tensor_parallel_shardings``.
Every mistake raises ``ShardingError`` naming the tensor and the axis before anything is lowered or compiled.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Mapping

import torch
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from torch_stablehlo.aten_lowerings import mark_sharding, spec_of  # noqa: F401  (mark_sharding: public here)
from torch_stablehlo.stablehlo_ir.shardy import Spec, normalize_spec, spec_text

from ..errors import ShardingError
from .signature import RNG_SEED, Signature


class TensorParallelShardings(dict):
    """Weight specs from a tensor-parallel plan; ``optional`` keys (biases) may match nothing."""

    def __init__(self, specs: dict, optional: set[str]):
        super().__init__(specs)
        self.optional = optional


def tensor_parallel_shardings(plan: Mapping[str, ParallelStyle], axis: str = "model") -> TensorParallelShardings:
    """Weight specs for a tensor-parallel plan (module name or pattern -> ``ColwiseParallel()`` or
    ``RowwiseParallel()``): an ``nn.Linear`` weight is [out, in], so colwise splits dim 0 of the weight and its
    bias over ``axis``, rowwise dim 1 of the weight (its bias is added after the sum: not split)."""
    specs, optional = {}, set()
    for module, style in plan.items():
        if isinstance(style, ColwiseParallel):
            specs[f"{module}.weight"] = (axis, None)
            specs[f"{module}.bias"] = (axis,)
            optional.add(f"{module}.bias")
        elif isinstance(style, RowwiseParallel):
            specs[f"{module}.weight"] = (None, axis)
        else:
            raise ShardingError(f"tensor-parallel plan: {module!r} has {type(style).__name__}; only "
                                "ColwiseParallel and RowwiseParallel (of nn.Linear) translate to weight shardings")
    return TensorParallelShardings(specs, optional)


def check_mesh(mesh) -> dict[str, int]:
    """``mesh`` as a plain dict, once every axis has a name and a positive size."""
    if not isinstance(mesh, Mapping) or not mesh:
        raise ShardingError(f"mesh must be a mapping of axis name -> size, such as {{'data': 2, 'model': 4}}; "
                            f"got {mesh!r}")
    for name, size in mesh.items():
        if not isinstance(name, str) or not isinstance(size, int) or size < 1:
            raise ShardingError(f"mesh axis {name!r}: expected a name with a positive int size, got {size!r}")
    return dict(mesh)


def shard_signature(signature: Signature, mesh, shardings, graph_module: torch.fx.GraphModule) -> Signature:
    """``signature`` over ``mesh`` with the specs of ``shardings`` on the slots they name; checks them and the
    ``mark_sharding`` specs in ``graph_module`` against the mesh and the tensors' shapes."""
    if mesh is None:  # one device (mark_sharding annotations are dropped)
        if shardings:
            raise ShardingError("shardings need a device mesh: pass mesh={'axis': size, ...} to export_to_stablehlo")
        return signature
    mesh = check_mesh(mesh)
    specs = _resolve(signature, mesh, _plain_shardings(shardings or {}, mesh))
    for node in [node for node in graph_module.graph.nodes if spec_of(node) is not None]:
        _check_spec(f"mark_sharding on {node.args[0].name}", spec_of(node), node.meta["val"].shape, mesh)
    inputs = [dataclasses.replace(s, sharding=specs[s.name]) if s.name in specs else s for s in signature.inputs]
    return dataclasses.replace(signature, inputs=inputs, mesh=dict(mesh))


def _plain_shardings(shardings, mesh: dict[str, int]) -> Mapping:
    """``shardings`` with a tensor-parallel plan's entries translated (over ``model``, or the mesh's one axis)."""
    if not any(isinstance(v, ParallelStyle) for v in shardings.values()):
        return shardings
    axis = "model" if "model" in mesh or len(mesh) != 1 else next(iter(mesh))
    plan = tensor_parallel_shardings({k: v for k, v in shardings.items() if isinstance(v, ParallelStyle)}, axis)
    plan.update({k: v for k, v in shardings.items() if not isinstance(v, ParallelStyle)})
    return plan


def _resolve(signature: Signature, mesh: dict[str, int], shardings: Mapping) -> dict[str, Spec]:
    """Slot name -> spec, each key matched by ``fnmatch`` against input and weight names."""
    slots = [s for s in signature.inputs if s.tensor is not None and s.kind != RNG_SEED]
    optional = getattr(shardings, "optional", set())
    specs: dict[str, Spec] = {}
    given_by: dict[str, str] = {}
    for key, value in shardings.items():
        matched = [s for s in slots if fnmatch.fnmatchcase(s.name, key)]
        if not matched and key not in optional:
            raise ShardingError(f"shardings key {key!r} matches no input or weight; names are e.g. "
                                f"{', '.join(s.name for s in slots[:6])}{', ...' if len(slots) > 6 else ''}")
        try:
            spec = normalize_spec(value)
        except TypeError as error:
            raise ShardingError(f"shardings[{key!r}]: {error}") from None
        for slot in matched:
            full = _check_spec(slot.name, spec, slot.tensor.shape, mesh)
            if slot.name in specs and specs[slot.name] != full:
                raise ShardingError(f"{slot.name} is given two shardings: {spec_text(specs[slot.name])} by "
                                    f"{given_by[slot.name]!r} and {spec_text(full)} by {key!r}")
            specs[slot.name], given_by[slot.name] = full, key
    return specs


def _check_spec(tensor: str, spec: Spec, shape, mesh: dict[str, int]) -> Spec:
    """``spec`` padded to the tensor's rank (trailing dims not split), once it fits ``shape`` and ``mesh``."""
    if len(spec) > len(shape):
        raise ShardingError(f"{tensor}: the spec {spec_text(spec)} has {len(spec)} entries but the tensor has "
                            f"{len(shape)} dims {list(shape)}; give at most one entry per dim")
    used = [axis for axes in spec for axis in axes]
    for axis in used:
        if axis not in mesh:
            raise ShardingError(f"{tensor}: the spec {spec_text(spec)} names axis {axis!r}, which the mesh "
                                f"{mesh} lacks; use one of {', '.join(map(repr, mesh))}")
        if used.count(axis) > 1:
            raise ShardingError(f"{tensor}: the spec {spec_text(spec)} splits along axis {axis!r} twice")
    for dim, (axes, size) in enumerate(zip(spec, shape)):
        parts = 1
        for axis in axes:
            parts *= mesh[axis]
        if isinstance(size, int) and size % parts:
            raise ShardingError(f"{tensor}: dim {dim} has size {size}, not divisible by {parts} (axes "
                                f"{', '.join(map(repr, axes))} of the mesh {mesh}); split a dim whose size is a "
                                f"multiple of {parts}, or leave dim {dim} unsplit (None)")
    return spec + ((),) * (len(shape) - len(spec))
