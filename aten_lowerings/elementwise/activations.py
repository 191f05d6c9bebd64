"""Activation functions: relu, gelu (exact and tanh), silu, hardtanh, leaky_relu, elu, softplus, ...

Each is a formula over the input, upcast to float32 for float16/bfloat16 as
torch computes them on CPU; the result is rounded once to the output dtype.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import chlo, stablehlo

from ..emit.elementwise import compare, scalar
from ..emit.extremes import maximum, minimum
from ..emit.slicing import slice_dim
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, normalize_dim, reshape
from ..values import dtype_of, static_shape

aten = torch.ops.aten

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _in_compute_dtype(formula):
    """The rule computing ``formula(ctx, x, *params)`` with ``x`` in its compute dtype (params as the node passes
    them), rounded once to the output dtype."""

    def rule(ctx, x, *params, **kwparams):
        value = convert(x, compute_dtype(ctx.out_dtype))
        return convert(formula(ctx, value, *params, **kwparams), ctx.out_dtype)

    return rule


def _scale(ctx, x, factor):
    return x if factor == 1 else stablehlo.multiply(x, scalar(ctx, factor, x))


def _positive(ctx, x):
    return compare(x, scalar(ctx, 0, x), "GT")


def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return minimum(maximum(x, scalar(ctx, min_val, x)), scalar(ctx, max_val, x))


lower(aten.hardtanh.default)(_in_compute_dtype(hardtanh))


@lower(aten.relu.default)
@_in_compute_dtype
def relu(ctx, x):
    return maximum(x, scalar(ctx, 0, x))


def relu6(ctx, x):
    return hardtanh(ctx, x, 0, 6)


lower(aten.relu6.default)(_in_compute_dtype(relu6))


def hardsigmoid(ctx, x):
    return stablehlo.divide(relu6(ctx, stablehlo.add(x, scalar(ctx, 3, x))), scalar(ctx, 6, x))


lower(aten.hardsigmoid.default)(_in_compute_dtype(hardsigmoid))


@lower(aten.hardswish.default)
@_in_compute_dtype
def hardswish(ctx, x):
    return stablehlo.multiply(x, hardsigmoid(ctx, x))


@lower(aten.gelu.default)
@_in_compute_dtype
def gelu(ctx, x, *, approximate="none"):
    if approximate == "tanh":
        cube = stablehlo.multiply(stablehlo.multiply(x, x), x)
        inner = _scale(ctx, stablehlo.add(x, _scale(ctx, cube, 0.044715)), math.sqrt(2 / math.pi))
        gate = stablehlo.tanh(inner)
    else:
        gate = chlo.erf(_scale(ctx, x, math.sqrt(0.5)))
    return stablehlo.multiply(_scale(ctx, x, 0.5), stablehlo.add(scalar(ctx, 1, x), gate))


@lower(aten.silu.default)
@_in_compute_dtype
def silu(ctx, x):
    return stablehlo.multiply(x, stablehlo.logistic(x))


@lower(aten.leaky_relu.default)
@_in_compute_dtype
def leaky_relu(ctx, x, negative_slope=0.01):
    return stablehlo.select(_positive(ctx, x), x, _scale(ctx, x, negative_slope))


def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    negative = _scale(ctx, stablehlo.exponential_minus_one(_scale(ctx, x, input_scale)), alpha * scale)
    return stablehlo.select(_positive(ctx, x), _scale(ctx, x, scale), negative)


lower(aten.elu.default)(_in_compute_dtype(elu))


@lower(aten.celu.default)
@_in_compute_dtype
def celu(ctx, x, alpha=1.0):
    return elu(ctx, x, alpha, 1.0, 1.0 / alpha)


@lower(aten.selu.default)
@_in_compute_dtype
def selu(ctx, x):
    return elu(ctx, x, _SELU_ALPHA, _SELU_SCALE)


def _log1p_exp(x):
    return stablehlo.log_plus_one(stablehlo.exponential(x))


@lower(aten.softplus.default)
@_in_compute_dtype
def softplus(ctx, x, beta=1.0, threshold=20.0):
    """Linear above ``threshold`` (in units of ``beta * x``), as torch does to avoid overflow."""
    scaled = _scale(ctx, x, beta)
    smooth = _scale(ctx, _log1p_exp(scaled), 1.0 / beta)
    return stablehlo.select(compare(scaled, scalar(ctx, threshold, x), "GT"), x, smooth)


@lower(aten.mish.default)
@_in_compute_dtype
def mish(ctx, x):
    return stablehlo.multiply(x, stablehlo.tanh(_log1p_exp(x)))


@lower(aten.log_sigmoid.default)
@_in_compute_dtype
def log_sigmoid(ctx, x):
    """min(x, 0) - log1p(exp(-|x|)): stable for large |x| of either sign."""
    zero = scalar(ctx, 0, x)
    return stablehlo.subtract(minimum(x, zero), _log1p_exp(stablehlo.negate(stablehlo.abs(x))))


@lower(aten.threshold.default)
@_in_compute_dtype
def threshold(ctx, x, threshold, value):
    return stablehlo.select(compare(x, scalar(ctx, threshold, x), "LE"), scalar(ctx, value, x), x)


def _leaky(ctx, x, slopes):
    return stablehlo.select(_positive(ctx, x), x, stablehlo.multiply(x, slopes))


@lower(aten.prelu.default)
@_in_compute_dtype
def prelu(ctx, x, weight):
    """One slope per channel (dim 1), or a single slope shared by all."""
    weight = convert(weight, dtype_of(x))
    if ctx.arg_meta(1).numel() == 1:
        return _leaky(ctx, x, broadcast_in_dim(ctx, reshape(ctx, weight, []), ctx.out_shape, []))
    return _leaky(ctx, x, broadcast_in_dim(ctx, weight, ctx.out_shape, [1]))


@lower(aten._prelu_kernel.default)
@_in_compute_dtype
def prelu_kernel(ctx, x, weight):
    return _leaky(ctx, x, broadcast_to(ctx, convert(weight, dtype_of(x)), ctx.out_shape))


@lower(aten.glu.default)
@_in_compute_dtype
def glu(ctx, x, dim=-1):
    """First half of ``dim`` gated by the sigmoid of the second half (any dim may be symbolic)."""
    dim = normalize_dim(dim, len(static_shape(x)))
    half = ctx.out_shape[dim]
    first = slice_dim(ctx, x, dim, 0, half, ctx.out_shape)
    second = slice_dim(ctx, x, dim, half, 2 * half, ctx.out_shape)
    return stablehlo.multiply(first, stablehlo.logistic(second))
