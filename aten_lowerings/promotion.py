"""torch's dtype rules over MLIR values: result_type over values and numbers, the
dtype torch computes a low-precision float in, and the conversion (and rounding) every promotion ends in."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .values import dtype_of, rank, with_dtype


@lru_cache(maxsize=None)
def _probe(dtype: torch.dtype, zero_dim: bool) -> torch.Tensor:
    return torch.empty(() if zero_dim else (0,), dtype=dtype)


def _promotion_operand(operand, meta):
    if isinstance(operand, ir.Value):
        zero_dim = meta.dim() == 0 if meta is not None else rank(operand) == 0
        return _probe(dtype_of(operand), zero_dim)
    return operand


def promoted_dtype(*operands, metas: Sequence | None = None) -> torch.dtype:
    """torch's result_type over MLIR values (tensors) and Python numbers (scalars)."""
    metas = metas or [None] * len(operands)
    probes = [_promotion_operand(op, meta) for op, meta in zip(operands, metas)]
    result = probes[0]
    if len(probes) == 1:
        return result.dtype if isinstance(result, torch.Tensor) else torch.tensor(result).dtype
    dtype = torch.result_type(probes[0], probes[1])
    for probe in probes[2:]:
        dtype = torch.promote_types(dtype, probe.dtype) if isinstance(probe, torch.Tensor) \
            else torch.result_type(torch.empty((0,), dtype=dtype), probe)
    return dtype


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16 (torch computes and accumulates those in float32 on CPU), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def convert(value: ir.Value, dtype: torch.dtype) -> ir.Value:
    if dtype == torch.complex32:  # carried as complex64 (stablehlo_ir.dtypes): round its parts to float16 values
        value = convert(value, torch.complex64)
        real, imag = (round_to(part, torch.float16) for part in (stablehlo.real(value), stablehlo.imag(value)))
        return stablehlo.complex(real, imag)
    if dtype_of(value) == dtype:
        return value
    return stablehlo.convert(with_dtype(value, dtype), value)


def round_to(value: ir.Value, dtype: torch.dtype) -> ir.Value:
    """``value`` rounded to ``dtype`` and back to its own type: where torch stores an intermediate result in a
    narrower dtype than it computes in."""
    return convert(convert(value, dtype), dtype_of(value))
