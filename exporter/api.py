"""``export_to_stablehlo``: torch model or ExportedProgram -> StableHLOArtifact."""
from __future__ import annotations

from .formats.artifact import StableHLOArtifact
from .conversion.pipeline import convert


def export_to_stablehlo(model, args=(), kwargs=None, *, dynamic_shapes=None, platform: str = "cpu",
                        quantized_ops: str = "fused", mesh=None, shardings=None) -> StableHLOArtifact:
    """Convert ``model`` (an ``nn.Module``, exported here, or an ``ExportedProgram``) to StableHLO.

    Parameters, buffers and lifted constants become leading arguments of
    ``@main``; the artifact keeps their values and passes them on each call.
    Quantized programs (pt2e, torchao weight-only int8) use ``!quant.uniform`` types; ``quantized_ops``
    is ``"fused"`` (products on quantized operands, the form serving compilers take) or ``"unfused"``
    (every dequantize and quantize kept).

    ``mesh`` (axis name -> size, e.g. ``{"data": 2, "model": 4}``) makes ``@main`` an SPMD program over that
    many devices; ``shardings`` maps input and weight names (``fnmatch`` patterns) to specs, one entry per dim:
    a mesh axis, a tuple of axes, or None (see ``exporter.conversion.sharding``; a tensor-parallel plan works too).
    """
    conversion = convert(model, args, kwargs, dynamic_shapes=dynamic_shapes, quantized_ops=quantized_ops, mesh=mesh,
                         shardings=shardings)
    text = conversion.lower(platform=platform).operation.get_asm(enable_debug_info=True)
    return StableHLOArtifact(text, conversion.signature, conversion.weights, platform=platform)
