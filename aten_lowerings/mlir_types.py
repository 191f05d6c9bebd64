"""The one place where torch dtypes meet MLIR types, both ways: ``element_type`` and ``torch_dtype`` read the one
table, ``stablehlo_ir.dtypes.ELEMENT_TYPES`` (a carried dtype, complex32, is its carrier's type, and that type
reads back as the carrier); and torch sizes as MLIR dims and tensor types.

Every function here must be called inside an active ``ir.Context``.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir

from torch_stablehlo.stablehlo_ir.dtypes import CARRIED, ELEMENT_TYPES

_DTYPES_BY_TYPE = {text: dtype for dtype, text in ELEMENT_TYPES.items() if dtype not in CARRIED}
_DTYPES_BY_FLOAT_CLASS: dict[type, torch.dtype] = {}
"""The float types' classes (one type each: ``F32Type``, ...), learned on first read, so a float type is read
again without printing it."""

DYNAMIC = ir.ShapedType.get_dynamic_size()


def element_type(dtype: torch.dtype) -> ir.Type:
    """MLIR element type for a torch dtype (signless ints, ``ui*`` for unsigned, ``i1`` for bool)."""
    text = ELEMENT_TYPES.get(dtype)
    if text is None:
        raise TypeError(f"torch dtype {dtype} has no StableHLO element type")
    return ir.Type.parse(text)


def torch_dtype(element: ir.Type) -> torch.dtype:
    """The torch dtype of an MLIR element type (``element_type`` read backwards)."""
    dtype = _DTYPES_BY_FLOAT_CLASS.get(type(element))  # the common case, without printing the type
    if dtype is not None:
        return dtype
    dtype = _DTYPES_BY_TYPE.get(str(element))
    if dtype is None:
        raise TypeError(f"no torch dtype for MLIR element type {element}")
    if isinstance(element, ir.FloatType) and type(element) is not ir.FloatType:
        _DTYPES_BY_FLOAT_CLASS[type(element)] = dtype
    return dtype


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
    return ELEMENT_TYPES.get(dtype, "").startswith("ui")
