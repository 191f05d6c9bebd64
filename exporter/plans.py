"""``auto_shardings`` and ``fsdp_shardings``: sharding plans made for a model, each a ``ShardingPlan`` (name ->
spec for every weight and input, as ``export_to_stablehlo(shardings=...)`` takes it)."""
from __future__ import annotations

from .autoshard.plan import ShardingPlan, fsdp_plan, search_plan
from .conversion.pipeline import prepared_program


def auto_shardings(model, args=(), kwargs=None, *, mesh, max_bytes_per_device=None, dynamic_shapes=None,
                   platform: str = "cpu") -> ShardingPlan:
    """The plan the search finds for ``model`` (an ``nn.Module`` or ``ExportedProgram``) over ``mesh``: the one
    whose estimated call time, priced with rates measured on the mesh's devices, is least, with the weights' and
    inputs' bytes per device at most ``max_bytes_per_device`` (``ShardingError`` if no plan fits). ``plan.cost``
    is the estimate in seconds; ``plan.constraints`` the activation layouts ``export_to_stablehlo`` adds when
    given the plan. Raises ``MeshError`` when the platform has fewer devices than the mesh."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return search_plan(program, signature, mesh, max_bytes_per_device, platform)


def fsdp_shardings(model, args=(), kwargs=None, *, axis: str = "fsdp", batch_axis: str | None = None,
                   mesh: dict[str, int] | None = None, dynamic_shapes=None) -> ShardingPlan:
    """PyTorch/XLA's FSDPv2 layout: each weight's largest dim split over ``axis`` (with ``mesh``, the largest
    that ``mesh[axis]`` divides; none: replicated), the inputs' batch (dim 0) over ``batch_axis``."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return fsdp_plan(program, signature, axis, batch_axis, mesh)
