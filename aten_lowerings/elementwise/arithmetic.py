"""Elementwise arithmetic, comparisons, logic and math functions; shifts, gcd/lcm, and the bit-level ones
(copysign/signbit, nextafter, frexp), which read a float's bits through ``bitcast_convert``.

Most rules are one line: a generic n-ary helper applied to the StableHLO op.
Operands are promoted with torch's rules and broadcast to the node's output;
float16/bfloat16 results are computed in float32 and rounded once, as torch
does on CPU.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import chlo, stablehlo

from ..constants import full_like
from ..emit.elementwise import (as_tensor, compare, elementwise, elementwise_op, elementwise_operands, float_bits,
                                floor_quotient, scalar, sign_differs, signbit_values)
from ..emit.extremes import fmax, fmin, is_nan, maximum, minimum
from ..emit.loops import while_loop
from ..emit.reduce import reduce
from ..mlir_types import is_unsigned
from ..promotion import compute_dtype, convert, promoted_dtype
from ..registry import lower
from ..values import dtype_of, static_shape, value_type

aten = torch.ops.aten


def _float_only(op):
    """``op`` on floats; the identity on integers and bools (floor, ceil, round, trunc)."""
    return lambda x: op(x) if dtype_of(x).is_floating_point else x


# -- arithmetic ----------------------------------------------------------------

def _with_alpha(op):
    def rule(ctx, x, y, alpha=1):
        dtype = compute_dtype(ctx.out_dtype)
        a, b = elementwise_operands(ctx, x, y, dtype=dtype)
        if alpha != 1:
            b = stablehlo.multiply(b, scalar(ctx, alpha, b))
        return convert(op(a, b), ctx.out_dtype)

    return rule


lower(aten.add.Tensor, aten.add.Scalar)(_with_alpha(stablehlo.add))
lower(aten.sub.Tensor, aten.sub.Scalar)(_with_alpha(stablehlo.subtract))
lower(aten.mul.Tensor, aten.mul.Scalar)(elementwise_op(stablehlo.multiply))
lower(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor,
      aten.true_divide.Scalar)(elementwise_op(stablehlo.divide))
lower(aten.maximum.default, aten.max.other)(elementwise_op(maximum))
lower(aten.minimum.default, aten.min.other)(elementwise_op(minimum))
lower(aten.fmax.default)(elementwise_op(fmax))
lower(aten.fmin.default)(elementwise_op(fmin))
atan2 = lower(aten.atan2.default)(elementwise_op(stablehlo.atan2))
lower(aten.atan2.out)(lambda ctx, x, y, *, out=None: atan2(ctx, x, y))  # ``out`` only says where to write
lower(aten.fmod.Tensor, aten.fmod.Scalar)(elementwise_op(stablehlo.remainder))
lower(aten.square.default)(elementwise_op(lambda x: stablehlo.multiply(x, x)))


@lower(aten.hypot.default)
@elementwise
def hypot(ctx, a, b):
    return stablehlo.sqrt(stablehlo.add(stablehlo.multiply(a, a), stablehlo.multiply(b, b)))


@lower(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, x, y, alpha=1):
    return _with_alpha(stablehlo.subtract)(ctx, y, x, alpha=alpha)


@lower(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar,
       aten.float_power.Tensor_Scalar, aten.float_power.Tensor_Tensor, aten.float_power.Scalar)
def pow_(ctx, base, exponent):
    if isinstance(exponent, (int, float)) and exponent == 2:
        return elementwise(lambda ctx, x: stablehlo.multiply(x, x))(ctx, base)
    if isinstance(exponent, (int, float)) and exponent == 3:  # (x * x) * x, as torch's CPU kernel (GELU-tanh)
        return elementwise(lambda ctx, x: stablehlo.multiply(stablehlo.multiply(x, x), x))(ctx, base)
    return elementwise(lambda ctx, x, y: stablehlo.power(x, y))(ctx, base, exponent)


def _trunc(x):
    return stablehlo.multiply(stablehlo.sign(x), stablehlo.floor(stablehlo.abs(x)))


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, x, y, *, rounding_mode=None):
    a, b = elementwise_operands(ctx, x, y, dtype=compute_dtype(ctx.out_dtype))
    if rounding_mode == "floor":
        return convert(floor_quotient(ctx, a, b), ctx.out_dtype)
    quotient = stablehlo.divide(a, b)
    if rounding_mode == "trunc" and dtype_of(a).is_floating_point:
        quotient = _trunc(quotient)
    return convert(quotient, ctx.out_dtype)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, x, y):
    return div_mode(ctx, x, y, rounding_mode="floor")


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@elementwise
def remainder(ctx, a, b):
    """Python's modulo: the result takes the divisor's sign."""
    mod = stablehlo.remainder(a, b)
    return stablehlo.select(sign_differs(ctx, mod, b), stablehlo.add(mod, b), mod)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, x, min=None, max=None):
    result = as_tensor(ctx, x, ctx.out_dtype, ctx.out_shape)
    if min is not None:
        result = maximum(result, as_tensor(ctx, min, ctx.out_dtype, ctx.out_shape))
    if max is not None:
        result = minimum(result, as_tensor(ctx, max, ctx.out_dtype, ctx.out_shape))
    return result


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx, x, min):
    return clamp(ctx, x, min=min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, x, max):
    return clamp(ctx, x, max=max)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
@elementwise
def lerp(ctx, start, end, weight):
    """torch's two-sided form, exact at both ends."""
    diff = stablehlo.subtract(end, start)
    one = scalar(ctx, 1, start)
    low = stablehlo.add(start, stablehlo.multiply(weight, diff))
    high = stablehlo.subtract(end, stablehlo.multiply(diff, stablehlo.subtract(one, weight)))
    return stablehlo.select(compare(weight, scalar(ctx, 0.5, start), "LT"), low, high)


# -- unary math ------------------------------------------------------------------

for _op, _targets in {
    stablehlo.negate: [aten.neg.default, aten._neg_view_copy.default], stablehlo.abs: [aten.abs.default],
    stablehlo.exponential: [aten.exp.default], stablehlo.exponential_minus_one: [aten.expm1.default],
    stablehlo.log: [aten.log.default], stablehlo.log_plus_one: [aten.log1p.default],
    stablehlo.sqrt: [aten.sqrt.default], stablehlo.rsqrt: [aten.rsqrt.default],
    stablehlo.sine: [aten.sin.default], stablehlo.cosine: [aten.cos.default], stablehlo.tan: [aten.tan.default],
    stablehlo.tanh: [aten.tanh.default], stablehlo.logistic: [aten.sigmoid.default, aten.special_expit.default],
    chlo.asin: [aten.asin.default], chlo.acos: [aten.acos.default], chlo.atan: [aten.atan.default],
    chlo.sinh: [aten.sinh.default], chlo.cosh: [aten.cosh.default], chlo.asinh: [aten.asinh.default],
    chlo.acosh: [aten.acosh.default], chlo.atanh: [aten.atanh.default],
    chlo.erf: [aten.erf.default], chlo.erfc: [aten.erfc.default], chlo.erf_inv: [aten.erfinv.default],
    chlo.lgamma: [aten.lgamma.default],
    _float_only(stablehlo.floor): [aten.floor.default], _float_only(stablehlo.ceil): [aten.ceil.default],
    _float_only(stablehlo.round_nearest_even): [aten.round.default],
    _float_only(_trunc): [aten.trunc.default, aten.fix.default],
    _float_only(lambda x: stablehlo.subtract(x, _trunc(x))): [aten.frac.default],
}.items():
    lower(*_targets)(elementwise_op(_op))


@lower(aten.sign.default, aten.sgn.default)
def sign(ctx, x):
    return x if ctx.out_dtype == torch.bool else stablehlo.sign(x)


@lower(aten.reciprocal.default)
@elementwise
def reciprocal(ctx, x):
    return stablehlo.divide(scalar(ctx, 1, x), x)


@lower(aten.exp2.default)
@elementwise
def exp2(ctx, x):
    return stablehlo.power(scalar(ctx, 2, x), x)


@lower(aten.log2.default)
@elementwise
def log2(ctx, x):
    return stablehlo.divide(stablehlo.log(x), scalar(ctx, math.log(2), x))


@lower(aten.log10.default)
@elementwise
def log10(ctx, x):
    return stablehlo.divide(stablehlo.log(x), scalar(ctx, math.log(10), x))


@lower(aten.round.decimals)
def round_decimals(ctx, x, *, decimals=0):
    """torch scales by 10**|decimals|, rounds half to even and scales back."""
    value = convert(x, compute_dtype(ctx.out_dtype))
    scale = scalar(ctx, 10.0 ** abs(decimals), value)
    into, back = (stablehlo.multiply, stablehlo.divide) if decimals >= 0 else (stablehlo.divide, stablehlo.multiply)
    return convert(back(stablehlo.round_nearest_even(into(value, scale)), scale), ctx.out_dtype)


# -- comparisons, logic and float classes -----------------------------------------

def _compare(direction: str):
    def rule(ctx, x, y):
        dtype = promoted_dtype(x, y, metas=[ctx.arg_meta(0), ctx.arg_meta(1)])
        return compare(*elementwise_operands(ctx, x, y, dtype=dtype), direction)

    return rule


for _direction, _ops in {"EQ": aten.eq, "NE": aten.ne, "LT": aten.lt, "LE": aten.le,
                         "GT": aten.gt, "GE": aten.ge}.items():
    lower(_ops.Tensor, _ops.Scalar)(_compare(_direction))


lower(aten.logical_and.default)(elementwise_op(stablehlo.and_, torch.bool))
lower(aten.logical_or.default)(elementwise_op(stablehlo.or_, torch.bool))
lower(aten.logical_xor.default)(elementwise_op(stablehlo.xor, torch.bool))
lower(aten.logical_not.default)(elementwise_op(stablehlo.not_, torch.bool))
lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.__and__.Tensor,
      aten.__and__.Scalar)(elementwise_op(stablehlo.and_))
lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.__or__.Tensor,
      aten.__or__.Scalar)(elementwise_op(stablehlo.or_))
lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.__xor__.Tensor,
      aten.__xor__.Scalar)(elementwise_op(stablehlo.xor))
lower(aten.bitwise_not.default)(elementwise_op(stablehlo.not_))


def _float_class(test, otherwise: bool):
    """``test(x)`` on floats; a constant for integer and bool inputs, which are never NaN or infinite."""

    def rule(ctx, x):
        if not dtype_of(x).is_floating_point:
            return full_like(ctx, ctx.out_shape, otherwise, torch.bool)
        return test(x)

    return rule


lower(aten.isnan.default)(_float_class(is_nan, False))
lower(aten.isinf.default)(_float_class(chlo.is_inf, False))
lower(aten.isposinf.default)(_float_class(chlo.is_pos_inf, False))
lower(aten.isneginf.default)(_float_class(chlo.is_neg_inf, False))
lower(aten.isfinite.default)(_float_class(stablehlo.is_finite, True))


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, condition, x, y):
    a, b = elementwise_operands(ctx, x, y, dtype=ctx.out_dtype)
    return stablehlo.select(as_tensor(ctx, condition, torch.bool, ctx.out_shape), a, b)


# -- shifts: StableHLO's shifts already give torch's results for shifts < 0 or >= the bit width ----------

lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
      aten.__lshift__.Tensor, aten.__lshift__.Scalar)(elementwise_op(stablehlo.shift_left))


@lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor,
       aten.__rshift__.Tensor, aten.__rshift__.Scalar)
@elementwise
def shift_right(ctx, a, b):
    """Logical for unsigned integers, arithmetic for signed ones."""
    return (stablehlo.shift_right_logical if is_unsigned(dtype_of(a)) else stablehlo.shift_right_arithmetic)(a, b)


# -- sign bits -------------------------------------------------------------------------------------------

@lower(aten.signbit.default)
def signbit(ctx, x):
    return signbit_values(ctx, x)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
@elementwise
def copysign(ctx, a, b):
    magnitude = stablehlo.abs(a)
    return stablehlo.select(signbit_values(ctx, b), stablehlo.negate(magnitude), magnitude)


@lower(aten.angle.default)
@elementwise
def angle(ctx, x):
    """Of a real tensor: pi where negative, 0 elsewhere, NaN where NaN."""
    half_turn = stablehlo.select(compare(x, scalar(ctx, 0, x), "LT"), scalar(ctx, math.pi, x), scalar(ctx, 0, x))
    return stablehlo.select(is_nan(x), x, half_turn)


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


lower(aten.gcd.default)(elementwise(gcd_values))


@lower(aten.lcm.default)
@elementwise
def lcm(ctx, a, b):
    """|a / gcd * b|, 0 where the gcd is 0."""
    gcd = gcd_values(ctx, a, b)
    zero = scalar(ctx, 0, a)
    is_zero = compare(gcd, zero, "EQ")
    quotient = stablehlo.divide(a, stablehlo.select(is_zero, scalar(ctx, 1, a), gcd))
    return stablehlo.select(is_zero, zero, stablehlo.abs(stablehlo.multiply(quotient, b)))


# -- float bits --------------------------------------------------------------------------------------------

def _from_bits(bits, like):
    return stablehlo.bitcast_convert(value_type(like), bits)


@lower(aten.nextafter.default)
def nextafter(ctx, x, y):
    """One ulp from x towards y, in the output's own dtype (not the float32 it is usually computed in)."""

    def formula(ctx, a, b):
        bits = float_bits(a)
        one = scalar(ctx, 1, bits)
        zero = scalar(ctx, 0, a)
        up = compare(compare(a, b, "LT"), compare(a, zero, "GT"), "EQ")
        step = _from_bits(stablehlo.add(bits, stablehlo.select(up, one, stablehlo.negate(one))), a)
        tiny = _from_bits(one, a)
        from_zero = stablehlo.select(compare(b, zero, "GT"), tiny, stablehlo.negate(tiny))
        result = stablehlo.select(compare(a, b, "EQ"), b,
                                  stablehlo.select(compare(a, zero, "EQ"), from_zero, step))
        return stablehlo.select(stablehlo.or_(is_nan(a), is_nan(b)), stablehlo.add(a, b), result)

    return elementwise(formula, ctx.out_dtype)(ctx, x, y)


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
    bits = float_bits(scaled)
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
