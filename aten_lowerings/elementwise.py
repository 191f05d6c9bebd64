"""Elementwise arithmetic, comparisons, logic and math functions.

Most rules are one line: a generic n-ary helper applied to the StableHLO op.
Operands are promoted with torch's rules and broadcast to the node's output;
float16/bfloat16 results are computed in float32 and rounded once, as torch
does on CPU.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import chlo, stablehlo

from .helpers import (as_tensor, compare, compute_dtype, convert, dtype_of, elementwise_operands, full_like,
                      promoted_dtype)
from .registry import lower

aten = torch.ops.aten


def scalar(ctx, number, like):
    """``number`` as a tensor of the node's output shape and ``like``'s dtype."""
    return full_like(ctx, ctx.out_shape, number, dtype_of(like))


def _nan_propagating(op):
    """``op`` (stablehlo maximum or minimum) that returns NaN where either float operand is NaN, as torch does;
    XLA's CPU max and min return the other operand when the second one is NaN."""

    def apply(a, b):
        result = op(a, b)
        if not dtype_of(a).is_floating_point:
            return result
        return stablehlo.select(compare(a, a, "NE"), a, stablehlo.select(compare(b, b, "NE"), b, result))

    return apply


maximum = _nan_propagating(stablehlo.maximum)
minimum = _nan_propagating(stablehlo.minimum)


def elementwise_rule(formula, operand_dtype=None):
    """Rule applying ``formula(ctx, *values)`` to the operands promoted to ``operand_dtype`` (default: the
    output's compute dtype) and broadcast to the output; the result is converted to the output dtype."""

    def rule(ctx, *operands):
        values = elementwise_operands(ctx, *operands, dtype=operand_dtype or compute_dtype(ctx.out_dtype))
        return convert(formula(ctx, *values), ctx.out_dtype)

    return rule


def register_elementwise(op, *targets, operand_dtype=None):
    lower(*targets)(elementwise_rule(lambda ctx, *values: op(*values), operand_dtype))


def elementwise_formula(*targets):
    """Register ``formula(ctx, *values)`` as an elementwise rule (see ``elementwise_rule``)."""

    def register(formula):
        lower(*targets)(elementwise_rule(formula))
        return formula

    return register


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
register_elementwise(stablehlo.multiply, aten.mul.Tensor, aten.mul.Scalar)
register_elementwise(stablehlo.divide, aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor, aten.true_divide.Scalar)
register_elementwise(maximum, aten.maximum.default, aten.max.other)
register_elementwise(minimum, aten.minimum.default, aten.min.other)
atan2 = lower(aten.atan2.default)(elementwise_rule(lambda ctx, a, b: stablehlo.atan2(a, b)))
lower(aten.atan2.out)(lambda ctx, x, y, *, out=None: atan2(ctx, x, y))  # ``out`` only says where to write
register_elementwise(stablehlo.remainder, aten.fmod.Tensor, aten.fmod.Scalar)
register_elementwise(lambda x: stablehlo.multiply(x, x), aten.square.default)


@lower(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, x, y, alpha=1):
    return _with_alpha(stablehlo.subtract)(ctx, y, x, alpha=alpha)


@lower(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar,
       aten.float_power.Tensor_Scalar, aten.float_power.Tensor_Tensor, aten.float_power.Scalar)
def pow_(ctx, base, exponent):
    if isinstance(exponent, (int, float)) and exponent == 2:
        return elementwise_rule(lambda ctx, x: stablehlo.multiply(x, x))(ctx, base)
    if isinstance(exponent, (int, float)) and exponent == 3:  # (x * x) * x, as torch's CPU kernel (GELU-tanh)
        return elementwise_rule(lambda ctx, x: stablehlo.multiply(stablehlo.multiply(x, x), x))(ctx, base)
    return elementwise_rule(lambda ctx, x, y: stablehlo.power(x, y))(ctx, base, exponent)


def _sign_differs(ctx, remainder, divisor):
    """Where a truncated division's remainder is nonzero and its sign differs from the divisor's."""
    zero = scalar(ctx, 0, remainder)
    return stablehlo.and_(compare(remainder, zero, "NE"),
                          compare(compare(remainder, zero, "LT"), compare(divisor, zero, "LT"), "NE"))


def floor_quotient(ctx, a, b):
    """Python's floor division; for floats torch's algorithm (via fmod, exact where floor(a / b) is not)."""
    mod, one = stablehlo.remainder(a, b), scalar(ctx, 1, a)
    if not dtype_of(a).is_floating_point:
        quotient = stablehlo.divide(a, b)
        return stablehlo.select(_sign_differs(ctx, mod, b), stablehlo.subtract(quotient, one), quotient)
    div = stablehlo.divide(stablehlo.subtract(a, mod), b)
    div = stablehlo.select(_sign_differs(ctx, mod, b), stablehlo.subtract(div, one), div)
    floor = stablehlo.floor(div)
    floor = stablehlo.select(compare(stablehlo.subtract(div, floor), scalar(ctx, 0.5, a), "GT"),
                             stablehlo.add(floor, one), floor)
    quotient = stablehlo.divide(a, b)
    zero = scalar(ctx, 0, a)
    signed_zero = stablehlo.multiply(quotient, zero)
    floor = stablehlo.select(compare(div, zero, "EQ"), signed_zero, floor)
    return stablehlo.select(compare(b, zero, "EQ"), quotient, floor)


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


@elementwise_formula(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(ctx, a, b):
    """Python's modulo: the result takes the divisor's sign."""
    mod = stablehlo.remainder(a, b)
    return stablehlo.select(_sign_differs(ctx, mod, b), stablehlo.add(mod, b), mod)


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


@elementwise_formula(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, start, end, weight):
    """torch's two-sided form, exact at both ends."""
    diff = stablehlo.subtract(end, start)
    one = scalar(ctx, 1, start)
    low = stablehlo.add(start, stablehlo.multiply(weight, diff))
    high = stablehlo.subtract(end, stablehlo.multiply(diff, stablehlo.subtract(one, weight)))
    return stablehlo.select(compare(weight, scalar(ctx, 0.5, start), "LT"), low, high)


# -- unary math ------------------------------------------------------------------

for _op, _targets in {
    stablehlo.negate: [aten.neg.default], stablehlo.abs: [aten.abs.default],
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
    register_elementwise(_op, *_targets)


@lower(aten.sign.default, aten.sgn.default)
def sign(ctx, x):
    return x if ctx.out_dtype == torch.bool else stablehlo.sign(x)


@elementwise_formula(aten.reciprocal.default)
def reciprocal(ctx, x):
    return stablehlo.divide(scalar(ctx, 1, x), x)


@elementwise_formula(aten.exp2.default)
def exp2(ctx, x):
    return stablehlo.power(scalar(ctx, 2, x), x)


@elementwise_formula(aten.log2.default)
def log2(ctx, x):
    return stablehlo.divide(stablehlo.log(x), scalar(ctx, math.log(2), x))


@elementwise_formula(aten.log10.default)
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


register_elementwise(stablehlo.and_, aten.logical_and.default, operand_dtype=torch.bool)
register_elementwise(stablehlo.or_, aten.logical_or.default, operand_dtype=torch.bool)
register_elementwise(stablehlo.xor, aten.logical_xor.default, operand_dtype=torch.bool)
register_elementwise(stablehlo.not_, aten.logical_not.default, operand_dtype=torch.bool)
register_elementwise(stablehlo.and_, aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.__and__.Tensor, aten.__and__.Scalar)
register_elementwise(stablehlo.or_, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.__or__.Tensor, aten.__or__.Scalar)
register_elementwise(stablehlo.xor, aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.__xor__.Tensor, aten.__xor__.Scalar)
register_elementwise(stablehlo.not_, aten.bitwise_not.default)


def _float_class(test, otherwise: bool):
    """``test(x)`` on floats; a constant for integer and bool inputs, which are never NaN or infinite."""

    def rule(ctx, x):
        if not dtype_of(x).is_floating_point:
            return full_like(ctx, ctx.out_shape, otherwise, torch.bool)
        return test(x)

    return rule


lower(aten.isnan.default)(_float_class(lambda x: compare(x, x, "NE"), False))
lower(aten.isinf.default)(_float_class(chlo.is_inf, False))
lower(aten.isposinf.default)(_float_class(chlo.is_pos_inf, False))
lower(aten.isneginf.default)(_float_class(chlo.is_neg_inf, False))
lower(aten.isfinite.default)(_float_class(stablehlo.is_finite, True))


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, condition, x, y):
    a, b = elementwise_operands(ctx, x, y, dtype=ctx.out_dtype)
    return stablehlo.select(as_tensor(ctx, condition, torch.bool, ctx.out_shape), a, b)
