"""Sorting, and compaction by sorting: sort (default and stable), topk, order statistics (kthvalue, median,
nanmedian, mode), bucketing (searchsorted, histc, bucketize), masked_scatter, nonzero_static
(nonzero itself, data-dependent in size, is in ``data_dependent``).

Sorts are ``emit.sort``'s: always stable, so ties keep their input order (what ``stable=True`` asks for,
and what torch's CPU kernels give for the other overloads too), NaN above every number.
argsort is the sort's indices; msort decomposes to ``sort``.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .constants import constant, full_like
from .emit.elementwise import as_tensor, compare
from .emit.index_plans import IndexPlan, along_dim_plan, gather_plan, scatter_plan
from .emit.reduce import arg_extreme, reduce, scan
from .emit.slicing import slice_dim, take
from .emit.sort import sort_with_indices, true_first
from .promotion import convert, promoted_dtype
from .registry import lower
from .shapes import broadcast_in_dim, broadcast_to, iota, normalize_dim, reshape
from .values import dtype_of, rank

aten = torch.ops.aten


@lower(aten.sort.default)
def sort(ctx, x, dim=-1, descending=False):
    return sort_with_indices(ctx, x, dim, descending)


@lower(aten.sort.stable)
def sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return sort_with_indices(ctx, x, dim, descending)


@lower(aten.argsort.default)
def argsort(ctx, x, dim=-1, descending=False):
    return sort_with_indices(ctx, x, dim, descending)[1]


@lower(aten.argsort.stable)
def argsort_stable(ctx, x, *, stable=False, dim=-1, descending=False):
    return sort_with_indices(ctx, x, dim, descending)[1]


@lower(aten.topk.default)
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    """The first ``k`` of a full sort; ``sorted=False`` leaves the order to the implementation, so sorted it is."""
    values, indices = sort_with_indices(ctx, x, dim, descending=largest)
    if rank(x) == 0:
        return values, indices
    dim = normalize_dim(dim, rank(x))
    sizes = ctx.out_meta[0].shape
    return [slice_dim(ctx, v, dim, 0, k, sizes) for v in (values, indices)]


# -- order statistics ------------------------------------------------------------------
# torch finds these with a quickselect (kthvalue, median) or an unstable sort (mode), so where equal values
# make the index ambiguous it may name another occurrence than the stable sort here does; values agree.


def _rows(ctx, x, dim):
    """``x`` and its torch sizes with ``dim`` normalized; ``dim=None`` (and a 0-d ``x``) flattens."""
    sizes = list(ctx.arg_meta(0).shape)
    if dim is None or not sizes:
        sizes = [math.prod(sizes)]
        return reshape(ctx, x, sizes), sizes, 0
    return x, sizes, normalize_dim(dim, len(sizes))


def _ranked(ctx, x, dim, position):
    """Value and index of the element at sorted ``position`` along ``dim`` (a number, or an int64 tensor of
    the input's sizes with ``dim`` 1), as the node's outputs (or output, for a value alone)."""
    x, sizes, dim = _rows(ctx, x, dim)
    values, indices = sort_with_indices(ctx, x, dim, False, sizes)
    row = sizes[:dim] + [1] + sizes[dim + 1:]
    if not isinstance(position, ir.Value):
        position = full_like(ctx, row, position, torch.int64)
    plan = along_dim_plan(ctx, dim, position, row)
    metas = ctx.out_meta if isinstance(ctx.out_meta, (tuple, list)) else [ctx.out_meta]
    return [reshape(ctx, gather_plan(ctx, v, sizes, plan), meta.shape) for v, meta in zip((values, indices), metas)]


@lower(aten.kthvalue.default)
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
    """``k`` a number, or a symbolic one (a 0-d i64 value: ``min(n.item(), 128)``), the same for every row."""
    if not isinstance(k, ir.Value):
        return _ranked(ctx, x, dim, k - 1)
    _, sizes, axis = _rows(ctx, x, dim)
    row = sizes[:axis] + [1] + sizes[axis + 1:]
    position = stablehlo.subtract(convert(k, torch.int64), constant(1, torch.int64))
    return _ranked(ctx, x, dim, broadcast_in_dim(ctx, position, row, []))


def _middle(ctx, x, dim, skip_nan: bool):
    """Sorted position of each row's median along ``dim`` (kept, as 1): the lower middle of its numbers
    (NaN sorts after them); with NaN in the row and not ``skip_nan``, its first NaN."""
    flat, sizes, dim = _rows(ctx, x, dim)
    row, n = sizes[:dim] + [1] + sizes[dim + 1:], sizes[dim]
    if not dtype_of(x).is_floating_point:
        return (n - 1) // 2
    numbers = reshape(ctx, reduce(ctx, convert(compare(flat, flat, "EQ"), torch.int64), [dim], 0, stablehlo.add), row)
    one, two = full_like(ctx, row, 1, torch.int64), full_like(ctx, row, 2, torch.int64)
    if skip_nan:  # (count - 1) / 2 truncates toward zero, so a row without numbers takes position 0
        return stablehlo.divide(stablehlo.subtract(numbers, one), two)
    has_nan = compare(numbers, full_like(ctx, row, n, torch.int64), "LT")
    return stablehlo.select(has_nan, numbers, full_like(ctx, row, (n - 1) // 2, torch.int64))


def _median(skip_nan: bool):
    def rule(ctx, x, dim=None, keepdim=False):
        result = _ranked(ctx, x, dim, _middle(ctx, x, dim, skip_nan))
        return result if dim is not None else result[0]

    return rule


lower(aten.median.default, aten.median.dim)(_median(False))
lower(aten.nanmedian.default, aten.nanmedian.dim)(_median(True))


@lower(aten.mode.default)
def mode(ctx, x, dim=-1, keepdim=False):
    """The smallest of the most frequent values and its last index (as torch's scan over its sorted row):
    in a stable sort, each run of equal values ends at its last index; runs are counted from their starts."""
    if rank(x) == 0:
        return x, constant(0, torch.int64)
    x, sizes, dim = _rows(ctx, x, dim)
    values, indices = sort_with_indices(ctx, x, dim, False, sizes)
    n = sizes[dim]
    inner = sizes[:dim] + [n - 1] + sizes[dim + 1:]
    differ = compare(slice_dim(ctx, values, dim, 1, n, inner), slice_dim(ctx, values, dim, 0, n - 1, inner), "NE")
    true, low = constant(True, torch.bool), [0] * len(sizes)
    low[dim] = 1
    starts = stablehlo.pad(differ, true, low, [0] * len(sizes), [0] * len(sizes))
    ends = stablehlo.pad(differ, true, [0] * len(sizes), low, [0] * len(sizes))
    position, zero = iota(ctx, sizes, dim), full_like(ctx, sizes, 0, torch.int64)
    run_start = scan([stablehlo.select(starts, position, zero)], [0], dim, lambda a, b: [stablehlo.maximum(a, b)])[0]
    run = stablehlo.add(stablehlo.subtract(position, run_start), full_like(ctx, sizes, 1, torch.int64))
    most = arg_extreme(ctx, stablehlo.select(ends, run, zero), dim, "GT")[1]  # ties: the first (smallest) value
    row = sizes[:dim] + [1] + sizes[dim + 1:]
    plan = along_dim_plan(ctx, dim, reshape(ctx, most, row), row)
    return [reshape(ctx, gather_plan(ctx, v, sizes, plan), meta.shape) for v, meta in zip((values, indices), ctx.out_meta)]


# -- bucketing ---------------------------------------------------------------------------


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(ctx, boundaries, x, *, out_int32=False, right=False, side=None, sorter=None):
    """How many boundaries (in the last dim, per row of leading dims, or one 1-d row for all) lie below each
    value (at or below with ``right``): a comparison against every boundary, summed."""
    sizes, out = list(ctx.arg_meta(0).shape), list(ctx.out_shape)
    if sorter is not None and sizes[-1] != 0:
        boundaries = gather_plan(ctx, boundaries, sizes, along_dim_plan(ctx, len(sizes) - 1, sorter, sizes))
    pairs = out + [sizes[-1]]
    spread = broadcast_in_dim(ctx, boundaries, pairs, [len(out)] if len(sizes) == 1 else
                              list(range(len(out) - 1)) + [len(out)])
    values = x if isinstance(x, ir.Value) else constant(x, dtype_of(boundaries))
    values = broadcast_in_dim(ctx, convert(values, dtype_of(boundaries)), pairs, list(range(rank(values))))
    below = compare(spread, values, "LE" if right or side == "right" else "LT")
    return convert(reduce(ctx, convert(below, torch.int64), [len(out)], 0, stablehlo.add), ctx.out_dtype)


@lower(aten.histc.default)
def histc(ctx, x, bins=100, min=0, max=0):
    """Counts of ``bins`` equal bins over [min, max] (the data's range if min == max, widened by 1 either
    way if that is empty); bin floor((x - min) * bins / (max - min)), the last bin closed, as torch's kernel."""
    count, dtype = math.prod(ctx.arg_meta(0).shape), dtype_of(x)
    flat = reshape(ctx, x, [count])
    low, high = constant(min, dtype), constant(max, dtype)
    if min == max:
        low = reduce(ctx, flat, [0], math.inf, stablehlo.minimum)
        high = reduce(ctx, flat, [0], -math.inf, stablehlo.maximum)
        empty = compare(low, high, "EQ")
        low = stablehlo.select(empty, stablehlo.subtract(low, constant(1, dtype)), low)
        high = stablehlo.select(empty, stablehlo.add(high, constant(1, dtype)), high)
    low, high = (broadcast_in_dim(ctx, v, [count], []) for v in (low, high))
    inside = stablehlo.and_(compare(flat, low, "GE"), compare(flat, high, "LE"))
    scaled = stablehlo.multiply(stablehlo.subtract(flat, low), full_like(ctx, [count], bins, dtype))
    position = convert(stablehlo.divide(scaled, stablehlo.subtract(high, low)), torch.int64)
    position = stablehlo.clamp(constant(0, torch.int64), position, constant(bins - 1, torch.int64))
    plan = IndexPlan(reshape(ctx, position, [count, 1]), [0], [], [count])
    return scatter_plan(full_like(ctx, [bins], 0, dtype), plan, convert(inside, dtype), stablehlo.add)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    """How many boundaries are not ``>=`` x (``>`` with ``right``): torch's binary search over sorted
    boundaries, NaN x past every one."""
    sizes = list(ctx.out_shape)
    count = ctx.arg_meta(1).shape[0]
    dtype = promoted_dtype(x, boundaries)
    grid = [*sizes, count]
    values = as_tensor(ctx, x, dtype, sizes)
    values = broadcast_in_dim(ctx, values, grid, list(range(len(sizes))))
    edges = broadcast_in_dim(ctx, convert(boundaries, dtype), grid, [len(sizes)])
    beyond = stablehlo.not_(compare(edges, values, "GT" if right else "GE"))
    return convert(reduce(ctx, convert(beyond, torch.int64), [len(sizes)], 0, stablehlo.add), ctx.out_dtype)


# -- compaction ---------------------------------------------------------------------


@lower(aten.masked_scatter.default)
def masked_scatter(ctx, x, mask, source):
    """The i-th true element of the mask takes ``source``'s i-th element (in row-major order)."""
    count, available = math.prod(ctx.out_shape), math.prod(ctx.arg_meta(2).shape)
    flat_mask = reshape(ctx, broadcast_to(ctx, mask, ctx.out_shape), [count])
    flat_x = reshape(ctx, broadcast_to(ctx, x, ctx.out_shape), [count])
    order = reshape(ctx, true_first(ctx, flat_mask, count), [count, 1])
    rank_of = scatter_plan(full_like(ctx, [count], 0, torch.int64), IndexPlan(order, [0], [], []), iota(ctx, [count], 0))
    last = constant(max(available - 1, 0), torch.int64) if isinstance(available, int) else ctx.dims.size(available - 1)
    taken = stablehlo.clamp(constant(0, torch.int64), rank_of, last)
    plan = IndexPlan(reshape(ctx, taken, [count, 1]), [0], [], [count])
    values = gather_plan(ctx, reshape(ctx, source, [available]), [available], plan)
    return reshape(ctx, stablehlo.select(flat_mask, values, flat_x), ctx.out_shape)


@lower(aten.nonzero_static.default)
def nonzero_static(ctx, x, *, size, fill_value=-1):
    """The first ``size`` coordinates of nonzero elements, padded with rows of ``fill_value``. Sizes come from the
    metas (the input's and ``size`` may be symbolic)."""
    sizes, size = list(ctx.arg_meta(0).shape), ctx.out_shape[0]
    count = math.prod(sizes)
    nonzero = compare(x, full_like(ctx, sizes, 0, dtype_of(x)), "NE") if dtype_of(x) != torch.bool else x
    flat = reshape(ctx, nonzero, [count])
    order = true_first(ctx, flat, count)
    if not (isinstance(size, int) and isinstance(count, int)):  # rows past the elements are masked below
        last = stablehlo.maximum(stablehlo.subtract(ctx.size_value(count), ctx.size_value(1)), ctx.size_value(0))
        rows = stablehlo.clamp(ctx.size_value(0), iota(ctx, [size], 0), broadcast_in_dim(ctx, last, [size], []))
        order = take(ctx, order, 0, rows, [size])
    elif size > count:
        zero = constant(0, torch.int64)
        order = stablehlo.pad(order, zero, [0], [size - count], [0])
    else:
        order = slice_dim(ctx, order, 0, 0, size, [size])
    found = reduce(ctx, convert(flat, torch.int64), [0], 0, stablehlo.add)
    kept = compare(iota(ctx, [size], 0), broadcast_in_dim(ctx, found, [size], []), "LT")
    columns = []
    for dim, stride in enumerate(_strides(sizes)):
        stride, length = (broadcast_in_dim(ctx, ctx.size_value(n), [size], []) for n in (stride, sizes[dim]))
        coordinate = stablehlo.remainder(stablehlo.divide(order, stride), length)
        coordinate = stablehlo.select(kept, coordinate, full_like(ctx, [size], fill_value, torch.int64))
        columns.append(reshape(ctx, coordinate, [size, 1]))
    if not columns:
        return full_like(ctx, ctx.out_shape, 0, torch.int64)
    return stablehlo.concatenate(columns, 1)


def _strides(sizes) -> list[int]:
    return [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
