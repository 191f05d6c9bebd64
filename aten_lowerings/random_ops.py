"""More random ops, on sampling.py's bit streams: feature and alpha dropout, rrelu in training, geometric,
multinomial; and fractional max pooling over given random samples (torch.export draws them with ``aten.rand``).

Every op here is listed in ``sampling.RANDOM_OPS`` (the ones that draw numbers), so the program takes the
``rng_seed`` argument.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import stablehlo

from .helpers import (broadcast_in_dim, compare, compute_dtype, constant, convert, dtype_of, full_like, iota, reduce,
                      reshape)
from .indexing import along_dim_plan, gather_plan
from .mlir_types import tensor_type
from .reductions import arg_picker, reduce_region, scan
from .registry import lower
from .sampling import keep_mask, uniform_values
from .shape_ops import slice_dim
from .sorting import sort_with_indices

aten = torch.ops.aten

_ALPHA = 1.7580993408473766  # SELU's alpha * scale: where alpha dropout sends dropped units (before the affine)


# -- dropout variants --------------------------------------------------------------------------------

def _noise_sizes(sizes, feature: bool):
    """Feature dropout draws one number per (sample, channel): torch's ``make_feature_noise``."""
    return list(sizes[:2]) + [1] * (len(sizes) - 2) if feature else list(sizes)


def _dropout_variant(ctx, x, p: float, feature: bool, alpha: bool):
    """torch's ``_dropout_impl``: ``x * noise`` (noise = keep / (1 - p)) or, for alpha dropout,
    ``x * a * keep + alpha * a * (keep - 1 + p)`` with ``a = 1 / sqrt((alpha^2 p + 1)(1 - p))``."""
    sizes, dtype = list(ctx.out_shape), compute_dtype(ctx.out_dtype)
    value = convert(x, dtype)
    if p == 1:
        return convert(stablehlo.multiply(value, full_like(ctx, sizes, 0, dtype)), ctx.out_dtype)
    noise_sizes = _noise_sizes(sizes, feature)
    keep = broadcast_in_dim(ctx, convert(keep_mask(ctx, noise_sizes, p), dtype), sizes, list(range(len(sizes))))
    if not alpha:
        noise = stablehlo.multiply(keep, full_like(ctx, sizes, 1 / (1 - p), dtype))
        return convert(stablehlo.multiply(value, noise), ctx.out_dtype)
    a = 1 / math.sqrt((_ALPHA ** 2 * p + 1) * (1 - p))
    shift = stablehlo.multiply(stablehlo.add(keep, full_like(ctx, sizes, p - 1, dtype)),
                               full_like(ctx, sizes, _ALPHA * a, dtype))
    scaled = stablehlo.multiply(value, stablehlo.multiply(keep, full_like(ctx, sizes, a, dtype)))
    return convert(stablehlo.add(scaled, shift), ctx.out_dtype)


def _dropout_rule(feature: bool, alpha: bool):
    def rule(ctx, x, p, train):
        if not train or p == 0 or math.prod(ctx.out_shape) == 0:
            return x
        return _dropout_variant(ctx, x, p, feature, alpha)

    return rule


lower(aten.feature_dropout.default)(_dropout_rule(feature=True, alpha=False))
lower(aten.alpha_dropout.default)(_dropout_rule(feature=False, alpha=True))
lower(aten.feature_alpha_dropout.default)(_dropout_rule(feature=True, alpha=True))


# -- rrelu, geometric --------------------------------------------------------------------------------

@lower(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise(ctx, x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """(output, noise). Training: a non-positive x is scaled by a uniform slope in [lower, upper], which is
    its noise (1 elsewhere); eval: leaky relu with the mean slope, noise unchanged."""
    sizes, dtype = list(ctx.out_meta[0].shape), compute_dtype(ctx.out_meta[0].dtype)
    value = convert(x, dtype)
    positive = compare(value, full_like(ctx, sizes, 0, dtype), "GT")
    if not training:
        slope = full_like(ctx, sizes, (lower + upper) / 2, dtype)
        leaky = stablehlo.select(positive, value, stablehlo.multiply(value, slope))
        return convert(leaky, ctx.out_meta[0].dtype), noise
    slope = stablehlo.add(full_like(ctx, sizes, lower, dtype), stablehlo.multiply(
        uniform_values(ctx, sizes, dtype), full_like(ctx, sizes, upper - lower, dtype)))
    slope = stablehlo.select(positive, full_like(ctx, sizes, 1, dtype), slope)
    return (convert(stablehlo.multiply(value, slope), ctx.out_meta[0].dtype),
            convert(slope, ctx.out_meta[1].dtype))


@lower(aten.geometric.default)
def geometric(ctx, x, p, *, generator=None):
    """Trials up to the first success: ``floor(log(1 - u) / log(1 - p)) + 1`` (float64 for integer tensors)."""
    sizes = list(ctx.out_shape)
    exact = ctx.out_dtype == torch.float64 or not ctx.out_dtype.is_floating_point
    dtype = torch.float64 if exact else torch.float32
    failures = stablehlo.log_plus_one(stablehlo.negate(uniform_values(ctx, sizes, dtype)))
    trials = stablehlo.floor(stablehlo.divide(failures, full_like(ctx, sizes, math.log1p(-p), dtype)))
    return convert(stablehlo.add(trials, full_like(ctx, sizes, 1, dtype)), ctx.out_dtype)


# -- multinomial ---------------------------------------------------------------------------------------

@lower(aten.multinomial.default)
def multinomial(ctx, weights, num_samples, replacement=False, *, generator=None):
    """Category indices drawn with probabilities proportional to the (non-negative) rows of ``weights``."""
    sizes = list(ctx.arg_meta(0).shape)
    rows = [1] if len(sizes) == 1 else sizes[:1]
    dtype = torch.float64 if ctx.arg_meta(0).dtype == torch.float64 else torch.float32
    table = reshape(ctx, convert(weights, dtype), rows + sizes[-1:])
    draw = _with_replacement if replacement else _without_replacement
    return reshape(ctx, draw(ctx, table, rows[0], sizes[-1], num_samples, dtype), ctx.out_shape)


def _with_replacement(ctx, table, rows: int, n: int, count: int, dtype):
    """Inverse CDF: the number of categories whose cumulative weight is at most ``u * total``."""
    cumulative = scan([table], [0], 1, lambda a, b: [stablehlo.add(a, b)])[0]
    total = slice_dim(ctx, cumulative, 1, n - 1, n, [rows, 1])
    targets = stablehlo.multiply(uniform_values(ctx, [rows, count], dtype),
                                 broadcast_in_dim(ctx, total, [rows, count], [0, 1]))
    grid = [rows, count, n]
    below = compare(broadcast_in_dim(ctx, cumulative, grid, [0, 2]), broadcast_in_dim(ctx, targets, grid, [0, 1]),
                    "LE")
    index = reduce(ctx, convert(below, torch.int64), [2], 0, stablehlo.add)
    return stablehlo.minimum(index, full_like(ctx, [rows, count], n - 1, torch.int64))


def _without_replacement(ctx, table, rows: int, n: int, count: int, dtype):
    """The ``count`` smallest of ``E / w`` (E exponential): torch's exponential race; zero weights come last."""
    exponential = stablehlo.negate(stablehlo.log_plus_one(stablehlo.negate(uniform_values(ctx, [rows, n], dtype))))
    order = sort_with_indices(ctx, stablehlo.divide(exponential, table), 1, False, [rows, n])[1]
    return slice_dim(ctx, order, 1, 0, count, [rows, count])


# -- fractional max pooling -------------------------------------------------------------------------

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
