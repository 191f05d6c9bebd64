"""``!quant.uniform`` types for quantization schemes. Call inside a context from
``stablehlo_ir.mlir_context.make_context`` (which loads the quant dialect)."""
from __future__ import annotations

import torch
from jaxlib.mlir import ir

from .schemes import STORAGE_TYPES, QuantScheme


def quant_element_type(scheme: QuantScheme) -> ir.Type:
    """``!quant.uniform<i8<-127:127>:f32:0, {s0,s1}>``-style type; f32 is the expressed type."""
    info = torch.iinfo(scheme.storage)
    storage = STORAGE_TYPES[scheme.storage]
    if (scheme.qmin, scheme.qmax) != (info.min, info.max):
        storage += f"<{scheme.qmin}:{scheme.qmax}>"
    # 17 significant digits keep the double exactly; MLIR wants the '.' that repr may leave out (1e-05)
    params = [f"{scale:.16e}:{zero_point}" for scale, zero_point in zip(scheme.scales, scheme.zero_points)]
    if scheme.axis is None:
        return ir.Type.parse(f"!quant.uniform<{storage}:f32, {params[0]}>")
    return ir.Type.parse(f"!quant.uniform<{storage}:f32:{scheme.axis}, {{{','.join(params)}}}>")


def quant_tensor_type(shape, scheme: QuantScheme) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), quant_element_type(scheme))


def accumulator_scheme(lhs: QuantScheme, rhs: QuantScheme, axis: int | None) -> QuantScheme:
    """The exact int32 product of a quantized ``lhs`` (per-tensor) and ``rhs``: scale lhs * rhs per channel
    (on ``axis`` of the product when ``rhs`` is per-axis), zero point 0."""
    info = torch.iinfo(torch.int32)
    scales = tuple(lhs.scales[0] * scale for scale in rhs.scales)
    return QuantScheme(torch.int32, info.min, info.max, scales, (0,) * len(scales),
                       axis if rhs.axis is not None else None)

