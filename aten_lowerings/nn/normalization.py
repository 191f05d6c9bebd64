"""Normalization: layer, batch (eval and training), group, instance and RMS norm; weight norm.

Statistics are computed in float32 for float16/bfloat16 inputs, as torch's CPU
kernels do; the variance is the two-pass mean of squared deviations.
"""
from __future__ import annotations

import operator
from functools import reduce as fold

import numpy as np
import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..emit.reduce import reduce
from ..mlir_types import DYNAMIC
from ..promotion import compute_dtype, convert, round_to
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, dim_size, reshape
from ..values import dtype_of, static_shape

aten = torch.ops.aten


def _count(ctx, x, dims, dtype):
    """Number of elements over ``dims`` as a 0-d value (a constant when those dims are static)."""
    sizes = [static_shape(x)[d] for d in dims]
    if DYNAMIC not in sizes:
        return constant(int(np.prod(sizes)), dtype)
    return convert(fold(stablehlo.multiply, [dim_size(ctx, x, d) for d in dims]), dtype)


def _rsqrt_plus(ctx, value, eps, sizes):
    return stablehlo.rsqrt(stablehlo.add(value, full_like(ctx, sizes, eps, dtype_of(value))))


def _normalize(ctx, x, sizes, dims, eps, stats_dtype=None):
    """((x - mean) * rstd, mean, biased variance, rstd) over ``dims``; the statistics have those dims removed.

    With ``stats_dtype`` the mean, the sum of squared deviations and the rstd are rounded to it before
    use, as torch's CPU batch norm stores them (it matters for float16/bfloat16).
    """
    kept = [i for i in range(len(sizes)) if i not in dims]
    kept_sizes = [sizes[i] for i in kept]
    count = broadcast_in_dim(ctx, _count(ctx, x, dims, dtype_of(x)), kept_sizes, [])
    mean = stablehlo.divide(reduce(ctx, x, dims, 0, stablehlo.add), count)
    centered = stablehlo.subtract(x, broadcast_in_dim(ctx, mean, sizes, kept))
    squares = reduce(ctx, stablehlo.multiply(centered, centered), dims, 0, stablehlo.add)
    rounded = stats_dtype is not None and stats_dtype != dtype_of(x)
    if rounded:
        mean, squares = round_to(mean, stats_dtype), round_to(squares, stats_dtype)
        centered = stablehlo.subtract(x, broadcast_in_dim(ctx, mean, sizes, kept))
    var = stablehlo.divide(squares, count)
    rstd = _rsqrt_plus(ctx, var, eps, kept_sizes)
    if rounded:
        rstd = round_to(rstd, stats_dtype)
    return stablehlo.multiply(centered, broadcast_in_dim(ctx, rstd, sizes, kept)), mean, var, rstd


def _affine(ctx, y, weight, bias, sizes, param_dims):
    """y * weight + bias with the parameters broadcast along ``param_dims`` of ``y``."""
    dtype = dtype_of(y)
    if weight is not None:
        y = stablehlo.multiply(y, broadcast_in_dim(ctx, convert(weight, dtype), sizes, param_dims))
    if bias is not None:
        y = stablehlo.add(y, broadcast_in_dim(ctx, convert(bias, dtype), sizes, param_dims))
    return y


def _outputs(ctx, values):
    """Values converted to the node's output dtypes and shapes; None stands for an empty output
    (the statistics an eval-mode batch norm does not compute)."""
    metas = ctx.out_meta
    return [full_like(ctx, m.shape, 0, m.dtype) if v is None else reshape(ctx, convert(v, m.dtype), m.shape)
            for v, m in zip(values, metas)]


# -- layer norm and RMS norm ---------------------------------------------------------------

def _layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    sizes = list(ctx.arg_meta(0).shape)
    dims = list(range(len(sizes) - len(normalized_shape), len(sizes)))
    y, mean, _, rstd = _normalize(ctx, convert(x, compute_dtype(dtype_of(x))), sizes, dims, eps)
    return _affine(ctx, y, weight, bias, sizes, dims), mean, rstd


@lower(aten.layer_norm.default)
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return convert(_layer_norm(ctx, x, normalized_shape, weight, bias, eps)[0], ctx.out_dtype)


@lower(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    """Also returns mean and rstd, with the normalized dims kept as 1s."""
    return _outputs(ctx, _layer_norm(ctx, x, normalized_shape, weight, bias, eps))


@lower(aten.rms_norm.default)
def rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    """x * rsqrt(mean(x^2) + eps) (* weight), in float32 for low precision; eps defaults to float32's."""
    sizes = list(ctx.arg_meta(0).shape)
    dtype = compute_dtype(dtype_of(x))
    if eps is None:
        eps = torch.finfo(torch.float32 if dtype == torch.float32 else torch.float64).eps
    first = len(sizes) - len(normalized_shape)
    dims, kept = list(range(first, len(sizes))), list(range(first))
    x = convert(x, dtype)
    count = broadcast_in_dim(ctx, _count(ctx, x, dims, dtype), sizes[:first], [])
    mean_square = stablehlo.divide(reduce(ctx, stablehlo.multiply(x, x), dims, 0, stablehlo.add), count)
    rstd = _rsqrt_plus(ctx, mean_square, eps, sizes[:first])
    y = stablehlo.multiply(x, broadcast_in_dim(ctx, rstd, sizes, kept))
    return convert(_affine(ctx, y, weight, None, sizes, dims), ctx.out_dtype)


@lower(aten._weight_norm.default)
def weight_norm(ctx, v, g, dim=0):
    """``v * g / ||v||``, the norm over every dim but ``dim`` (over all of them for ``dim=-1``), as torch's
    ``norm_except_dim``; in float32 for low precision."""
    sizes = list(ctx.arg_meta(0).shape)
    dtype = compute_dtype(dtype_of(v))
    kept = [] if dim == -1 else [dim % len(sizes)]
    dims = [d for d in range(len(sizes)) if d not in kept]
    v = convert(v, dtype)
    norm = stablehlo.sqrt(reduce(ctx, stablehlo.multiply(v, v), dims, 0, stablehlo.add))
    scale = stablehlo.divide(convert(g, dtype), reshape(ctx, norm, list(ctx.arg_meta(1).shape)))
    return convert(stablehlo.multiply(v, broadcast_to(ctx, scale, sizes)), ctx.out_dtype)


# -- batch norm ---------------------------------------------------------------------------------

def _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, batch mean, batch rstd, new running mean, new running var).

    Eval mode normalizes with the running stats and returns None for the batch
    statistics and the running stats unchanged. Training mode uses the batch
    statistics and, when running stats are given, updates them as torch does
    (the variance with Bessel's correction).
    """
    sizes = list(ctx.arg_meta(0).shape)
    stats_dtype = _parameter_dtype(x, weight, bias, running_mean, running_var)
    dtype = compute_dtype(dtype_of(x))
    x = convert(x, dtype)
    if not training:
        mean = convert(running_mean, dtype)
        rstd = _rsqrt_plus(ctx, convert(running_var, dtype), eps, [sizes[1]])
        centered = stablehlo.subtract(x, broadcast_in_dim(ctx, mean, sizes, [1]))
        y = stablehlo.multiply(centered, broadcast_in_dim(ctx, rstd, sizes, [1]))
        return _affine(ctx, y, weight, bias, sizes, [1]), None, None, running_mean, running_var
    dims = [d for d in range(len(sizes)) if d != 1]
    y, mean, var, rstd = _normalize(ctx, x, sizes, dims, eps, stats_dtype)
    y = _affine(ctx, y, weight, bias, sizes, [1])
    if running_mean is None:
        return y, mean, rstd, None, None
    count = _count(ctx, x, dims, dtype)
    bessel = stablehlo.divide(count, stablehlo.subtract(count, constant(1, dtype)))
    unbiased = stablehlo.multiply(var, broadcast_in_dim(ctx, bessel, [sizes[1]], []))
    return (y, mean, rstd, _running_update(ctx, running_mean, mean, momentum, sizes[1]),
            _running_update(ctx, running_var, unbiased, momentum, sizes[1]))


def _parameter_dtype(x, *parameters):
    """The dtype of batch norm's statistics: the parameters' (float32 ones with a low-precision input
    make a "mixed type" batch norm), else the input's."""
    return next((dtype_of(p) for p in parameters if p is not None), dtype_of(x))


def _running_update(ctx, running, batch, momentum, channels):
    """(1 - momentum) * running + momentum * batch."""
    dtype = dtype_of(batch)
    keep = stablehlo.multiply(convert(running, dtype), full_like(ctx, [channels], 1 - momentum, dtype))
    return stablehlo.add(keep, stablehlo.multiply(batch, full_like(ctx, [channels], momentum, dtype)))


@lower(aten.batch_norm.default)
def batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    """torch.export keeps train-mode batch norm as this op; its running-stat updates are not outputs."""
    if training:
        running_mean = running_var = None
    out = _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps)[0]
    return convert(out, ctx.out_dtype)


@lower(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _outputs(ctx, _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps)[:3])


@lower(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _outputs(ctx, _batch_norm(ctx, x, weight, bias, running_mean, running_var, False, momentum, eps)[:3])


@lower(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(ctx, x, weight, bias, training, momentum, eps):
    return _outputs(ctx, _batch_norm(ctx, x, weight, bias, None, None, True, momentum, eps)[:3])


@lower(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Also returns the updated running mean and variance (the state a training step carries on)."""
    return _outputs(ctx, _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps))


# -- group and instance norm ----------------------------------------------------------------------

def _group_norm(ctx, x, weight, bias, groups, eps):
    """Normalized per (sample, group of channels): x viewed as (N, groups, rest)."""
    sizes = list(ctx.arg_meta(0).shape)
    grouped = [sizes[0], groups, fold(operator.mul, sizes[2:], sizes[1] // groups)]
    x = reshape(ctx, convert(x, compute_dtype(dtype_of(x))), grouped)
    y, mean, _, rstd = _normalize(ctx, x, grouped, [2], eps)
    return _affine(ctx, reshape(ctx, y, sizes), weight, bias, sizes, [1]), mean, rstd


@lower(aten.group_norm.default)
def group_norm(ctx, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    return convert(_group_norm(ctx, x, weight, bias, num_groups, eps)[0], ctx.out_dtype)


@lower(aten.native_group_norm.default)
def native_group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    return _outputs(ctx, _group_norm(ctx, x, weight, bias, group, eps))


@lower(aten.instance_norm.default)
def instance_norm(ctx, x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled):
    """Per (sample, channel) statistics, or the running stats like eval-mode batch norm."""
    if not use_input_stats:
        return batch_norm(ctx, x, weight, bias, running_mean, running_var, False, momentum, eps, cudnn_enabled)
    sizes = list(ctx.arg_meta(0).shape)
    stats_dtype = _parameter_dtype(x, weight, bias, running_mean, running_var)
    y = _normalize(ctx, convert(x, compute_dtype(dtype_of(x))), sizes, list(range(2, len(sizes))), eps,
                   stats_dtype)[0]
    return convert(_affine(ctx, y, weight, bias, sizes, [1]), ctx.out_dtype)
