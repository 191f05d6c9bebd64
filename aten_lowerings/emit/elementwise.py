"""Elementwise building blocks: operands promoted and broadcast to a shape, rules made from formulas (computed in
the output's compute dtype, rounded once; rule modules register them with ``lower``), compares, number splats,
Python's floor division, a float's bits and sign bit."""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..context import LoweringContext
from ..mlir_types import is_unsigned
from ..promotion import compute_dtype, convert, promoted_dtype
from ..shapes import broadcast_to
from ..values import dtype_of, with_dtype


def compare(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """``stablehlo.compare`` of two same-typed values; ``direction`` is EQ, NE, LT, LE, GT or GE."""
    dtype = dtype_of(lhs)
    kind = "FLOAT" if dtype.is_floating_point else \
        "UNSIGNED" if dtype == torch.bool or is_unsigned(dtype) else "SIGNED"
    return stablehlo.compare(lhs, rhs, stablehlo.ComparisonDirectionAttr.get(direction),
                             compare_type=stablehlo.ComparisonTypeAttr.get(kind))


def as_tensor(ctx: LoweringContext, operand, dtype: torch.dtype, sizes) -> ir.Value:
    """An elementwise operand as a value of ``dtype`` broadcast to ``sizes`` (numbers become splats)."""
    if isinstance(operand, ir.Value):
        return broadcast_to(ctx, convert(operand, dtype), sizes)
    return full_like(ctx, sizes, operand, dtype)


def elementwise_operands(ctx: LoweringContext, *operands, dtype: torch.dtype | None = None) -> list[ir.Value]:
    """Operands promoted (torch rules unless ``dtype`` is given) and broadcast to the node's output shape."""
    if dtype is None:
        dtype = promoted_dtype(*operands, metas=[ctx.arg_meta(i) if i < len(ctx.node.args) else None
                                                  for i in range(len(operands))])
    return [as_tensor(ctx, operand, dtype, ctx.out_shape) for operand in operands]


def scalar(ctx, number, like):
    """``number`` as a tensor of the node's output shape and ``like``'s dtype."""
    return full_like(ctx, ctx.out_shape, number, dtype_of(like))


def elementwise(formula, operand_dtype=None):
    """The rule applying ``formula(ctx, *values)`` to the operands promoted to ``operand_dtype`` (default: the
    output's compute dtype) and broadcast to the output; the result is converted to the output dtype."""

    def rule(ctx, *operands):
        values = elementwise_operands(ctx, *operands, dtype=operand_dtype or compute_dtype(ctx.out_dtype))
        return convert(formula(ctx, *values), ctx.out_dtype)

    return rule


def elementwise_op(op, operand_dtype=None):
    """``elementwise`` of a function of the values alone, such as a StableHLO op."""
    return elementwise(lambda ctx, *values: op(*values), operand_dtype)


def sign_differs(ctx, remainder, divisor):
    """Where a truncated division's remainder is nonzero and its sign differs from the divisor's."""
    zero = scalar(ctx, 0, remainder)
    return stablehlo.and_(compare(remainder, zero, "NE"),
                          compare(compare(remainder, zero, "LT"), compare(divisor, zero, "LT"), "NE"))


def floor_quotient(ctx, a, b):
    """Python's floor division; for floats torch's algorithm (via fmod, exact where floor(a / b) is not)."""
    mod, one = stablehlo.remainder(a, b), scalar(ctx, 1, a)
    if not dtype_of(a).is_floating_point:
        quotient = stablehlo.divide(a, b)
        return stablehlo.select(sign_differs(ctx, mod, b), stablehlo.subtract(quotient, one), quotient)
    div = stablehlo.divide(stablehlo.subtract(a, mod), b)
    div = stablehlo.select(sign_differs(ctx, mod, b), stablehlo.subtract(div, one), div)
    floor = stablehlo.floor(div)
    floor = stablehlo.select(compare(stablehlo.subtract(div, floor), scalar(ctx, 0.5, a), "GT"),
                             stablehlo.add(floor, one), floor)
    quotient = stablehlo.divide(a, b)
    zero = scalar(ctx, 0, a)
    signed_zero = stablehlo.multiply(quotient, zero)
    floor = stablehlo.select(compare(div, zero, "EQ"), signed_zero, floor)
    return stablehlo.select(compare(b, zero, "EQ"), quotient, floor)


_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
"""The signed integer type of each float's width, to read and write its bits."""


def float_bits(x):
    """A float's bits as the signed integer of its width."""
    return stablehlo.bitcast_convert(with_dtype(x, _BITS[dtype_of(x)]), x)


def signbit_values(ctx, x):
    """The sign bit of a float (set for -0.0 and negative NaNs), x < 0 otherwise."""
    if not dtype_of(x).is_floating_point:
        return compare(x, scalar(ctx, 0, x), "LT")
    bits = float_bits(x)
    return compare(bits, scalar(ctx, 0, bits), "LT")
