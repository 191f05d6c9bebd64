"""``auto_shardings`` and ``fsdp_shardings``: sharding plans made for a model, each a ``ShardingPlan`` (name ->
spec for every weight and input, as ``export_to_stablehlo(shardings=...)`` takes it); ``step_layouts``: a
decode step's plan as the other steps of a generate program take it."""
from __future__ import annotations

from typing import NamedTuple

import torch.utils._pytree as pytree

from torch_stablehlo.exported_program import CONSTANT
from torch_stablehlo.stablehlo_ir.shardy import Spec

from .autoshard.choose import search_plan
from .autoshard.plan import ShardingPlan, fsdp_plan
from .conversion.pipeline import prepared_program
from .formats.artifact import StableHLOArtifact


def auto_shardings(model, args=(), kwargs=None, *, mesh, max_bytes_per_device=None, dynamic_shapes=None,
                   platform: str = "cpu", timed: bool = True, loop_carried: int = 0) -> ShardingPlan:
    """The plan the search finds for ``model`` (an ``nn.Module`` or ``ExportedProgram``) over ``mesh``, with the
    weights' and inputs' bytes per device at most ``max_bytes_per_device`` (``ShardingError`` if no plan fits):
    the integer program's optimum under rates measured on the mesh's devices, and with ``timed`` (the default)
    the fastest on the mesh of that and the other candidates (``exporter.autoshard.choose``; ``plan.timings``
    has each candidate's seconds). ``plan.cost``: its seconds as judged; ``plan.constraints`` the activation
    layouts ``export_to_stablehlo`` adds when given the plan. Raises ``MeshError`` when the platform has fewer
    devices than the mesh. ``loop_carried``: the model's first that many results are its first inputs at the
    next call (a loop's step, such as a decode step's cache): the search keeps them laid out as the inputs are,
    where other results are gathered whole."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return search_plan(program, signature, mesh, max_bytes_per_device, platform, timed, loop_carried)


def fsdp_shardings(model, args=(), kwargs=None, *, axis: str = "fsdp", batch_axis: str | None = None,
                   mesh: dict[str, int] | None = None, dynamic_shapes=None) -> ShardingPlan:
    """PyTorch/XLA's FSDPv2 layout: each weight's largest dim split over ``axis`` (with ``mesh``, the largest
    that ``mesh[axis]`` divides; none: replicated), the inputs' batch (dim 0) over ``batch_axis``."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return fsdp_plan(program, signature, axis, batch_axis, mesh)


class StepLayouts(NamedTuple):
    """A decode step's plan (the step exported over a mesh) as the generate program's other steps take it."""
    weights: dict[str, Spec]   # the parameters' and buffers' specs, by name (lifted constants are each step's own;
    #                            those not given are left to propagation)
    inputs: tuple              # the step's inputs as it takes them (its example's structure), a spec (or None) per
    #                            tensor


def step_layouts(step: StableHLOArtifact, example: tuple) -> StepLayouts:
    """How ``step`` (exported from ``example``, its positional inputs, over a mesh) takes its weights and inputs:
    the shardings given or searched (``shardings="auto"``), read from its signature."""
    weights = {s.name: s.sharding for s in step.signature.weights if s.kind != CONSTANT and s.sharding is not None}
    specs = [s.sharding for s in step.signature.user_inputs]
    return StepLayouts(weights, pytree.tree_unflatten(specs, pytree.tree_structure(tuple(example))))
