"""The one place where torch dtypes meet MLIR types.

Every function here must be called inside an active ``ir.Context``.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir

_FLOAT_TYPES = {
    torch.float32: ir.F32Type.get,
    torch.float64: ir.F64Type.get,
    torch.float16: ir.F16Type.get,
    torch.bfloat16: ir.BF16Type.get,
}
_SIGNED_INT_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
_UNSIGNED_INT_BITS = {torch.uint8: 8, torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}
_COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float32}
"""StableHLO has no complex type with float16 parts: complex32 is carried as complex64 whose parts hold float16
values (``helpers.convert`` rounds them; the runtime casts at the boundary, ``stablehlo_ir.dtypes``)."""

DYNAMIC = ir.ShapedType.get_dynamic_size()


def element_type(dtype: torch.dtype) -> ir.Type:
    """MLIR element type for a torch dtype (signless ints, ``ui*`` for unsigned, ``i1`` for bool)."""
    if dtype in _FLOAT_TYPES:
        return _FLOAT_TYPES[dtype]()
    if dtype in _SIGNED_INT_BITS:
        return ir.IntegerType.get_signless(_SIGNED_INT_BITS[dtype])
    if dtype in _UNSIGNED_INT_BITS:
        return ir.IntegerType.get_unsigned(_UNSIGNED_INT_BITS[dtype])
    if dtype == torch.bool:
        return ir.IntegerType.get_signless(1)
    if dtype in _COMPLEX_PARTS:
        return ir.ComplexType.get(element_type(_COMPLEX_PARTS[dtype]))
    raise TypeError(f"torch dtype {dtype} has no StableHLO element type")


def static_or_dynamic(dim) -> int:
    """A torch size entry as an MLIR dim: ints stay, symbolic sizes become ``?``."""
    if isinstance(dim, int):
        return dim
    pinned = dim.node.maybe_as_int()  # a SymInt the shape env has pinned to one value
    return DYNAMIC if pinned is None else pinned


def mlir_shape(shape) -> list[int]:
    return [static_or_dynamic(d) for d in shape]


def tensor_type(shape, dtype: torch.dtype) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(mlir_shape(shape), element_type(dtype))


def is_unsigned(dtype: torch.dtype) -> bool:
    return dtype in _UNSIGNED_INT_BITS
