"""Constants from Python numbers and numpy arrays: 0-d and static splats, dense tables, and fills of torch sizes
(static or symbolic)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .context import LoweringContext
from .mlir_types import element_type
from .shapes import broadcast_in_dim


def _check_concrete(number) -> None:
    """Refuse a symbolic number (SymInt, SymFloat, SymBool) where a constant is needed: casting it would
    specialise its symbol in the program's own shape environment (its guards and every later use would see one
    value) and bake that one value into the module."""
    if isinstance(number, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise NotImplementedError(f"the symbolic value {number} where a constant is needed (a rule takes it as a "
                                  "value: ctx.dims.size)")


def _scalar_attr(number, dtype: torch.dtype) -> ir.Attribute:
    _check_concrete(number)
    mlir_type = element_type(dtype)
    if dtype.is_floating_point:
        return ir.FloatAttr.get(mlir_type, float(number))
    if dtype == torch.bool:
        return ir.IntegerAttr.get(mlir_type, int(bool(number)))
    return ir.IntegerAttr.get(mlir_type, int(number))


def constant(number, dtype: torch.dtype, shape: Sequence[int] = ()) -> ir.Value:
    """A splat constant of a Python number with a static shape (default: 0-d)."""
    if dtype.is_complex:  # MLIR has no complex scalar attribute to splat: build the (tiny) dense array
        array = np.full(list(shape), complex(number), dtype=np.complex128 if dtype == torch.complex128 else np.complex64)
        return array_constant(array, dtype)
    result_type = ir.RankedTensorType.get(list(shape), element_type(dtype))
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(result_type, _scalar_attr(number, dtype)))


def array_constant(array: np.ndarray, dtype: torch.dtype) -> ir.Value:
    """A dense constant from a numpy array (ints, floats, complex; used for small index tables)."""
    result_type = ir.RankedTensorType.get(list(array.shape), element_type(dtype))
    return stablehlo.constant(ir.DenseElementsAttr.get(np.ascontiguousarray(array), type=result_type))


def scalar_to_dtype(number, dtype: torch.dtype):
    """Python number cast the way torch casts a scalar operand (bool/int/float)."""
    _check_concrete(number)
    if dtype == torch.bool:
        return bool(number)
    if not dtype.is_floating_point and not dtype.is_complex:
        return int(number)
    return float(number)


def full_like(ctx: LoweringContext, sizes, fill, dtype: torch.dtype) -> ir.Value:
    """A tensor of torch sizes filled with a Python number."""
    return broadcast_in_dim(ctx, constant(scalar_to_dtype(fill, dtype), dtype), sizes, [])
