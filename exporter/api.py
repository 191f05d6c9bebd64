"""``export_to_stablehlo``: torch model or ExportedProgram -> StableHLOArtifact."""
from __future__ import annotations

from typing import Sequence

from torch_stablehlo.stablehlo_ir.platforms import PLATFORMS

from .formats.artifact import StableHLOArtifact
from .conversion.pipeline import convert


def export_to_stablehlo(model, args=(), kwargs=None, *, dynamic_shapes=None, platform: str | None = None,
                        platforms: Sequence[str] | None = None, quantized_ops: str = "fused", mesh=None,
                        shardings=None) -> StableHLOArtifact:
    """Convert ``model`` (an ``nn.Module``, exported here, or an ``ExportedProgram``) to StableHLO.

    Parameters, buffers and lifted constants become leading arguments of
    ``@main``; the artifact keeps their values and passes them on each call.
    Quantized programs (pt2e, torchao weight-only int8) use ``!quant.uniform`` types; ``quantized_ops``
    is ``"fused"`` (products on quantized operands, the form serving compilers take) or ``"unfused"``
    (every dequantize and quantize kept).

    ``platform`` (default ``"cpu"``) is the one the module is lowered for and the artifact runs on;
    ``platforms=("cpu", "cuda")`` lowers one module for several, as ``jax.export`` does: ``@main`` takes the
    platform index first, and a ``stablehlo.case`` on it picks each platform's code where the lowerings differ
    (see ``stablehlo_ir.platforms``); the artifact runs on CPU where it is among them, else on the first.

    ``mesh`` (axis name -> size, e.g. ``{"data": 2, "model": 4}``) makes ``@main`` an SPMD program over that
    many devices; ``shardings`` maps input and weight names (``fnmatch`` patterns) to specs, one entry per dim:
    a mesh axis, a tuple of axes, or None (see ``conversion.input_shardings``; a tensor-parallel plan works too);
    ``shardings="auto"`` searches a plan over the mesh (``exporter.auto_shardings``), kept as ``art.sharding_plan``.
    """
    if platform is not None and platforms is not None:
        raise ValueError(f"export_to_stablehlo takes platform= (one) or platforms= (several), not both: got "
                         f"platform={platform!r} and platforms={platforms!r}")
    platforms = checked_platforms((platform or "cpu",) if platforms is None else platforms)
    conversion = convert(model, args, kwargs, dynamic_shapes=dynamic_shapes, quantized_ops=quantized_ops, mesh=mesh,
                         shardings=shardings, platforms=platforms)
    text = conversion.lower().operation.get_asm(enable_debug_info=True)
    runs_on = "cpu" if "cpu" in platforms else platforms[0]
    return StableHLOArtifact(text, conversion.signature, conversion.weights, platform=runs_on,
                             sharding_plan=conversion.plan)


def checked_platforms(platforms) -> list[str]:
    """``platforms`` (JAX's names, ``PLATFORMS``, each once) as a list; raises ValueError naming a bad one."""
    if isinstance(platforms, str) or not platforms or not all(isinstance(p, str) for p in platforms):
        raise ValueError(f"platforms: expected a non-empty sequence of platform names such as ('cpu', 'cuda'), "
                         f"got {platforms!r}")
    unknown = [p for p in platforms if p not in PLATFORMS]
    if unknown or len(set(platforms)) != len(platforms):
        problem = f"unknown {', '.join(map(repr, unknown))}" if unknown else "a platform named twice"
        raise ValueError(f"platforms={tuple(platforms)!r}: {problem}; each is one of {PLATFORMS}, once")
    return list(platforms)
