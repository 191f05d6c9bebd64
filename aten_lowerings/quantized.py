"""Quantization ops. A (de)quantize with a static scheme is ``stablehlo.uniform_(de)quantize`` on a
``!quant.uniform`` type; one whose scale is computed at run time (dynamic quantization) is integer math with
torch's rounding; ``choose_qparams`` computes that scale; fused products run ``dot_general``/``convolution``
on quantized operands (see ``quantize.fusion``).

A quantized value keeps its quant type while every user takes one, and is cast to its integer storage
(the dtype torch gives it) otherwise, so the other rules only ever see plain tensors.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.quantize import fusion
from torch_stablehlo.quantize.schemes import CHOOSE_QPARAMS, DEQUANTIZE, PER_CHANNEL, QUANTIZE, static_scheme
from torch_stablehlo.quantize.types import accumulator_scheme, quant_tensor_type

from .constants import constant, full_like
from .emit.contraction import convolve, dot_general, per_dim, symmetric_padding
from .emit.reduce import reduce
from .mlir_types import element_type, mlir_shape
from .promotion import convert
from .registry import lower
from .shapes import broadcast_in_dim, normalize_dim, reshape
from .values import dtype_of, rank, static_shape

F32 = torch.float32


def _as_quantized(value: ir.Value, quant_type: ir.Type) -> ir.Value:
    """``value`` (integer storage, or a quant type) as a tensor of ``quant_type``."""
    return value if value.type == quant_type else stablehlo.bitcast_convert(quant_type, value)


def _result(ctx, quantized: ir.Value) -> ir.Value:
    """The node's quantized value, as integer storage unless every user takes the quant type."""
    return quantized if fusion.keeps_quantized(ctx.node) else stablehlo.bitcast_convert(ctx.out_type(), quantized)


def _float_type(ctx) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(mlir_shape(ctx.out_shape), element_type(F32))


# -- quantize / dequantize ----------------------------------------------------------------------------------

def _parameters(ctx, params):
    """(scale, zero_point, axis, qmin, qmax, dtype) of either overload family."""
    if ctx.node.target in PER_CHANNEL:
        scales, zero_points, axis, qmin, qmax, dtype = params[:6]
        return scales, zero_points, normalize_dim(axis, len(ctx.out_shape)), qmin, qmax, dtype
    scale, zero_point, qmin, qmax, dtype = params[:5]
    return scale, zero_point, None, qmin, qmax, dtype


def _per_element(ctx, param, dtype: torch.dtype, axis: int | None) -> ir.Value:
    """A scale or zero point (number, 1-element tensor, or one per index of ``axis``) at the node's shape."""
    if not isinstance(param, ir.Value):
        return full_like(ctx, ctx.out_shape, param, dtype)
    value = convert(param, dtype)
    if axis is None:
        return broadcast_in_dim(ctx, reshape(ctx, value, []), ctx.out_shape, [])
    return broadcast_in_dim(ctx, value, ctx.out_shape, [axis])


def _reciprocal(ctx, scale, axis: int | None) -> ir.Value:
    """1 / scale as torch computes it: in double for a per-tensor scale (a Python float in torch's kernel),
    in the scales' dtype per channel; then float32, the dtype of the multiply."""
    if not isinstance(scale, ir.Value):
        return full_like(ctx, ctx.out_shape, 1.0 / scale, F32)
    dtype = torch.float64 if axis is None else dtype_of(scale)
    scale = _per_element(ctx, scale, dtype, axis)
    return convert(stablehlo.divide(full_like(ctx, ctx.out_shape, 1.0, dtype), scale), F32)


def _quantize_math(ctx, x, scale, zero_point, axis, qmin, qmax, dtype):
    """torch: ``clamp(round(x * (1 / scale)) + zero_point, qmin, qmax).to(dtype)`` in float32."""
    scaled = stablehlo.round_nearest_even(stablehlo.multiply(convert(x, F32), _reciprocal(ctx, scale, axis)))
    shifted = stablehlo.add(scaled, _per_element(ctx, zero_point, F32, axis))
    clamped = stablehlo.clamp(constant(float(qmin), F32), shifted, constant(float(qmax), F32))
    return convert(clamped, dtype)


def _dequantize_math(ctx, q, scale, zero_point, axis, out_dtype):
    """torch: ``(q - zero_point) * scale``, in ``out_dtype`` per tensor and in float32 per channel."""
    dtype = out_dtype if axis is None else F32
    centered = stablehlo.subtract(convert(q, dtype), _per_element(ctx, zero_point, dtype, axis))
    return convert(stablehlo.multiply(centered, _per_element(ctx, scale, dtype, axis)), out_dtype)


@lower(*QUANTIZE)
def quantize(ctx, x, *params):
    scheme = static_scheme(ctx.node)
    if scheme is None:
        return _quantize_math(ctx, x, *_parameters(ctx, params))
    quantized_type = quant_tensor_type(mlir_shape(ctx.out_shape), scheme)
    return _result(ctx, stablehlo.uniform_quantize(quantized_type, convert(x, F32)))


@lower(*DEQUANTIZE)
def dequantize(ctx, q, *params, out_dtype=None):
    scheme = static_scheme(ctx.node)
    if scheme is None:
        scale, zero_point, axis, *_ = _parameters(ctx, params)
        return _dequantize_math(ctx, q, scale, zero_point, axis, ctx.out_dtype)
    q = _as_quantized(q, quant_tensor_type(static_shape(q), scheme))
    return convert(stablehlo.uniform_dequantize(q), ctx.out_dtype)


# -- scales computed at run time ------------------------------------------------------------------------------

@lower(*CHOOSE_QPARAMS)
def choose_qparams(ctx, x, qmin, qmax, eps, dtype):
    """torch.ao's ``determine_qparams`` for the tensor's min and max (in float32): affine, or symmetric for
    ``choose_qparams_symmetric``. Returns a float64 scale and an int64 zero point, 1 element each."""
    x = convert(x, F32)
    zero = constant(0.0, F32)
    low = stablehlo.minimum(reduce(ctx, x, range(rank(x)), float("inf"), stablehlo.minimum), zero)
    high = stablehlo.maximum(reduce(ctx, x, range(rank(x)), float("-inf"), stablehlo.maximum), zero)
    if ctx.node.target == torch.ops.quantized_decomposed.choose_qparams_symmetric.tensor:
        scale = stablehlo.divide(stablehlo.maximum(stablehlo.negate(low), high), constant((qmax - qmin) / 2, F32))
        scale = stablehlo.maximum(scale, constant(eps, F32))
        zero_point = constant(128 if dtype == torch.uint8 else 0, torch.int64)
    else:
        scale = stablehlo.divide(stablehlo.subtract(high, low), constant(float(qmax - qmin), F32))
        scale = stablehlo.maximum(scale, constant(eps, F32))
        offset = convert(stablehlo.round_nearest_even(stablehlo.divide(low, scale)), torch.int64)
        zero_point = stablehlo.clamp(constant(qmin, torch.int64),
                                     stablehlo.subtract(constant(qmin, torch.int64), offset),
                                     constant(qmax, torch.int64))
    return reshape(ctx, convert(scale, torch.float64), [1]), reshape(ctx, zero_point, [1])


# -- fused products on quantized operands -----------------------------------------------------------------

def _add_bias(ctx, out, bias, channel_dim: int) -> ir.Value:
    if bias is not None:
        out = stablehlo.add(out, broadcast_in_dim(ctx, convert(bias, F32), ctx.out_shape, [channel_dim]))
    return convert(out, ctx.out_dtype)


def _fused(ctx, schemes: fusion.FusedSchemes, lhs, rhs, bias, product, channel_dim: int):
    """``product(result_type, lhs, rhs)`` on quantized operands: an exact int32 accumulator (scale lhs * rhs),
    plus the bias quantized to it, requantized to the output scheme (relu: max with the zero point), or
    dequantized for a float output. A float lhs (weight-only) gives a float product directly."""
    rhs = _as_quantized(rhs, quant_tensor_type(static_shape(rhs), schemes.rhs))
    if schemes.lhs is None:
        return _add_bias(ctx, product(_float_type(ctx), convert(lhs, F32), rhs), bias, channel_dim)
    lhs = _as_quantized(lhs, quant_tensor_type(static_shape(lhs), schemes.lhs))
    accumulator = accumulator_scheme(schemes.lhs, schemes.rhs, channel_dim)
    out = product(quant_tensor_type(mlir_shape(ctx.out_shape), accumulator), lhs, rhs)
    if schemes.out is None:
        return _add_bias(ctx, stablehlo.uniform_dequantize(out), bias, channel_dim)
    if bias is not None:
        bias_scheme = accumulator.with_axis(None if accumulator.axis is None else 0)
        bias = stablehlo.uniform_quantize(quant_tensor_type(static_shape(bias), bias_scheme), convert(bias, F32))
        out = stablehlo.add(out, broadcast_in_dim(ctx, bias, ctx.out_shape, [channel_dim],
                                                  element=ir.RankedTensorType(out.type).element_type))
    out = stablehlo.uniform_quantize(quant_tensor_type(mlir_shape(ctx.out_shape), schemes.out), out)
    if schemes.relu and schemes.out.zero_points[0] > schemes.out.qmin:  # else the clamp to qmin is the relu
        zero = stablehlo.uniform_quantize(quant_tensor_type([], schemes.out), constant(0.0, F32))
        out = stablehlo.maximum(out, broadcast_in_dim(ctx, zero, ctx.out_shape, []))
    return _result(ctx, out)


@lower(fusion.quantized_linear)
def quantized_linear(ctx, x, weight, bias, schemes):
    contracted = rank(x) - 1

    def product(result_type, lhs, rhs):
        return dot_general(result_type, lhs, rhs, [], [], [contracted], [1])

    return _fused(ctx, schemes, x, weight, bias, product, len(ctx.out_shape) - 1)


@lower(fusion.quantized_conv)
def quantized_conv(ctx, x, weight, bias, stride, padding, dilation, groups, schemes):
    n = rank(weight) - 2

    def product(result_type, lhs, rhs):
        return convolve(result_type, lhs, rhs, symmetric_padding(padding, n), groups,
                        window_strides=per_dim(stride, n), rhs_dilation=per_dim(dilation, n))

    return _fused(ctx, schemes, x, weight, bias, product, 1)


@lower(fusion.quantized_matmul)
def quantized_matmul(ctx, a, b, schemes):
    n = rank(a)
    batch = list(range(n - 2))

    def product(result_type, lhs, rhs):
        return dot_general(result_type, lhs, rhs, batch, batch, [n - 1], [n - 2])

    return _fused(ctx, schemes, a, b, None, product, n - 1)
