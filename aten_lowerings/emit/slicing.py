"""Slices and takes along dims, and the index arithmetic behind them.

Bounds and indices may be Python ints, SymInts or 0-d i64 values: a static ``slice`` is emitted when everything
is known, a ``dynamic_slice`` when the result's sizes are, ``real_dynamic_slice`` otherwise: with unit steps its
limits are its starts plus its sizes, the form shape refinement turns into a ``dynamic_slice`` once the sizes are
known (XLA has no ``real_dynamic_slice``; the bounds are in range, so ``dynamic_slice``'s clamping changes
nothing).
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant
from ..mlir_types import DYNAMIC, tensor_type
from ..shapes import dim_size, is_static
from ..values import dtype_of, rank, static_shape
from .elementwise import compare

# -- index arithmetic on ints, SymInts and 0-d i64 values ----------------------------


def known_int(index):
    """``index`` as a Python int when it is one (or a pinned SymInt), else None."""
    if isinstance(index, int):
        return index
    if isinstance(index, torch.SymInt):
        return index.node.maybe_as_int()
    return None


def index_value(ctx, index) -> ir.Value:
    """An int, SymInt or 0-d i64 value as a 0-d i64 value."""
    return index if isinstance(index, ir.Value) else ctx.size_value(index)


def dim_length(ctx, x: ir.Value, dim: int):
    """Size of one dim: an int when static, else a 0-d i64 value."""
    size = static_shape(x)[dim]
    return size if size != DYNAMIC else dim_size(ctx, x, dim)


def wrap_index(ctx, index, size):
    """A possibly negative index (or 0-d value) made non-negative the way torch does (``index + size``)."""
    static_index, static_size = known_int(index), known_int(size)
    if static_index is not None and static_index >= 0:
        return static_index
    if static_index is not None and static_size is not None:
        return static_index + static_size
    index, size = index_value(ctx, index), index_value(ctx, size)
    return stablehlo.select(compare(index, constant(0, torch.int64), "LT"), stablehlo.add(index, size), index)


def slice_bounds(ctx, start, end, size):
    """torch's ``start:end`` on a dim of ``size``: None means the ends, negatives wrap, both clamp to [0, size]."""
    start = wrap_index(ctx, 0 if start is None else start, size)
    end = wrap_index(ctx, size if end is None else end, size)
    if all(known_int(v) is not None for v in (start, end, size)):
        start = min(max(known_int(start), 0), known_int(size))
        return start, min(max(known_int(end), start), known_int(size))
    zero, size = constant(0, torch.int64), index_value(ctx, size)
    start = stablehlo.clamp(zero, index_value(ctx, start), size)
    return start, stablehlo.clamp(start, index_value(ctx, end), size)


# -- slicing ------------------------------------------------------------------------


def strided_slice(ctx, x: ir.Value, starts, limits, strides, sizes) -> ir.Value:
    """``x[starts:limits:strides]`` with in-range bounds per dim; ``sizes`` are the result's torch sizes."""
    static = [known_int(v) for v in (*starts, *limits, *strides)]
    if None not in static and DYNAMIC not in static_shape(x):
        r = rank(x)
        if static[:r] == [0] * r and static[r:2 * r] == static_shape(x) and static[2 * r:] == [1] * r:
            return x
        return stablehlo.slice(x, static[:r], static[r:2 * r], static[2 * r:])
    steps = [known_int(step) for step in strides]
    if None not in steps and is_static(sizes):  # bounds read from data (a cond's result, .item()), static sizes
        window = [(int(size) - 1) * step + 1 if size else 0 for size, step in zip(sizes, steps)]
        value = stablehlo.dynamic_slice(x, [index_value(ctx, start) for start in starts], window)
        return value if all(step == 1 for step in steps) else stablehlo.slice(value, [0] * len(window), window, steps)
    start_indices = ctx.shape_value(starts)
    if None in steps or all(not isinstance(s, ir.Value) or ctx.dims.is_size(s) for s in starts):
        # bounds that are sizes: refinement makes every operand a constant
        return stablehlo.real_dynamic_slice(tensor_type(sizes, dtype_of(x)), x, start_indices,
                                            ctx.shape_value(limits), ctx.shape_value(strides))
    # starts read from data: the window the slice covers, from its starts to starts + window (refinement makes that
    # a dynamic_slice), then its every step-th element (constant bounds once refined: a slice)
    window = [DYNAMIC if not isinstance(size, int) else max((size - 1) * step + 1, 0) for size, step in zip(sizes, steps)]
    window_sizes = ctx.shape_value(sizes)
    if any(step != 1 for step in steps):
        ones = constant(1, torch.int64, [len(steps)])
        spans = stablehlo.add(stablehlo.multiply(stablehlo.subtract(window_sizes, ones),
                                                 ctx.shape_value(steps)), ones)
        window_sizes = stablehlo.maximum(spans, constant(0, torch.int64, [len(steps)]))
    window_type = tensor_type(sizes, dtype_of(x)) if all(step == 1 for step in steps) else ir.RankedTensorType.get(
        [DYNAMIC if not isinstance(w, int) else w for w in window], ir.RankedTensorType(x.type).element_type)
    covered = stablehlo.real_dynamic_slice(window_type, x, start_indices, stablehlo.add(start_indices, window_sizes),
                                           ctx.shape_value([1] * len(steps)))
    if all(step == 1 for step in steps):
        return covered
    return stablehlo.real_dynamic_slice(tensor_type(sizes, dtype_of(x)), covered, ctx.shape_value([0] * len(steps)),
                                        window_sizes, ctx.shape_value(steps))


def slice_dim(ctx, x: ir.Value, dim: int, start, limit, sizes, step: int = 1) -> ir.Value:
    """``x[start:limit:step]`` along one dim (bounds already in range); ``sizes`` are the result's torch sizes."""
    starts = [0] * rank(x)
    limits = [dim_length(ctx, x, d) for d in range(rank(x))]
    strides = [1] * rank(x)
    starts[dim], limits[dim], strides[dim] = start, limit, step
    return strided_slice(ctx, x, starts, limits, strides, sizes)


def take(ctx, x: ir.Value, dim: int, indices: ir.Value, sizes) -> ir.Value:
    """numpy's ``take``: ``x`` at the in-range int64 ``indices`` (any shape) along ``dim``, whose dims replace
    ``dim``; ``sizes`` are the result's torch sizes."""
    count = rank(indices)
    numbers = stablehlo.GatherDimensionNumbers.get(
        offset_dims=[d for d in range(len(sizes)) if not dim <= d < dim + count], collapsed_slice_dims=[dim],
        operand_batching_dims=[], start_indices_batching_dims=[], start_index_map=[dim], index_vector_dim=count)
    slice_sizes = [*sizes[:dim], 1, *sizes[dim + count:]]
    result_type = tensor_type(sizes, dtype_of(x))
    if is_static(slice_sizes):
        return stablehlo.gather(x, indices, numbers, [known_int(s) for s in slice_sizes], results=[result_type])
    return stablehlo.dynamic_gather(x, indices, ctx.shape_value(slice_sizes), numbers, results=[result_type])
