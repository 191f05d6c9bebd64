"""``auto_shardings`` and ``fsdp_shardings``: sharding plans made for a model, each a ``ShardingPlan`` (name ->
spec for every weight and input, as ``export_to_stablehlo(shardings=...)`` takes it)."""
from __future__ import annotations

from .autoshard.choose import search_plan
from .autoshard.plan import ShardingPlan, fsdp_plan
from .conversion.pipeline import prepared_program


def auto_shardings(model, args=(), kwargs=None, *, mesh, max_bytes_per_device=None, dynamic_shapes=None,
                   platform: str = "cpu", timed: bool = True) -> ShardingPlan:
    """The plan the search finds for ``model`` (an ``nn.Module`` or ``ExportedProgram``) over ``mesh``, with the
    weights' and inputs' bytes per device at most ``max_bytes_per_device`` (``ShardingError`` if no plan fits):
    the integer program's optimum under rates measured on the mesh's devices, and with ``timed`` (the default)
    the fastest on the mesh of that and the other candidates (``exporter.autoshard.choose``; ``plan.timings``
    has each candidate's seconds). ``plan.cost``: its seconds as judged; ``plan.constraints`` the activation
    layouts ``export_to_stablehlo`` adds when given the plan. Raises ``MeshError`` when the platform has fewer
    devices than the mesh."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return search_plan(program, signature, mesh, max_bytes_per_device, platform, timed)


def fsdp_shardings(model, args=(), kwargs=None, *, axis: str = "fsdp", batch_axis: str | None = None,
                   mesh: dict[str, int] | None = None, dynamic_shapes=None) -> ShardingPlan:
    """PyTorch/XLA's FSDPv2 layout: each weight's largest dim split over ``axis`` (with ``mesh``, the largest
    that ``mesh[axis]`` divides; none: replicated), the inputs' batch (dim 0) over ``batch_axis``."""
    program, signature = prepared_program(model, args, kwargs, dynamic_shapes)
    return fsdp_plan(program, signature, axis, batch_axis, mesh)
