"""Convolutions and pooling: convolution (1d/2d/3d, groups, stride, padding, dilation, transposed),
max/avg/adaptive pooling as ``reduce_window`` (adaptive max pooling with indices), and fractional max pooling
over given random samples (torch.export draws them with ``aten.rand``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import array_constant, constant, full_like
from ..emit.contraction import bin_matrix, contract, convolve, flipped_kernel, per_dim, symmetric_padding
from ..emit.elementwise import compare
from ..emit.extremes import is_nan, lowest
from ..emit.index_plans import along_dim_plan, gather_plan
from ..emit.reduce import arg_picker, reduce_region
from ..emit.slicing import slice_dim
from ..mlir_types import DYNAMIC, element_type, mlir_shape, tensor_type
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, iota, reshape
from ..values import dtype_of, rank, static_shape, value_type

aten = torch.ops.aten


def _spatial_static(value: ir.Value, n: int, what: str) -> list[int]:
    sizes = static_shape(value)[-n:]
    if DYNAMIC in sizes:
        raise NotImplementedError(f"{what} with dynamic spatial dims is not supported yet")
    return sizes


# -- convolution -----------------------------------------------------------------

def _unread_tail_dropped(ctx, x, in_sizes, out_sizes, kernel, padding, stride, dilation):
    """The input and padding of a strided convolution without the trailing rows no window reads (fewer than a
    stride: high padding first, then input rows), along static spatial dims. The result is the same; IREE 3.13
    (llvm-cpu) refuses a convolution whose output has one row along a dim and whose padded input is longer
    than its window reaches (a 3x3, stride 2, padding 1 convolution of a 2x2 image: ResNet's last stage), and
    accepts it trimmed. ``in_sizes`` and ``out_sizes`` are torch sizes, batched."""
    trimmed, sizes = [], list(in_sizes)
    for i, (size, out, k, (low, high), s, d) in enumerate(zip(in_sizes[2:], out_sizes[2:], kernel, padding, stride,
                                                                dilation)):
        static = isinstance(size, int) and isinstance(out, int) and out > 0
        excess = size + low + high - ((out - 1) * s + (k - 1) * d + 1) if static else 0
        cut = min(max(excess, 0), max(high, 0))
        trimmed.append((low, high - cut))
        rows = max(min(excess - cut, size - 1), 0) if static else 0
        if rows:
            sizes[i + 2] = size - rows
            x = slice_dim(ctx, x, i + 2, 0, sizes[i + 2], sizes)
    return x, trimmed


def _transposed_kernel(ctx, weight, groups: int):
    """A transposed convolution's weight (in, out/groups, k...) as a forward kernel and its (output, input)
    feature dims: spatially reversed, and with groups its features swapped within each group."""
    if groups == 1:
        return stablehlo.reverse(weight, list(range(2, rank(weight)))), (1, 0)
    return flipped_kernel(ctx, weight, groups), (0, 1)


def _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``padding`` is a list of (low, high) pairs per spatial dim."""
    n = rank(weight) - 2
    stride, dilation = per_dim(stride, n), per_dim(dilation, n)
    out_sizes, in_sizes = list(ctx.out_shape), list(ctx.arg_meta(0).shape)
    unbatched = rank(x) == n + 1
    if unbatched:
        x = reshape(ctx, x, [1] + in_sizes)
        out_sizes, in_sizes = [1] + out_sizes, [1] + in_sizes
    dtype = compute_dtype(ctx.out_dtype)
    x, weight = convert(x, dtype), convert(weight, dtype)
    options = dict(window_strides=stride, rhs_dilation=dilation)
    kernel_dims = (0, 1)
    if transposed:
        weight, kernel_dims = _transposed_kernel(ctx, weight, groups)
        kernel = static_shape(weight)[2:]
        extra = per_dim(output_padding, n)
        padding = [(d * (k - 1) - lo, d * (k - 1) - hi + e)
                   for d, k, (lo, hi), e in zip(dilation, kernel, padding, extra)]
        options = dict(window_strides=[1] * n, lhs_dilation=stride, rhs_dilation=dilation)
    else:
        x, padding = _unread_tail_dropped(ctx, x, in_sizes, out_sizes, static_shape(weight)[2:], padding, stride,
                                          dilation)
    result_type = ir.RankedTensorType.get(mlir_shape(out_sizes), element_type(dtype))
    out = convolve(result_type, x, weight, padding, groups, kernel_dims, **options)
    if bias is not None:
        out = stablehlo.add(out, broadcast_in_dim(ctx, convert(bias, dtype), out_sizes, [1]))
    out = convert(out, ctx.out_dtype)
    return reshape(ctx, out, ctx.out_shape) if unbatched else out


@lower(aten.convolution.default)
def convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _convolution(ctx, x, weight, bias, stride, symmetric_padding(padding, rank(weight) - 2), dilation,
                        transposed, output_padding, groups)


@lower(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
def conv(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convolution(ctx, x, weight, bias, stride, symmetric_padding(padding, rank(weight) - 2), dilation,
                        False, 0, groups)


@lower(aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding)
def conv_padding(ctx, x, weight, bias=None, stride=1, padding="valid", dilation=1, groups=1):
    """'valid' is no padding; 'same' pads dilation * (k - 1) in all, the odd one on the high side (as torch)."""
    n = rank(weight) - 2
    if padding == "valid":
        pads = [(0, 0)] * n
    else:
        totals = [d * (k - 1) for d, k in zip(per_dim(dilation, n), static_shape(weight)[2:])]
        pads = [(t // 2, t - t // 2) for t in totals]
    return _convolution(ctx, x, weight, bias, stride, pads, dilation, False, 0, groups)


@lower(aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input)
def conv_transpose(ctx, x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _convolution(ctx, x, weight, bias, stride, symmetric_padding(padding, rank(weight) - 2), dilation,
                        True, output_padding, groups)


# -- pooling windows ------------------------------------------------------------------

@dataclass
class _Window:
    """A ``reduce_window`` window over every dim of the operand (1 over the leading, non-spatial dims)."""
    dims: list[int]
    strides: list[int]
    dilations: list[int]
    padding: list[tuple[int, int]]

    def spatial(self, n: int) -> "_Window":
        return _Window(self.dims[-n:], self.strides[-n:], self.dilations[-n:], self.padding[-n:])


def _pool_window(ctx, x, n: int, kernel, stride, padding, dilation, ceil_mode) -> _Window:
    """torch's pooling window; ceil_mode adds high padding so the windows torch counts fit."""
    kernel = per_dim(kernel, n)
    stride = per_dim(stride, n) if stride else kernel
    padding, dilation = per_dim(padding, n), per_dim(dilation, n)
    high = list(padding)
    if ceil_mode:
        sizes = _spatial_static(x, n, "pooling with ceil_mode")
        out_meta = ctx.out_meta[0] if isinstance(ctx.out_meta, (tuple, list)) else ctx.out_meta
        for i, (size, out) in enumerate(zip(sizes, out_meta.shape[-n:])):
            covered = (out - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
            high[i] = max(padding[i], covered - size - padding[i])
    lead = rank(x) - n
    return _Window([1] * lead + kernel, [1] * lead + stride, [1] * lead + dilation,
                   [(0, 0)] * lead + list(zip(padding, high)))


def _reduce_window(inputs, inits, window: _Window, result_types, body):
    """``reduce_window`` over several operands; ``body(accumulators, values)`` returns the new accumulators."""
    op = stablehlo.ReduceWindowOp(result_types, inputs, inits, window.dims, window_strides=window.strides,
                                  window_dilations=window.dilations,
                                  padding=np.asarray(window.padding, dtype=np.int64))
    scalars = [ir.RankedTensorType.get([], ir.RankedTensorType(v.type).element_type) for v in inputs]
    block = op.regions[0].blocks.append(*scalars, *scalars)
    with ir.InsertionPoint(block):
        stablehlo.return_(body(block.arguments[:len(inputs)], block.arguments[len(inputs):]))
    return op.results


# -- max pooling -----------------------------------------------------------------------

def _nan_max(a, b):
    """max that propagates NaN (XLA's CPU reductions drop NaN from ``stablehlo.maximum``): one compare and select
    per window element, where ``extremes.maximum`` takes a max and two selects."""
    return stablehlo.select(stablehlo.or_(compare(a, b, "GT"), is_nan(a)), a, b)


def _max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, n):
    window = _pool_window(ctx, x, n, kernel_size, stride, padding, dilation, ceil_mode)
    dtype = dtype_of(x)
    (out,) = _reduce_window([x], [constant(lowest(dtype), dtype)], window, [ctx.out_type()],
                            lambda acc, new: [_nan_max(acc[0], new[0])])
    return out


for _n, _op in ((1, aten.max_pool1d), (2, aten.max_pool2d), (3, aten.max_pool3d)):
    lower(_op.default)(partial(_max_pool, n=_n))


def _first_max(acc, new):
    """The larger value (NaN counts as largest) and its index; ties go to the smaller index, as torch's scan.
    ``emit.reduce.arg_picker("GT", dtype)``'s rule, with its tests in another order (the NaN tests first, for
    every dtype)."""
    (a, a_index), (b, b_index) = acc, new
    a_nan, b_nan = is_nan(a), is_nan(b)
    greater = stablehlo.or_(compare(a, b, "GT"), stablehlo.and_(a_nan, stablehlo.not_(b_nan)))
    equal = stablehlo.or_(compare(a, b, "EQ"), stablehlo.and_(a_nan, b_nan))
    keep = stablehlo.or_(greater, stablehlo.and_(equal, compare(a_index, b_index, "LT")))
    return [stablehlo.select(keep, a, b), stablehlo.select(keep, a_index, b_index)]


def _max_pool_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, n):
    """Values and flat indices into each input plane; padding carries the largest index so it loses ties."""
    window = _pool_window(ctx, x, n, kernel_size, stride, padding, dilation, ceil_mode)
    plane = _spatial_static(x, n, "max pooling with indices")
    flat = iota(ctx, [int(np.prod(plane))], 0)
    indices = broadcast_to(ctx, reshape(ctx, flat, plane), list(ctx.arg_meta(0).shape))
    dtype = dtype_of(x)
    inits = [constant(lowest(dtype), dtype), constant(torch.iinfo(torch.int64).max, torch.int64)]
    return _reduce_window([x, indices], inits, window, [ctx.out_type(0), ctx.out_type(1)], _first_max)


for _n, _op in ((1, aten.max_pool1d_with_indices), (2, aten.max_pool2d_with_indices),
                (3, aten.max_pool3d_with_indices)):
    lower(_op.default)(partial(_max_pool_with_indices, n=_n))


def _adaptive_max_pool(ctx, x, output_size, *, n):
    """Evenly divisible sizes pool with a fixed window; otherwise one spatial dim at a time (a max of maxes,
    ties still to the first flat index), each output position reducing its bin [floor(i*in/out),
    ceil((i+1)*in/out)) to one (value, index) pair."""
    sizes, outs = _spatial_static(x, n, "adaptive max pooling"), per_dim(output_size, n)
    if all(size % out == 0 for size, out in zip(sizes, outs)):
        kernel = [size // out for size, out in zip(sizes, outs)]
        return _max_pool_with_indices(ctx, x, kernel, kernel, n=n)
    dtype, lead = dtype_of(x), rank(x) - n
    flat = reshape(ctx, iota(ctx, [int(np.prod(sizes))], 0), sizes)
    pairs = [x, broadcast_to(ctx, flat, list(ctx.arg_meta(0).shape))]
    inits = [constant(lowest(dtype), dtype), constant(torch.iinfo(torch.int64).max, torch.int64)]
    for axis, (size, out) in enumerate(zip(sizes, outs), lead):
        bins = []
        for i in range(out):
            start, end = (i * size) // out, -(-((i + 1) * size) // out)
            shape, window = static_shape(pairs[0]), [1] * rank(x)
            shape[axis], window[axis] = end - start, end - start
            parts = [slice_dim(ctx, v, axis, start, end, shape) for v in pairs]
            shape[axis] = 1
            types = [ir.RankedTensorType.get(shape, value_type(v).element_type) for v in pairs]
            plain = _Window(window, [1] * rank(x), [1] * rank(x), [(0, 0)] * rank(x))
            bins.append(_reduce_window(parts, inits, plain, types, _first_max))
        pairs = [stablehlo.concatenate([b[k] for b in bins], axis) for k in range(2)]
    return pairs


for _n, _op in ((2, aten.adaptive_max_pool2d), (3, aten.adaptive_max_pool3d)):
    lower(_op.default)(partial(_adaptive_max_pool, n=_n))


# -- average pooling ---------------------------------------------------------------------

def _window_counts(ctx, x, n: int, window: _Window, count_include_pad: bool):
    """How many elements each window averages: inside the input, plus the padding when it counts
    (but never the extra ceil_mode padding), as a float32 tensor of the spatial output shape."""
    window = window.spatial(n)
    ones = full_like(ctx, list(ctx.arg_meta(0).shape[-n:]), 1, torch.float32)
    if count_include_pad:
        lows = [lo for lo, _ in window.padding]
        padded = [s if s == DYNAMIC else s + 2 * lo for s, lo in zip(static_shape(ones), lows)]
        ones = stablehlo.pad(ones, constant(1, torch.float32), lows, lows, [0] * n,
                             results=[ir.RankedTensorType.get(padded, ir.F32Type.get())])
        window = _Window(window.dims, window.strides, window.dilations, [(0, hi - lo) for lo, hi in window.padding])
    result = ir.RankedTensorType.get(mlir_shape(ctx.out_shape[-n:]), ir.F32Type.get())
    (counts,) = _reduce_window([ones], [constant(0, torch.float32)], window, [result],
                               lambda acc, new: [stablehlo.add(acc[0], new[0])])
    return counts


def _avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None, *, n):
    window = _pool_window(ctx, x, n, kernel_size, stride, padding, 1, ceil_mode)
    dtype = compute_dtype(ctx.out_dtype)
    result = ir.RankedTensorType.get(mlir_shape(ctx.out_shape), element_type(dtype))
    (sums,) = _reduce_window([convert(x, dtype)], [constant(0, dtype)], window, [result],
                             lambda acc, new: [stablehlo.add(acc[0], new[0])])
    if divisor_override:
        divisor = full_like(ctx, ctx.out_shape, divisor_override, dtype)
    else:
        counts = convert(_window_counts(ctx, x, n, window, count_include_pad), dtype)
        divisor = broadcast_to(ctx, counts, ctx.out_shape)
    return convert(stablehlo.divide(sums, divisor), ctx.out_dtype)


for _n, _op in ((1, aten.avg_pool1d), (2, aten.avg_pool2d), (3, aten.avg_pool3d)):
    lower(_op.default)(partial(_avg_pool, n=_n))


# -- adaptive average pooling ----------------------------------------------------------------

def _adaptive_avg_pool(ctx, x, output_size, *, n):
    """Evenly divisible sizes pool with a fixed window; otherwise each spatial dim is contracted with
    its bin-averaging matrix (each contraction moves that dim last, so the order comes out right)."""
    sizes, outs = _spatial_static(x, n, "adaptive pooling"), per_dim(output_size, n)
    if all(size % out == 0 for size, out in zip(sizes, outs)):
        kernel = [size // out for size, out in zip(sizes, outs)]
        return _avg_pool(ctx, x, kernel, kernel, n=n)
    dtype = compute_dtype(ctx.out_dtype)
    value, lead = convert(x, dtype), rank(x) - n
    for size, out in zip(sizes, outs):
        shape = static_shape(value)
        out_shape = shape[:lead] + shape[lead + 1:] + [out]
        matrix = convert(array_constant(bin_matrix(size, out), torch.float32), dtype)
        value = contract(value, matrix, [], [], [lead], [1], out_shape, dtype)
    return convert(value, ctx.out_dtype)


for _n, _ops in ((1, [aten.adaptive_avg_pool1d]), (2, [aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d]),
                 (3, [aten.adaptive_avg_pool3d, aten._adaptive_avg_pool3d])):
    lower(*[op.default for op in _ops])(partial(_adaptive_avg_pool, n=_n))


# -- fractional max pooling ----------------------------------------------------------------------------

def _window_starts(ctx, samples, sample_index: int, in_size: int, out_size: int, pool: int, planes):
    """torch's ``generate_intervals`` for every plane: ``int((i + s) * alpha) - int(s * alpha)`` with
    ``alpha = (in - pool) / (out - 1)`` in the samples' dtype, the last window ending at the input's end."""
    dtype, sizes = dtype_of(samples), [*planes, out_size]
    last = full_like(ctx, sizes, in_size - pool, torch.int64)
    if out_size == 1:
        return last
    sample = reshape(ctx, slice_dim(ctx, samples, 2, sample_index, sample_index + 1, [*planes, 1]), planes)
    sample = broadcast_in_dim(ctx, sample, sizes, [0, 1])
    alpha = stablehlo.divide(constant(in_size - pool, dtype), constant(out_size - 1, dtype))
    alpha = broadcast_in_dim(ctx, alpha, sizes, [])
    shifted = stablehlo.multiply(stablehlo.add(iota(ctx, sizes, 2, dtype), sample), alpha)
    starts = stablehlo.subtract(convert(shifted, torch.int64), convert(stablehlo.multiply(sample, alpha), torch.int64))
    return stablehlo.select(compare(iota(ctx, sizes, 2), full_like(ctx, sizes, out_size - 1, torch.int64), "EQ"),
                            last, starts)


def _fractional_max_pool(ctx, x, kernel, output_size, samples):
    """(max, flat index in the input plane) over each window; the samples' order is torch's (2-d: w, h;
    3-d: t, h, w)."""
    n = len(output_size)
    x_sizes = list(ctx.arg_meta(0).shape)
    planes = ([1] if len(x_sizes) == n + 1 else x_sizes[:1]) + x_sizes[-n - 1:-n]
    spatial, kernel = x_sizes[-n:], [kernel[0]] * n if len(kernel) == 1 else list(kernel)
    order = [1, 0] if n == 2 else [0, 1, 2]
    grid = [*planes, *output_size, *kernel]
    flat = full_like(ctx, grid, 0, torch.int64)
    for d in range(n):
        starts = _window_starts(ctx, samples, order[d], spatial[d], output_size[d], kernel[d], planes)
        taps = [*planes, output_size[d], kernel[d]]
        position = stablehlo.add(broadcast_in_dim(ctx, starts, taps, [0, 1, 2]), iota(ctx, taps, 3))
        position = stablehlo.multiply(position, full_like(ctx, taps, math.prod(spatial[d + 1:]), torch.int64))
        flat = stablehlo.add(flat, broadcast_in_dim(ctx, position, grid, [0, 1, 2 + d, 2 + n + d]))
    windows = [*planes, math.prod(output_size) * math.prod(kernel)]
    plane_values = reshape(ctx, x, [*planes, math.prod(spatial)])
    index = reshape(ctx, flat, windows)
    values = gather_plan(ctx, plane_values, [*planes, math.prod(spatial)], along_dim_plan(ctx, 2, index, windows))
    pooled = [*planes, *output_size, math.prod(kernel)]
    return _max_with_index(ctx, reshape(ctx, values, pooled), reshape(ctx, flat, pooled), pooled)


def _max_with_index(ctx, values, indices, sizes):
    dtype, kept = dtype_of(values), sizes[:-1]
    operation = stablehlo.ReduceOp([tensor_type(kept, dtype), tensor_type(kept, torch.int64)], [values, indices],
                                   [constant(float("-inf"), dtype), constant(-1, torch.int64)], [len(sizes) - 1])
    reduce_region(operation, [tensor_type([], dtype), tensor_type([], torch.int64)] * 2, arg_picker("GT", dtype))
    return [reshape(ctx, result, meta.shape) for result, meta in zip(operation.results, ctx.out_meta)]


@lower(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def fractional_max_pool(ctx, x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(ctx, x, list(kernel_size), list(output_size), random_samples)
