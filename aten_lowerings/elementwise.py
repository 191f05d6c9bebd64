"""Elementwise arithmetic, comparisons, logic and math functions.

Most rules are one line: a generic n-ary helper applied to the StableHLO op.
Operands are promoted with torch's rules and broadcast to the node's output.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, stablehlo

from .helpers import convert, dtype_of, elementwise_operands, promoted_dtype
from .registry import lower

aten = torch.ops.aten


def _nary(op, *, compute_dtype=None):
    """Rule for an elementwise op computed in the promoted dtype and converted to the node's dtype."""

    def rule(ctx, *operands):
        dtype = compute_dtype(ctx) if compute_dtype else ctx.out_dtype
        return convert(op(*elementwise_operands(ctx, *operands, dtype=dtype)), ctx.out_dtype)

    return rule


def _register(op, *targets, **options):
    lower(*targets)(_nary(op, **options))


# -- arithmetic ----------------------------------------------------------------

def _with_alpha(op):
    def rule(ctx, x, y, *, alpha=1):
        a, b = elementwise_operands(ctx, x, y, dtype=ctx.out_dtype)
        if alpha != 1:
            b = stablehlo.multiply(b, elementwise_operands(ctx, alpha, dtype=ctx.out_dtype)[0])
        return op(a, b)

    return rule


lower(aten.add.Tensor, aten.add.Scalar)(_with_alpha(stablehlo.add))
lower(aten.sub.Tensor, aten.sub.Scalar)(_with_alpha(stablehlo.subtract))
_register(stablehlo.multiply, aten.mul.Tensor, aten.mul.Scalar)
_register(stablehlo.divide, aten.div.Tensor, aten.div.Scalar)
_register(stablehlo.maximum, aten.maximum.default)
_register(stablehlo.minimum, aten.minimum.default)


@lower(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, x, y, *, alpha=1):
    return _with_alpha(stablehlo.subtract)(ctx, y, x, alpha=alpha)


@lower(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(ctx, base, exponent):
    if isinstance(exponent, (int, float)) and exponent == 2:
        x = elementwise_operands(ctx, base, dtype=ctx.out_dtype)[0]
        return stablehlo.multiply(x, x)
    return stablehlo.power(*elementwise_operands(ctx, base, exponent, dtype=ctx.out_dtype))


# -- unary math ------------------------------------------------------------------

_register(stablehlo.negate, aten.neg.default)
_register(stablehlo.abs, aten.abs.default)
_register(stablehlo.exponential, aten.exp.default)
_register(stablehlo.log, aten.log.default)
_register(stablehlo.sqrt, aten.sqrt.default)
_register(stablehlo.rsqrt, aten.rsqrt.default)
_register(stablehlo.tanh, aten.tanh.default)
_register(stablehlo.logistic, aten.sigmoid.default)
_register(stablehlo.sine, aten.sin.default)
_register(stablehlo.cosine, aten.cos.default)
_register(chlo.erf, aten.erf.default)


# -- comparisons and logic --------------------------------------------------------

def _compare(direction: str):
    def rule(ctx, x, y):
        metas = [ctx.arg_meta(0), ctx.arg_meta(1)]
        dtype = promoted_dtype(x, y, metas=metas)
        a, b = elementwise_operands(ctx, x, y, dtype=dtype)
        kind = "FLOAT" if dtype.is_floating_point else ("UNSIGNED" if dtype in (torch.bool, torch.uint8) else "SIGNED")
        return stablehlo.compare(a, b, stablehlo.ComparisonDirectionAttr.get(direction),
                                 compare_type=stablehlo.ComparisonTypeAttr.get(kind))

    return rule


for _direction, _ops in {"EQ": aten.eq, "NE": aten.ne, "LT": aten.lt, "LE": aten.le,
                         "GT": aten.gt, "GE": aten.ge}.items():
    lower(_ops.Tensor, _ops.Scalar)(_compare(_direction))

_register(stablehlo.and_, aten.logical_and.default, compute_dtype=lambda ctx: torch.bool)
_register(stablehlo.or_, aten.logical_or.default, compute_dtype=lambda ctx: torch.bool)
_register(stablehlo.and_, aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.__and__.Tensor)
_register(stablehlo.or_, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.__or__.Tensor)


@lower(aten.logical_not.default)
def logical_not(ctx, x):
    return stablehlo.not_(convert(x, torch.bool))


# -- activations -------------------------------------------------------------------

@lower(aten.relu.default)
def relu(ctx, x):
    return stablehlo.maximum(*elementwise_operands(ctx, x, 0, dtype=ctx.out_dtype))
