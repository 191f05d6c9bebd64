"""Elementwise functions beyond plain arithmetic: fmax/fmin, hypot, shifts, copysign/signbit, gcd/lcm,
nextafter, frexp, angle.

Rules use elementwise.py's n-ary helpers: operands promoted with torch's rules and broadcast to the node's
output; the bit-level ones (nextafter, frexp, signbit) read a float's bits through ``bitcast_convert``.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import stablehlo

from .elementwise import elementwise_rule, elementwise_formula, register_elementwise, scalar
from .helpers import (compare, compute_dtype, convert, dtype_of, full_like, reduce, static_shape, value_type,
                      while_loop, with_dtype)
from .mlir_types import is_unsigned
from .registry import lower

aten = torch.ops.aten

_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
"""The signed integer type of each float's width, to read and write its bits."""


def _bits(x):
    return stablehlo.bitcast_convert(with_dtype(x, _BITS[dtype_of(x)]), x)


def _from_bits(bits, like):
    return stablehlo.bitcast_convert(value_type(like), bits)


def _isnan(x):
    return compare(x, x, "NE")


def _nan_ignoring(op):
    """fmax/fmin: ``op`` where a float operand is NaN returns the other one."""

    def apply(a, b):
        result = op(a, b)
        if not dtype_of(a).is_floating_point:
            return result
        return stablehlo.select(_isnan(a), b, stablehlo.select(_isnan(b), a, result))

    return apply


register_elementwise(_nan_ignoring(stablehlo.maximum), aten.fmax.default)
register_elementwise(_nan_ignoring(stablehlo.minimum), aten.fmin.default)


@elementwise_formula(aten.hypot.default)
def hypot(ctx, a, b):
    return stablehlo.sqrt(stablehlo.add(stablehlo.multiply(a, a), stablehlo.multiply(b, b)))


# -- shifts: StableHLO's shifts already give torch's results for shifts < 0 or >= the bit width ----------

register_elementwise(stablehlo.shift_left, aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
register_elementwise(lambda a, b: (stablehlo.shift_right_logical if is_unsigned(dtype_of(a)) else
                        stablehlo.shift_right_arithmetic)(a, b),
          aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)


# -- sign bits -------------------------------------------------------------------------------------------

def signbit_values(ctx, x):
    """The sign bit of a float (set for -0.0 and negative NaNs), x < 0 otherwise."""
    if not dtype_of(x).is_floating_point:
        return compare(x, scalar(ctx, 0, x), "LT")
    bits = _bits(x)
    return compare(bits, scalar(ctx, 0, bits), "LT")


@lower(aten.signbit.default)
def signbit(ctx, x):
    return signbit_values(ctx, x)


@elementwise_formula(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(ctx, a, b):
    magnitude = stablehlo.abs(a)
    return stablehlo.select(signbit_values(ctx, b), stablehlo.negate(magnitude), magnitude)


@elementwise_formula(aten.angle.default)
def angle(ctx, x):
    """Of a real tensor: pi where negative, 0 elsewhere, NaN where NaN."""
    half_turn = stablehlo.select(compare(x, scalar(ctx, 0, x), "LT"), scalar(ctx, math.pi, x), scalar(ctx, 0, x))
    return stablehlo.select(_isnan(x), x, half_turn)


# -- gcd / lcm -------------------------------------------------------------------------------------------

def gcd_values(ctx, a, b):
    """Euclid's algorithm on |a|, |b|, elementwise, until every remainder is 0."""
    zero = scalar(ctx, 0, a)

    def any_left(x, y):
        left = compare(y, zero, "NE")
        return reduce(ctx, left, range(len(static_shape(left))), False, stablehlo.or_)

    def step(x, y):
        left = compare(y, zero, "NE")
        safe = stablehlo.select(left, y, scalar(ctx, 1, y))
        return [stablehlo.select(left, y, x), stablehlo.select(left, stablehlo.remainder(x, safe), zero)]

    return while_loop([stablehlo.abs(a), stablehlo.abs(b)], any_left, step)[0]


elementwise_formula(aten.gcd.default)(gcd_values)


@elementwise_formula(aten.lcm.default)
def lcm(ctx, a, b):
    """|a / gcd * b|, 0 where the gcd is 0."""
    gcd = gcd_values(ctx, a, b)
    zero = scalar(ctx, 0, a)
    is_zero = compare(gcd, zero, "EQ")
    quotient = stablehlo.divide(a, stablehlo.select(is_zero, scalar(ctx, 1, a), gcd))
    return stablehlo.select(is_zero, zero, stablehlo.abs(stablehlo.multiply(quotient, b)))


# -- float bits --------------------------------------------------------------------------------------------

@lower(aten.nextafter.default)
def nextafter(ctx, x, y):
    """One ulp from x towards y, in the output's own dtype (not the float32 it is usually computed in)."""

    def formula(ctx, a, b):
        bits = _bits(a)
        one = scalar(ctx, 1, bits)
        zero = scalar(ctx, 0, a)
        up = compare(compare(a, b, "LT"), compare(a, zero, "GT"), "EQ")
        step = _from_bits(stablehlo.add(bits, stablehlo.select(up, one, stablehlo.negate(one))), a)
        tiny = _from_bits(one, a)
        from_zero = stablehlo.select(compare(b, zero, "GT"), tiny, stablehlo.negate(tiny))
        result = stablehlo.select(compare(a, b, "EQ"), b,
                                  stablehlo.select(compare(a, zero, "EQ"), from_zero, step))
        return stablehlo.select(stablehlo.or_(_isnan(a), _isnan(b)), stablehlo.add(a, b), result)

    return elementwise_rule(formula, ctx.out_dtype)(ctx, x, y)


_FLOAT_LAYOUT = {torch.float32: (23, 127), torch.float64: (52, 1023)}
"""Mantissa bits and exponent bias of the types frexp computes in (half types are exact in float32)."""


@lower(aten.frexp.Tensor)
def frexp(ctx, x):
    """x = mantissa * 2**exponent with |mantissa| in [0.5, 1); (x, 0) for 0, inf and NaN. Subnormals are
    scaled into the normal range first."""
    mantissa_meta, exponent_meta = ctx.out_meta
    dtype = compute_dtype(mantissa_meta.dtype)
    mantissa_bits, bias = _FLOAT_LAYOUT[dtype]
    value = convert(x, dtype)

    def const(number, like):
        return full_like(ctx, mantissa_meta.shape, number, dtype_of(like))

    subnormal = compare(stablehlo.abs(value), const(2.0 ** (1 - bias), value), "LT")
    scaled = stablehlo.select(subnormal, stablehlo.multiply(value, const(2.0 ** mantissa_bits, value)), value)
    bits = _bits(scaled)
    field = stablehlo.and_(stablehlo.shift_right_logical(bits, const(mantissa_bits, bits)),
                           const(2 * bias + 1, bits))
    exponent = stablehlo.subtract(field, const(bias - 1, bits))
    exponent = stablehlo.select(subnormal, stablehlo.subtract(exponent, const(mantissa_bits, bits)), exponent)
    exponent_mask = (2 * bias + 1) << mantissa_bits
    mantissa_bits_value = stablehlo.or_(stablehlo.and_(bits, const(~exponent_mask, bits)),
                                        const((bias - 1) << mantissa_bits, bits))
    mantissa = _from_bits(mantissa_bits_value, scaled)
    special = stablehlo.or_(compare(value, const(0, value), "EQ"),
                            stablehlo.not_(stablehlo.is_finite(value)))
    mantissa = stablehlo.select(special, value, mantissa)
    exponent = stablehlo.select(special, const(0, exponent), exponent)
    return convert(mantissa, mantissa_meta.dtype), convert(exponent, exponent_meta.dtype)
