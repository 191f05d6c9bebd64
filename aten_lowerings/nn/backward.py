"""Backward ops that core ATen keeps whole (a traced training step calls them): convolution, layer and group
norm, average/adaptive/max pooling, embedding.

Gradients are computed in the compute dtype (float32 for float16/bfloat16, as torch's CPU kernels accumulate)
and rounded once to each output's dtype. A ``False`` in an ``output_mask`` leaves that output None.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import array_constant, constant, full_like
from ..emit.contraction import bin_matrix, contract, convolve, flipped_kernel, per_dim
from ..emit.elementwise import as_tensor, compare
from ..emit.index_plans import IndexPlan, along_dim_plan, scatter_plan
from ..emit.reduce import reduce
from ..mlir_types import element_type, mlir_shape
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, reshape
from ..values import dtype_of, rank, static_shape

aten = torch.ops.aten


def _results(ctx, values):
    """Values converted and reshaped to the node's outputs; None (a masked-off output) stays None."""
    return [None if v is None else reshape(ctx, convert(v, meta.dtype), meta.shape)
            for v, meta in zip(values, ctx.out_meta)]


def _result_type(sizes, dtype):
    return ir.RankedTensorType.get(mlir_shape(sizes), element_type(dtype))


def _sum(ctx, value, dims):
    return reduce(ctx, value, dims, 0, stablehlo.add)


# -- convolution -----------------------------------------------------------------------------

def _input_grad(ctx, grad, weight, transposed, output_padding, groups, stride, padding, dilation, dtype):
    """A transposed convolution's grad_input is the forward convolution of grad (its output_padding taken off
    the high side); a forward one's is the transposed convolution of grad, cut or padded to the input's size."""
    sizes = ctx.out_meta[0].shape
    if transposed:
        pads = [(p, p - extra) for p, extra in zip(padding, per_dim(output_padding, len(padding)))]
        return convolve(_result_type(sizes, dtype), grad, weight, pads, groups, window_strides=stride,
                        rhs_dilation=dilation)
    kernel = static_shape(weight)[2:]
    outs, ins = ctx.arg_meta(0).shape[2:], sizes[2:]
    pads = [(d * (k - 1) - p, s_in - 1 + p - (o - 1) * s)
            for d, k, p, s_in, o, s in zip(dilation, kernel, padding, ins, outs, stride)]
    return convolve(_result_type(sizes, dtype), grad, flipped_kernel(ctx, weight, groups), pads, groups,
                    window_strides=[1] * len(kernel), lhs_dilation=stride, rhs_dilation=dilation)


def _weight_grad(ctx, a, a_sizes, b, b_sizes, groups, stride, padding, dilation, dtype):
    """``sum over n, j of a[n, o, j] * b[n, i, j * stride - padding + k * dilation]`` as (o, i/groups, k...):
    the convolution of ``b`` (its batch and features swapped, the groups moved into the features) by ``a`` as
    the kernel, with stride and dilation trading places."""
    n = len(b_sizes) - 2
    batch, channels = b_sizes[:2]
    sizes = ctx.out_meta[1].shape
    kernel = sizes[2:]
    regrouped = stablehlo.transpose(reshape(ctx, b, [batch, groups, channels // groups, *b_sizes[2:]]),
                                    [2, 1, 0] + list(range(3, n + 3)))
    lhs = reshape(ctx, regrouped, [channels // groups, groups * batch, *b_sizes[2:]])
    pads = [(p, d * (k - 1) + s * (o - 1) + 1 - size - p)
            for p, d, k, s, o, size in zip(padding, dilation, kernel, stride, a_sizes[2:], b_sizes[2:])]
    swapped = [sizes[1], sizes[0], *kernel]
    out = convolve(_result_type(swapped, dtype), lhs, a, pads, groups, kernel_dims=(1, 0),
                   window_strides=dilation, rhs_dilation=stride)
    return stablehlo.transpose(out, [1, 0] + list(range(2, n + 2)))


@lower(aten.convolution_backward.default)
def convolution_backward(ctx, grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    """(grad_input, grad_weight, grad_bias); ``bias_sizes`` is already in the output's metadata. A transposed
    convolution's grad_weight is a forward one's with grad and x trading places."""
    n = rank(weight) - 2
    stride, padding, dilation = per_dim(stride, n), per_dim(padding, n), per_dim(dilation, n)
    dtype = compute_dtype(ctx.arg_meta(0).dtype)
    grad, x, weight = (convert(v, dtype) for v in (grad, x, weight))
    grad_sizes, x_sizes = list(ctx.arg_meta(0).shape), list(ctx.arg_meta(1).shape)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = _input_grad(ctx, grad, weight, transposed, output_padding, groups, stride, padding, dilation,
                                 dtype)
    if output_mask[1]:
        a, b = ((x, x_sizes), (grad, grad_sizes)) if transposed else ((grad, grad_sizes), (x, x_sizes))
        grad_weight = _weight_grad(ctx, *a, *b, groups, stride, padding, dilation, dtype)
    if output_mask[2]:
        grad_bias = _sum(ctx, grad, [0] + list(range(2, n + 2)))
    return _results(ctx, [grad_input, grad_weight, grad_bias])


# -- layer and group norm -------------------------------------------------------------------------

def _along(ctx, value, sizes, dims, dtype):
    """A parameter or statistic that varies along ``dims`` of ``sizes`` (any 1s aside) broadcast to them."""
    return broadcast_in_dim(ctx, reshape(ctx, convert(value, dtype), [sizes[d] for d in dims]), sizes, dims)


def _norm_backward(ctx, grad, x, mean, rstd, weight, sizes, stat_dims, weight_dims, output_mask):
    """Gradients of ``(x - mean) * rstd * weight + bias`` with x viewed as ``sizes``: the statistics vary along
    ``stat_dims`` (and were taken over the others), weight and bias along ``weight_dims``."""
    dtype = compute_dtype(dtype_of(x))
    grad, x = (reshape(ctx, convert(v, dtype), sizes) for v in (grad, x))
    rstd = _along(ctx, rstd, sizes, stat_dims, dtype)
    normalized = stablehlo.multiply(stablehlo.subtract(x, _along(ctx, mean, sizes, stat_dims, dtype)), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        dims = [d for d in range(len(sizes)) if d not in stat_dims]
        count = math.prod(sizes[d] for d in dims)
        count = as_tensor(ctx, count if isinstance(count, int) else ctx.size_value(count), dtype, sizes)
        scaled = grad if weight is None else stablehlo.multiply(grad, _along(ctx, weight, sizes, weight_dims, dtype))

        def total(value):
            return broadcast_in_dim(ctx, _sum(ctx, value, dims), sizes, stat_dims)

        # rstd * (scaled - (sum(scaled) + normalized * sum(scaled * normalized)) / count)
        mean_terms = stablehlo.add(total(scaled), stablehlo.multiply(normalized,
                                                                     total(stablehlo.multiply(scaled, normalized))))
        grad_input = stablehlo.multiply(rstd, stablehlo.subtract(scaled, stablehlo.divide(mean_terms, count)))
    others = [d for d in range(len(sizes)) if d not in weight_dims]
    if output_mask[1]:
        grad_weight = _sum(ctx, stablehlo.multiply(grad, normalized), others)
    if output_mask[2]:
        grad_bias = _sum(ctx, grad, others)
    return _results(ctx, [grad_input, grad_weight, grad_bias])


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(ctx, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    sizes = list(ctx.arg_meta(1).shape)
    first = len(sizes) - len(normalized_shape)
    return _norm_backward(ctx, grad, x, mean, rstd, weight, sizes, list(range(first)),
                          list(range(first, len(sizes))), output_mask)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(ctx, grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    """x viewed as (N, group, C / group, HxW); the sizes come from x's metadata (symbolic ones arrive as values)."""
    shape = ctx.arg_meta(1).shape
    sizes = [shape[0], group, shape[1] // group, math.prod(shape[2:])]
    return _norm_backward(ctx, grad, x, mean, rstd, weight, sizes, [0, 1], [1, 2], output_mask)


# -- pooling --------------------------------------------------------------------------------------

def _window_sizes(size: int, out: int, kernel: int, stride: int, padding: int, include_pad: bool) -> np.ndarray:
    """How many elements each of torch's average-pooling windows along one dim divides by."""
    starts = np.arange(out) * stride - padding
    ends = np.minimum(starts + kernel, size + padding)
    if not include_pad:
        starts, ends = np.maximum(starts, 0), np.minimum(ends, size)
    return ends - starts


def _sum_pool_transpose(ctx, grad, kernel, stride, padding, dtype):
    """Each input element gets the sum of grad over the windows that hold it: a depthwise transposed
    convolution with a kernel of ones, cut or padded to the input's size."""
    sizes = list(ctx.out_shape)
    if len(sizes) == len(kernel) + 1:  # unbatched
        sizes = [1] + sizes
        grad = reshape(ctx, grad, [1] + list(ctx.arg_meta(0).shape))
    channels, outs = static_shape(grad)[1], static_shape(grad)[2:]
    ones = constant(1, dtype, [channels, 1, *kernel])
    pads = [(k - 1 - p, size - 1 + p - (o - 1) * s)
            for k, p, size, o, s in zip(kernel, padding, sizes[2:], outs, stride)]
    out = convolve(_result_type(sizes, dtype), grad, ones, pads, channels, window_strides=[1] * len(kernel),
                   lhs_dilation=stride)
    return reshape(ctx, out, ctx.out_shape)


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    """grad divided by each window's divisor, summed back over the windows; ceil_mode shows only in grad's size."""
    kernel, padding = per_dim(kernel_size, 2), per_dim(padding, 2)
    stride = per_dim(stride, 2) if stride else kernel
    outs, sizes = static_shape(grad)[-2:], static_shape(x)[-2:]
    if divisor_override:
        divisors = np.full(outs, divisor_override)
    else:
        rows, cols = (_window_sizes(*dims, count_include_pad) for dims in zip(sizes, outs, kernel, stride, padding))
        divisors = np.outer(rows, cols)
    dtype = compute_dtype(ctx.out_dtype)
    divisors = convert(array_constant(divisors.astype(np.float32), torch.float32), dtype)
    divisors = broadcast_to(ctx, divisors, ctx.arg_meta(0).shape)
    scaled = stablehlo.divide(convert(grad, dtype), divisors)
    return convert(_sum_pool_transpose(ctx, scaled, kernel, stride, padding, dtype), ctx.out_dtype)


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(ctx, grad, x):
    """Each spatial dim of grad contracted with its bin-averaging matrix (each moves that dim last, in turn)."""
    dtype = compute_dtype(ctx.out_dtype)
    value, lead = convert(grad, dtype), rank(grad) - 2
    for size, out in zip(static_shape(x)[-2:], static_shape(grad)[-2:]):
        shape = static_shape(value)
        matrix = convert(array_constant(bin_matrix(size, out), torch.float32), dtype)
        value = contract(value, matrix, [], [], [lead], [0], shape[:lead] + shape[lead + 1:] + [size], dtype)
    return convert(value, ctx.out_dtype)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """grad added into each input plane at the flat positions in ``indices``, which already encode the window."""
    def flat(sizes):
        return [*sizes[:-2], sizes[-2] * sizes[-1]]

    updates = flat(ctx.arg_meta(0).shape)
    dtype = compute_dtype(ctx.out_dtype)
    plan = along_dim_plan(ctx, len(updates) - 1, reshape(ctx, indices, updates), updates)
    summed = scatter_plan(full_like(ctx, flat(ctx.out_shape), 0, dtype), plan, reshape(ctx, convert(grad, dtype), updates),
                      stablehlo.add)
    return reshape(ctx, convert(summed, ctx.out_dtype), ctx.out_shape)


# -- embedding ---------------------------------------------------------------------------------------

@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(ctx, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """grad's rows added into a zero table at their indices, except at ``padding_idx``; with
    ``scale_grad_by_freq`` each table row is divided by how often its index occurs."""
    count = math.prod(ctx.arg_meta(1).shape)
    rows, width = ctx.out_shape
    dtype = compute_dtype(ctx.out_dtype)
    positions = reshape(ctx, convert(indices, torch.int64), [count, 1])
    plan = IndexPlan(positions, [0], [1], [])
    updates = reshape(ctx, convert(grad, dtype), [count, width])
    padding = compare(positions, full_like(ctx, [count, 1], padding_idx, torch.int64), "EQ")
    updates = stablehlo.select(broadcast_to(ctx, padding, [count, width]), full_like(ctx, [count, width], 0, dtype),
                               updates)
    table = scatter_plan(full_like(ctx, [rows, width], 0, dtype), plan, updates, stablehlo.add)
    if scale_grad_by_freq:
        counts = scatter_plan(full_like(ctx, [rows, 1], 0, dtype), plan, full_like(ctx, [count, 1], 1, dtype),
                          stablehlo.add)
        counts = stablehlo.maximum(counts, full_like(ctx, [rows, 1], 1, dtype))
        table = stablehlo.divide(table, broadcast_to(ctx, counts, [rows, width]))
    return convert(table, ctx.out_dtype)
