"""Reductions: sum, mean, amax/amin, max/min with indices, argmax/argmin, var/std, prod, any/all, scans (cumsum,
cumprod, logcumsumexp, cummax/cummin), softmax, log_softmax, logsumexp, vector norms; and the row-wise
hash_tensor and renorm.

Values are reduced in the output's compute dtype (float32 for float16/bfloat16,
int64 for integer sums, as torch accumulates on CPU), then converted and
reshaped to the node's output, which also restores ``keepdim`` dims.
"""
from __future__ import annotations

import math

import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, stablehlo

from .constants import constant, full_like
from .emit.elementwise import as_tensor, compare
from .emit.extremes import highest, is_nan, lowest, maximum, minimum
from .emit.reduce import arg_extreme, arg_picker, p_norm, reduce, scan
from .mlir_types import DYNAMIC
from .promotion import compute_dtype, convert, round_to
from .registry import lower
from .shapes import broadcast_in_dim, iota, normalize_dim, normalize_dims, reshape
from .values import dtype_of, rank, static_shape, with_dtype

aten = torch.ops.aten


def _dims(x, dim) -> list[int]:
    """Reduced dims: ``None`` and ``[]`` mean all of them (a 0-d tensor has none)."""
    if rank(x) == 0:
        return []
    return normalize_dims(dim if dim not in (None, []) else None, rank(x))


def _finish(ctx, value, index=None):
    """Convert and reshape a reduced value to the node's output ``index``."""
    meta = ctx.out_meta if index is None else ctx.out_meta[index]
    return reshape(ctx, convert(value, meta.dtype), meta.shape)


def _kept(ctx, dims):
    """Torch sizes of the input without the reduced dims, and the input dims they come from."""
    sizes = ctx.arg_meta(0).shape
    kept = [d for d in range(len(sizes)) if d not in dims]
    return [sizes[d] for d in kept], kept


def _expand(ctx, reduced, dims):
    """A value reduced over ``dims`` broadcast back to the input's sizes."""
    return broadcast_in_dim(ctx, reduced, ctx.arg_meta(0).shape, _kept(ctx, dims)[1])


def _count(ctx, dims, like):
    """How many elements each reduction over ``dims`` sees, as a tensor shaped and typed like ``like``."""
    sizes = ctx.arg_meta(0).shape
    count = math.prod(sizes[d] for d in dims)
    count = count if isinstance(count, int) else ctx.size_value(count)
    return as_tensor(ctx, count, dtype_of(like), _kept(ctx, dims)[0])


def _sum(ctx, x, dims):
    return reduce(ctx, convert(x, compute_dtype(ctx.out_dtype)), dims, 0, stablehlo.add)


# -- sums and products ------------------------------------------------------------

@lower(aten.sum.default, aten.sum.dim_IntList)
def sum_(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return _finish(ctx, _sum(ctx, x, _dims(x, dim)))


@lower(aten.mean.default, aten.mean.dim)
def mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(x, dim)
    total = _sum(ctx, x, dims)
    return _finish(ctx, stablehlo.divide(total, _count(ctx, dims, total)))


@lower(aten.prod.default, aten.prod.dim_int)
def prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(x, dim)
    return _finish(ctx, reduce(ctx, convert(x, compute_dtype(ctx.out_dtype)), dims, 1, stablehlo.multiply))


def _logical(op, init):
    def rule(ctx, x, dim=None, keepdim=False):
        return _finish(ctx, reduce(ctx, convert(x, torch.bool), _dims(x, dim), init, op))

    return rule


lower(aten.any.default, aten.any.dim, aten.any.dims)(_logical(stablehlo.or_, False))
lower(aten.all.default, aten.all.dim, aten.all.dims)(_logical(stablehlo.and_, True))


# -- extrema ------------------------------------------------------------------------

def _extreme(op, init):
    def rule(ctx, x, dim=None, keepdim=False):
        return _finish(ctx, reduce(ctx, x, _dims(x, dim), init(dtype_of(x)), op))

    return rule


lower(aten.amax.default, aten.max.default)(_extreme(maximum, lowest))
lower(aten.amin.default, aten.min.default)(_extreme(minimum, highest))


@lower(aten.max.dim)
def max_dim(ctx, x, dim, keepdim=False):
    values, indices = arg_extreme(ctx, x, dim, "GT")
    return _finish(ctx, values, 0), _finish(ctx, indices, 1)


@lower(aten.min.dim)
def min_dim(ctx, x, dim, keepdim=False):
    values, indices = arg_extreme(ctx, x, dim, "LT")
    return _finish(ctx, values, 0), _finish(ctx, indices, 1)


@lower(aten.argmax.default)
def argmax(ctx, x, dim=None, keepdim=False):
    return _finish(ctx, arg_extreme(ctx, x, dim, "GT")[1])


@lower(aten.argmin.default)
def argmin(ctx, x, dim=None, keepdim=False):
    return _finish(ctx, arg_extreme(ctx, x, dim, "LT")[1])


# -- moments ----------------------------------------------------------------------------

def _moments(ctx, x, dim, correction):
    """(variance, mean) over ``dim`` in the compute dtype; the variance divides by max(N - correction, 0)."""
    dims = _dims(x, dim)
    value = convert(x, compute_dtype(dtype_of(x)))
    total = reduce(ctx, value, dims, 0, stablehlo.add)
    count = _count(ctx, dims, total)
    average = stablehlo.divide(total, count)
    centered = stablehlo.subtract(value, _expand(ctx, average, dims))
    squares = reduce(ctx, stablehlo.multiply(centered, centered), dims, 0, stablehlo.add)
    sizes, dtype = _kept(ctx, dims)[0], dtype_of(value)
    denominator = stablehlo.maximum(stablehlo.subtract(count, full_like(ctx, sizes, correction, dtype)),
                                    full_like(ctx, sizes, 0, dtype))
    return stablehlo.divide(squares, denominator), average


def _moment_rules(finish):
    """The rules of the ``.correction``, ``.dim`` and ``.default`` overloads of var/std/var_mean/std_mean, with
    ``finish(ctx, var, mean)`` making the outputs."""

    def by_correction(ctx, x, dim=None, *, correction=None, keepdim=False):
        return finish(ctx, *_moments(ctx, x, dim, 1 if correction is None else correction))

    def by_unbiased(ctx, x, dim=None, unbiased=True, keepdim=False):
        return finish(ctx, *_moments(ctx, x, dim, int(unbiased)))

    return by_correction, by_unbiased, lambda ctx, x, unbiased=True: by_unbiased(ctx, x, None, unbiased)


for _packet, _outputs in (
        (aten.var, lambda ctx, var, mean: _finish(ctx, var)),
        (aten.std, lambda ctx, var, mean: _finish(ctx, stablehlo.sqrt(var))),
        (aten.var_mean, lambda ctx, var, mean: (_finish(ctx, var, 0), _finish(ctx, mean, 1))),
        (aten.std_mean, lambda ctx, var, mean: (_finish(ctx, stablehlo.sqrt(var), 0), _finish(ctx, mean, 1)))):
    for _overload, _rule in zip((_packet.correction, _packet.dim, _packet.default), _moment_rules(_outputs)):
        lower(_overload)(_rule)


# -- scans ---------------------------------------------------------------------------------

def _cumulative(op, init):
    """Inclusive scan along ``dim`` as a ``reduce_window`` whose window spans the whole dim, padded in front;
    along a dynamic dim (no static window), a log-step scan (``_dynamic_scan``)."""

    def rule(ctx, x, dim, *, dtype=None):
        value = convert(x, compute_dtype(ctx.out_dtype))
        shape = static_shape(value)
        if not shape:
            return convert(value, ctx.out_dtype)
        dim = normalize_dim(dim, len(shape))
        if shape[dim] == DYNAMIC:
            return convert(_dynamic_scan(ctx, value, dim, init, op), ctx.out_dtype)
        return convert(scan([value], [init], dim, lambda a, b: [op(a, b)])[0], ctx.out_dtype)

    return rule


def _dynamic_scan(ctx, value, dim, init, op):
    """Hillis-Steele scan: step k combines each element with the one 2**k before it (``init`` shifted in by a
    ``dynamic_pad`` that crops as much as it pads, by min(2**k, size)). The step count is static, from the
    dim's upper bound (31 steps, a size's int32 limit, when unbounded); refinement makes every pad static."""
    size_expr = ctx.arg_meta(0).shape[dim]
    size = ctx.size_value(size_expr)
    upper = size_expr.node.shape_env.bound_sympy(size_expr.node.expr).upper
    steps = max(1, (int(upper) - 1).bit_length()) if isinstance(upper, sympy.Integer) else 31
    one_d = ir.RankedTensorType.get([1], size.type.element_type)
    zero_size = ctx.size_value(0)  # ``negate`` does not fold during refinement; ``subtract`` does
    zero = stablehlo.reshape(one_d, zero_size)

    def at_dim(scalar):
        part = stablehlo.reshape(one_d, scalar)
        return stablehlo.concatenate([part if d == dim else zero for d in range(rank(value))], 0)

    fill, interior = constant(init, dtype_of(value)), ctx.shape_value([0] * rank(value))
    for step in range(steps):
        shift = stablehlo.minimum(ctx.size_value(2 ** step), size)
        crop = at_dim(stablehlo.subtract(zero_size, shift))
        shifted = stablehlo.dynamic_pad(value.type, value, fill, at_dim(shift), crop, interior)
        value = op(value, shifted)
    return value


lower(aten.cumsum.default)(_cumulative(stablehlo.add, 0))
lower(aten.cumprod.default)(_cumulative(stablehlo.multiply, 1))


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) as torch's scan computes it: equal infinities give themselves, NaN propagates."""
    high, low = stablehlo.maximum(a, b), stablehlo.minimum(a, b)
    result = stablehlo.add(high, stablehlo.log_plus_one(stablehlo.exponential(stablehlo.subtract(low, high))))
    same_infinity = stablehlo.and_(compare(a, b, "EQ"), chlo.is_inf(a))
    either_nan = stablehlo.or_(is_nan(a), is_nan(b))
    return stablehlo.select(either_nan, stablehlo.add(a, b), stablehlo.select(same_infinity, a, result))


lower(aten.logcumsumexp.default)(_cumulative(_log_add_exp, -math.inf))


def _cumulative_extreme(direction: str):
    """cummax (``GT``) / cummin (``LT``): values and indices; NaN sticks, and ties (NaN ties too) go to the
    last index, as torch's scan does."""

    def rule(ctx, x, dim):
        if rank(x) == 0:
            return x, constant(0, torch.int64)
        dim, dtype = normalize_dim(dim, rank(x)), dtype_of(x)
        if static_shape(x)[dim] == DYNAMIC:
            raise NotImplementedError("cummax/cummin along a dynamic dim")
        init = (lowest if direction == "GT" else highest)(dtype)
        return scan([x, iota(ctx, ctx.arg_meta(0).shape, dim)], [init, -1], dim, arg_picker(direction, dtype, True))

    return rule


lower(aten.cummax.default)(_cumulative_extreme("GT"))
lower(aten.cummin.default)(_cumulative_extreme("LT"))


# -- softmax family ------------------------------------------------------------------------

def _peak(ctx, value, dims):
    """The max over ``dims`` that a shift by the max needs: a plain ``stablehlo.maximum`` (no NaN selects in the
    reducer). Exact here: where a NaN is along ``dims``, the sum of exp (or of the shifted values) is NaN
    whichever peak is taken, so every result along ``dims`` is NaN, as in torch."""
    return reduce(ctx, value, dims, lowest(dtype_of(value)), stablehlo.maximum)


def _shifted(ctx, x, dims):
    """``x`` (in the compute dtype) minus its max over ``dims``, and the sum of exp over ``dims``."""
    value = convert(x, compute_dtype(ctx.out_dtype))
    peak = _peak(ctx, value, dims)
    shifted = stablehlo.subtract(value, _expand(ctx, peak, dims))
    return shifted, _expand(ctx, reduce(ctx, stablehlo.exponential(shifted), dims, 0, stablehlo.add), dims)


@lower(aten.softmax.int, aten._softmax.default)
def softmax(ctx, x, dim, *_, dtype=None):
    """``dtype`` (softmax.int) and ``half_to_float`` (_softmax) are already in the node's output dtype."""
    shifted, total = _shifted(ctx, x, _dims(x, dim))
    return convert(stablehlo.divide(stablehlo.exponential(shifted), total), ctx.out_dtype)


@lower(aten.log_softmax.int, aten._log_softmax.default)
def log_softmax(ctx, x, dim, *_, dtype=None):
    """Along the last dim, torch's CPU kernel keeps the sum and its log in the output dtype; so do we."""
    shifted, total = _shifted(ctx, x, _dims(x, dim))
    if normalize_dim(dim, max(rank(x), 1)) == rank(x) - 1:
        total = round_to(stablehlo.log(round_to(total, ctx.out_dtype)), ctx.out_dtype)
        return convert(stablehlo.subtract(shifted, total), ctx.out_dtype)
    return convert(stablehlo.subtract(shifted, stablehlo.log(total)), ctx.out_dtype)


@lower(aten._safe_softmax.default)
def safe_softmax(ctx, x, dim, dtype=None):
    """Softmax that gives zeros, not NaN, where every input along ``dim`` is -inf (fully masked rows)."""
    dims = _dims(x, dim)
    probabilities = softmax(ctx, x, dim)
    masked = compare(x, full_like(ctx, ctx.arg_meta(0).shape, -math.inf, dtype_of(x)), "EQ")
    fully_masked = _expand(ctx, reduce(ctx, masked, dims, True, stablehlo.and_), dims)
    return stablehlo.select(fully_masked, full_like(ctx, ctx.out_shape, 0, ctx.out_dtype), probabilities)


@lower(aten.logsumexp.default)
def logsumexp(ctx, x, dim, keepdim=False):
    """torch's composite: shift by the max (by zero where it is infinite), exp, sum, log, add the max back;
    each step's result is stored in the output dtype, as torch's separate kernels store it."""
    dims, dtype = _dims(x, dim), ctx.out_dtype
    value = convert(x, compute_dtype(dtype))
    peak = _peak(ctx, value, dims)
    peak = stablehlo.select(chlo.is_inf(peak), full_like(ctx, _kept(ctx, dims)[0], 0, dtype_of(peak)), peak)
    shifted = round_to(stablehlo.subtract(value, _expand(ctx, peak, dims)), dtype)
    total = round_to(reduce(ctx, round_to(stablehlo.exponential(shifted), dtype), dims, 0, stablehlo.add), dtype)
    return _finish(ctx, stablehlo.add(round_to(stablehlo.log(total), dtype), peak))


@lower(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(x, dim)
    magnitude = stablehlo.abs(convert(x, compute_dtype(ctx.out_dtype)))
    return _finish(ctx, p_norm(ctx, magnitude, ctx.arg_meta(0).shape, dims, ord))


# -- row-wise hash and renorm ---------------------------------------------------------------------


@lower(aten.hash_tensor.default)
def hash_tensor(ctx, x, dim=(), *, keepdim=False, mode=0):
    """xor of the elements' bits as uint64, after widening to float64 or int64 (torch's mode 0)."""
    if mode != 0:
        raise NotImplementedError(f"hash_tensor mode={mode} (torch has only mode 0)")
    wide = convert(x, torch.float64 if dtype_of(x).is_floating_point else torch.int64)
    bits = stablehlo.bitcast_convert(with_dtype(wide, torch.uint64), wide)
    dims = normalize_dims(list(dim) or None, rank(x)) if rank(x) else []
    return reshape(ctx, reduce(ctx, bits, dims, 0, stablehlo.xor), ctx.out_shape)


@lower(aten.renorm.default)
def renorm(ctx, x, p, dim, maxnorm):
    """Each slice along ``dim`` whose p-norm exceeds ``maxnorm`` scaled by ``maxnorm / (norm + 1e-7)``; the norm
    and factor in float32 for half types, the factor rounded to x's dtype before the product, as torch does."""
    dtype, sizes = ctx.out_dtype, list(ctx.out_shape)
    dim = normalize_dim(dim, len(sizes))
    value = convert(x, compute_dtype(dtype))
    wide = dtype_of(value)
    dims = [d for d in range(len(sizes)) if d != dim]
    norm = p_norm(ctx, stablehlo.abs(value), sizes, dims, float(p))
    kept = [sizes[dim]]
    factor = stablehlo.divide(full_like(ctx, kept, maxnorm, wide),
                              stablehlo.add(norm, full_like(ctx, kept, 1e-7, wide)))
    over = compare(norm, full_like(ctx, kept, maxnorm, wide), "GT")
    factor = stablehlo.select(over, factor, full_like(ctx, kept, 1, wide))
    factor = round_to(factor, dtype)
    scaled = stablehlo.multiply(value, broadcast_in_dim(ctx, factor, sizes, [dim]))
    return convert(scaled, dtype)
