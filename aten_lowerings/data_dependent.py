"""Ops whose output size depends on the data: nonzero (and argwhere), masked_select, unique (``_unique2``),
unique_consecutive; and the ones with no static bound (repeat_interleave without output_size, bincount), whose
size the call gives (``emit.padded.call_time_sizes``).

Each result is padded to its static upper bound (nonzero's is the input's element count), its true size beside
it (``emit.padded``). The padding rows hold valid values (index 0 for nonzero's coordinates, elements of the
input elsewhere), so an index taken from them stays in range. unique and unique_consecutive need inputs of
static shape.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .constants import constant, full_like
from .emit.elementwise import compare
from .emit.index_plans import IndexPlan, gather_plan, scatter_plan
from .emit.padded import data_dependent_result, given_size
from .emit.reduce import reduce, scan
from .emit.slicing import index_value, slice_dim
from .emit.sort import sort_with_indices, true_first
from .promotion import convert
from .registry import lower
from .shapes import broadcast_in_dim, broadcast_to, iota, reshape
from .values import dtype_of

aten = torch.ops.aten


def _static_shape(ctx) -> list[int]:
    sizes = list(ctx.arg_meta(0).shape)
    if not all(isinstance(s, int) for s in sizes):
        raise NotImplementedError(f"{ctx.node.target} of a tensor with symbolic sizes (its output is padded to a "
                                  "static bound, which needs static input sizes)")
    return sizes


def _count(flat_mask: ir.Value) -> ir.Value:
    """The number of true elements of a 1-d bool value, 0-d i64."""
    return reduce(None, convert(flat_mask, torch.int64), [0], 0, stablehlo.add)


def _gather_1d(ctx, values: ir.Value, length: int, positions: ir.Value, count: int) -> ir.Value:
    """``values[positions]`` for 1-d ``values`` (``length``) and int64 ``positions`` (``count``)."""
    plan = IndexPlan(reshape(ctx, positions, [count, 1]), [0], [], [count])
    return gather_plan(ctx, values, [length], plan)


@lower(aten.nonzero.default)
def nonzero(ctx, x):
    """Coordinates of the nonzero elements, one row each, in row-major order: padded to one row per element
    (with coordinates 0)."""
    sizes = list(ctx.arg_meta(0).shape)
    count = math.prod(sizes)
    flat = reshape(ctx, x, [count])
    mask = flat if dtype_of(x) == torch.bool else compare(flat, full_like(ctx, [count], 0, dtype_of(x)), "NE")
    found = _count(mask)
    if not sizes or (isinstance(count, int) and count == 0):  # no coordinates, or no elements
        return data_dependent_result(ctx, full_like(ctx, [count, len(sizes)], 0, torch.int64), found,
                                     ctx.out_shape[0])
    order = true_first(ctx, mask, count)
    kept = compare(iota(ctx, [count], 0), _splat(ctx, found, count), "LT")
    zero = full_like(ctx, [count], 0, torch.int64)
    columns = []
    for dim, size in enumerate(sizes):
        coordinate = stablehlo.remainder(stablehlo.divide(order, _splat(ctx, math.prod(sizes[dim + 1:]), count)),
                                         _splat(ctx, size, count))
        columns.append(reshape(ctx, stablehlo.select(kept, coordinate, zero), [count, 1]))
    return data_dependent_result(ctx, stablehlo.concatenate(columns, 1), found, ctx.out_shape[0])


def _splat(ctx, size, count) -> ir.Value:
    """A 1-d int64 value of ``count`` elements, each ``size`` (an int, SymInt or 0-d i64 value)."""
    value = size if isinstance(size, ir.Value) else ctx.size_value(size)
    return broadcast_in_dim(ctx, value, [count], [])


@lower(aten.masked_select.default)
def masked_select(ctx, x, mask):
    """The elements of ``x`` where ``mask`` (both broadcast) is true, in row-major order; padded to one per
    element."""
    sizes = list(torch.broadcast_shapes(ctx.arg_meta(0).shape, ctx.arg_meta(1).shape))
    count = math.prod(sizes)
    flat_x = reshape(ctx, broadcast_to(ctx, x, sizes), [count])
    flat_mask = reshape(ctx, broadcast_to(ctx, mask, sizes), [count])
    if isinstance(count, int) and count == 0:
        return data_dependent_result(ctx, flat_x, constant(0, torch.int64), ctx.out_shape[0])
    padded = _gather_1d(ctx, flat_x, count, true_first(ctx, flat_mask, count), count)
    return data_dependent_result(ctx, padded, _count(flat_mask), ctx.out_shape[0])


def _unique_runs(ctx, flat: ir.Value, count: int, positions: ir.Value, return_inverse, return_counts):
    """One value per run of equal elements of 1-d ``flat`` (``count`` > 0 long; ``positions``: where each
    element came from in the input): (values, inverse, counts), values and counts padded to ``count``."""
    previous = stablehlo.concatenate([slice_dim(ctx, flat, 0, 0, 1, [1]),
                                      slice_dim(ctx, flat, 0, 0, count - 1, [count - 1])], 0)
    first = compare(iota(ctx, [count], 0), constant(0, torch.int64, [count]), "EQ")
    starts_run = stablehlo.or_(first, compare(flat, previous, "NE"))  # NaNs are never equal: each its own run
    found = _count(starts_run)
    order = true_first(ctx, starts_run, count)  # the runs' first positions, then the other positions
    inverse_meta, counts_meta = ctx.out_meta[1], ctx.out_meta[2]
    values = data_dependent_result(ctx, _gather_1d(ctx, flat, count, order, count), found, ctx.out_meta[0].shape[0])
    if not return_inverse:
        inverse = full_like(ctx, list(inverse_meta.shape), 0, torch.int64)
    else:  # the run of each element: how many runs start at or before it, less one
        (run_of,) = scan([convert(starts_run, torch.int64)], [0], 0, lambda a, b: [stablehlo.add(a, b)])
        run_of = stablehlo.subtract(run_of, constant(1, torch.int64, [count]))
        inverse = scatter_plan(full_like(ctx, [count], 0, torch.int64),
                               IndexPlan(reshape(ctx, positions, [count, 1]), [0], [], []), run_of)
        inverse = reshape(ctx, inverse, list(inverse_meta.shape))
    if not return_counts:
        counts = full_like(ctx, list(counts_meta.shape), 0, torch.int64)
    else:  # the next run's start (``count`` after the last run) less this run's
        end = constant(count, torch.int64, [count])
        starts = stablehlo.select(compare(iota(ctx, [count], 0), _splat(ctx, found, count), "LT"), order, end)
        ends = stablehlo.concatenate([slice_dim(ctx, starts, 0, 1, count, [count - 1]),
                                      constant(count, torch.int64, [1])], 0)
        counts = data_dependent_result(ctx, stablehlo.subtract(ends, starts), found, counts_meta.shape[0])
    return [values, inverse, counts]


def _empty_unique(ctx, x):
    """unique of no elements: all three outputs empty."""
    zero = constant(0, torch.int64)
    return [data_dependent_result(ctx, reshape(ctx, x, [0]), zero, ctx.out_meta[0].shape[0]),
            full_like(ctx, list(ctx.out_meta[1].shape), 0, torch.int64),
            data_dependent_result(ctx, full_like(ctx, [0], 0, torch.int64), zero, ctx.out_meta[2].shape[0])]


@lower(aten._unique2.default)
def unique2(ctx, x, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique: the distinct values in ascending order (also for ``sorted=False``, which leaves the order
    to the implementation), padded to the input's element count."""
    count = math.prod(_static_shape(ctx))
    if count == 0:
        return _empty_unique(ctx, x)
    values, positions = sort_with_indices(ctx, reshape(ctx, x, [count]), 0, False, [count])
    return _unique_runs(ctx, values, count, positions, return_inverse, return_counts)


@lower(aten.unique_consecutive.default)
def unique_consecutive(ctx, x, return_inverse=False, return_counts=False, dim=None):
    """One element per run of equal consecutive elements (of the flattened input), padded to its element
    count."""
    if dim is not None:
        raise NotImplementedError("unique_consecutive along a dim (dim=...) is not supported; only flattened")
    count = math.prod(_static_shape(ctx))
    if count == 0:
        return _empty_unique(ctx, x)
    return _unique_runs(ctx, reshape(ctx, x, [count]), count, iota(ctx, [count], 0), return_inverse,
                        return_counts)


@lower(aten.repeat_interleave.Tensor)
def repeat_interleave(ctx, repeats, *, output_size=None):
    """``repeat_interleave(repeats)``: index i repeated repeats[i] times. The output size is ``output_size``, or
    the sum of the repeats, which has no bound: a size the call gives (``emit.padded.given_size``)."""
    size, length = ctx.out_shape[0], ctx.arg_meta(0).shape[0]
    pinned = size if isinstance(size, int) else size.node.maybe_as_int()
    if isinstance(pinned, int) and isinstance(length, int) and (pinned == 0 or length == 0):
        return full_like(ctx, [pinned], 0, torch.int64)
    counts = convert(repeats, torch.int64)
    if isinstance(length, int):
        (ends,) = scan([counts], [0], 0, lambda a, b: [stablehlo.add(a, b)])
    else:  # a scan's window needs a static length: each end sums the counts up to it
        square = [length, length]
        upto = compare(iota(ctx, square, 1), iota(ctx, square, 0), "LE")
        ends = reduce(ctx, stablehlo.select(upto, broadcast_in_dim(ctx, counts, square, [1]),
                                            full_like(ctx, square, 0, torch.int64)), [1], 0, stablehlo.add)
    if pinned is None and not given_size(ctx, size, reduce(ctx, counts, [0], 0, stablehlo.add)):
        raise NotImplementedError(
            "repeat_interleave's output size is the sum of the repeats, data-dependent and unbounded; pass "
            "output_size=N (the known total) so the output has a static size")
    # output i takes the index of the first run ending after i: how many runs end at or before i
    grid = [size, length]
    ended = convert(compare(broadcast_in_dim(ctx, ends, grid, [1]), iota(ctx, grid, 0), "LE"), torch.int64)
    index = reduce(ctx, ended, [1], 0, stablehlo.add)
    last = stablehlo.subtract(ctx.size_value(length), ctx.size_value(1))
    return stablehlo.clamp(ctx.size_value(0), index, last)


@lower(aten.bincount.default)
def bincount(ctx, x, weights=None, minlength=0):
    """How many times (or with what summed weight) each value in [0, n) occurs in ``x``, n = max(max(x) + 1,
    minlength): a size with no bound that the call gives (``emit.padded.given_size``); every value is compared
    with every element at once."""
    size, length = ctx.out_shape[0], ctx.arg_meta(0).shape[0]
    values = convert(x, torch.int64)
    highest = stablehlo.add(reduce(ctx, values, [0], -1, stablehlo.maximum), ctx.size_value(1))
    if not given_size(ctx, size, stablehlo.maximum(highest, index_value(ctx, minlength))):
        raise NotImplementedError(
            "bincount's output size is max(x) + 1, data-dependent and unbounded, so no padded result can hold it; "
            "for values known to lie in [0, N), count with torch.zeros(N).scatter_add_(0, x, weights) or "
            "torch.nn.functional.one_hot(x, N).sum(0)")
    grid = [size, length]
    hits = compare(iota(ctx, grid, 0), broadcast_in_dim(ctx, values, grid, [1]), "EQ")
    counted = full_like(ctx, grid, 1, ctx.out_dtype) if weights is None else \
        broadcast_in_dim(ctx, convert(weights, ctx.out_dtype), grid, [1])
    return reduce(ctx, stablehlo.select(hits, counted, full_like(ctx, grid, 0, ctx.out_dtype)), [1], 0, stablehlo.add)
