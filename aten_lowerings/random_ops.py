"""Random ops: rand/randn(_like), uniform, normal, bernoulli, randint(_like), randperm, geometric, multinomial;
dropout (native, feature, alpha) and rrelu in training.

Every op here draws from ``emit.random_bits`` (whose ``RANDOM_OPS`` lists them, attention with dropout
included), so the program takes the ``rng_seed`` argument. Normals use Box-Muller; randperm sorts random keys.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .constants import full_like
from .emit.elementwise import as_tensor, compare
from .emit.random_bits import dropout_values, keep_mask, random_bits, uniform_values
from .emit.reduce import reduce, scan
from .emit.slicing import slice_dim
from .emit.sort import sort_with_indices
from .promotion import compute_dtype, convert
from .registry import lower
from .shapes import broadcast_in_dim, reshape
from .values import dtype_of

aten = torch.ops.aten


# -- samples ---------------------------------------------------------------------------------------------

def normal_values(ctx, sizes, dtype: torch.dtype) -> ir.Value:
    """Standard normal samples by Box-Muller: sqrt(-2 log(1 - u)) cos(2 pi v), computed in float32/float64."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    pair = uniform_values(ctx, [2, *sizes], compute)
    u, v = (reshape(ctx, slice_dim(ctx, pair, 0, i, i + 1, [1, *sizes]), sizes) for i in (0, 1))
    radius = stablehlo.sqrt(stablehlo.multiply(
        full_like(ctx, sizes, -2.0, compute),
        stablehlo.log(stablehlo.subtract(full_like(ctx, sizes, 1.0, compute), u))))
    angle = stablehlo.multiply(full_like(ctx, sizes, 2 * math.pi, compute), v)
    return convert(stablehlo.multiply(radius, stablehlo.cosine(angle)), dtype)


def _affine(ctx, samples, scale, offset):
    """``offset + scale * samples`` (numbers or tensors) in the node's dtype and shape."""
    dtype, sizes = ctx.out_dtype, ctx.out_shape
    return stablehlo.add(as_tensor(ctx, offset, dtype, sizes),
                         stablehlo.multiply(as_tensor(ctx, scale, dtype, sizes), samples))


@lower(aten.rand.default, aten.rand_like.default)
def rand(ctx, *_args, **_kwargs):
    return uniform_values(ctx, ctx.out_shape, ctx.out_dtype)


@lower(aten.randn.default, aten.randn_like.default)
def randn(ctx, *_args, **_kwargs):
    return normal_values(ctx, ctx.out_shape, ctx.out_dtype)


@lower(aten.uniform.default)
def uniform(ctx, x, low=0.0, high=1.0, *, generator=None):
    return _affine(ctx, uniform_values(ctx, ctx.out_shape, ctx.out_dtype), high - low, low)


@lower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal(ctx, mean, std=1.0, *, generator=None):
    return _affine(ctx, normal_values(ctx, ctx.out_shape, ctx.out_dtype), std, mean)


@lower(aten.normal.float_float)
def normal_sized(ctx, mean, std, size, **_kwargs):
    return normal(ctx, mean, std)


@lower(aten.normal_functional.default)
def normal_functional(ctx, x, mean=0.0, std=1.0, *, generator=None):
    return normal(ctx, mean, std)


@lower(aten.bernoulli.default, aten.bernoulli.p)
def bernoulli(ctx, x, p=None, *, generator=None):
    """1 where a uniform sample is below the probability (``p``, or ``x`` itself)."""
    compute = torch.float64 if ctx.out_dtype == torch.float64 else torch.float32
    probability = as_tensor(ctx, x if p is None else p, compute, ctx.out_shape)
    return convert(compare(uniform_values(ctx, ctx.out_shape, compute), probability, "LT"), ctx.out_dtype)


@lower(aten.randint.low, aten.randint.default, aten.randint_like.default, aten.randint_like.low_dtype)
def randint(ctx, *args, **_kwargs):
    """floor(u * (high - low)) + low with a float64 u: uniform over [low, high) for ranges below 2**52."""
    bounds = [a for a in args if isinstance(a, int)]
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds[:2]
    sizes = ctx.out_shape
    scaled = stablehlo.floor(_scaled(ctx, uniform_values(ctx, sizes, torch.float64), high - low, sizes))
    return convert(stablehlo.add(scaled, full_like(ctx, sizes, low, torch.float64)), ctx.out_dtype)


def _scaled(ctx, value, factor, sizes):
    return stablehlo.multiply(value, full_like(ctx, sizes, factor, dtype_of(value)))


@lower(aten.randperm.default, aten.randperm.generator)
def randperm(ctx, _n, **_kwargs):
    """The positions of random 32-bit keys in sorted order (ties, rare, keep their order). Sizes come from the
    node's output (``n`` may be a SymInt, here a value); like every random op, a generator draws from the
    program's seed instead."""
    sizes = ctx.out_shape
    return convert(sort_with_indices(ctx, random_bits(ctx, sizes, torch.uint32), 0, False, sizes)[1], ctx.out_dtype)


# -- dropout ---------------------------------------------------------------------------------------------

@lower(aten.native_dropout.default)
def native_dropout(ctx, x, p, train):
    """Output and keep mask; eval mode (``train`` False; None means training) keeps everything."""
    sizes, dtype = ctx.out_meta[0].shape, ctx.out_meta[0].dtype
    if train is False:
        return x, full_like(ctx, sizes, True, torch.bool)
    return dropout_values(ctx, x, p, sizes, dtype)


@lower(aten.dropout.default)
def dropout(ctx, x, p, train):
    return dropout_values(ctx, x, p, ctx.out_shape, ctx.out_dtype)[0] if train else x


_ALPHA = 1.7580993408473766  # SELU's alpha * scale: where alpha dropout sends dropped units (before the affine)


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
    """Category indices drawn with probabilities proportional to the (non-negative) rows of ``weights``. Sizes
    come from the metas (``num_samples`` may be a SymInt, here a value)."""
    sizes = list(ctx.arg_meta(0).shape)
    rows = [1] if len(sizes) == 1 else sizes[:1]
    dtype = torch.float64 if ctx.arg_meta(0).dtype == torch.float64 else torch.float32
    table = reshape(ctx, convert(weights, dtype), rows + sizes[-1:])
    draw = _with_replacement if replacement else _without_replacement
    return reshape(ctx, draw(ctx, table, rows[0], sizes[-1], ctx.out_shape[-1], dtype), ctx.out_shape)


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
    return stablehlo.minimum(index, broadcast_in_dim(ctx, ctx.size_value(n - 1), [rows, count], []))


def _without_replacement(ctx, table, rows: int, n: int, count: int, dtype):
    """The ``count`` smallest of ``E / w`` (E exponential): torch's exponential race; zero weights come last."""
    exponential = stablehlo.negate(stablehlo.log_plus_one(stablehlo.negate(uniform_values(ctx, [rows, n], dtype))))
    order = sort_with_indices(ctx, stablehlo.divide(exponential, table), 1, False, [rows, n])[1]
    return slice_dim(ctx, order, 1, 0, count, [rows, count])
