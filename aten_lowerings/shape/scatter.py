"""Flat and strided writes and reads: put/take, scatter with the old ``reduce=`` strings, as_strided_scatter,
diagonal_scatter, segment_reduce.

Each is one ``gather`` or ``scatter`` through an index plan (``emit.index_plans``; segment ids by a
compare-and-count), lowered directly: torch's decompositions of these ops read index values in Python
(data-dependent guards) or leave mutations that export refuses.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.elementwise import compare
from ..emit.extremes import maximum, minimum
from ..emit.index_plans import IndexPlan, along_dim_plan, gather_plan, index_plan, scatter_plan
from ..emit.reduce import reduce
from ..emit.slicing import strided_slice
from ..promotion import convert
from ..registry import lower
from ..shapes import broadcast_in_dim, iota, normalize_dim, reshape
from ..values import rank

aten, prims = torch.ops.aten, torch.ops.prims


# -- flat put / take -----------------------------------------------------------------------


def _flat_plan(ctx, index, index_meta) -> IndexPlan:
    """``index`` (wrapped like torch) into the row-major flattening of argument 0."""
    count = index_meta.numel()
    meta = torch.empty([count], dtype=index_meta.dtype, device="meta")
    return index_plan(ctx, [ctx.arg_meta(0).numel()], {0: (reshape(ctx, index, [count]), meta)})


@lower(aten.take.default)
def take(ctx, x, index):
    flat = reshape(ctx, x, [ctx.arg_meta(0).numel()])
    plan = _flat_plan(ctx, index, ctx.arg_meta(1))
    return reshape(ctx, gather_plan(ctx, flat, [ctx.arg_meta(0).numel()], plan), ctx.out_shape)


@lower(aten.put.default)
def put(ctx, x, index, source, accumulate=False):
    plan = _flat_plan(ctx, index, ctx.arg_meta(1))
    flat = reshape(ctx, x, [ctx.arg_meta(0).numel()])
    updates = reshape(ctx, convert(source, ctx.out_dtype), plan.sizes)
    combine = (stablehlo.or_ if ctx.out_dtype == torch.bool else stablehlo.add) if accumulate else None
    return reshape(ctx, scatter_plan(flat, plan, updates, combine), ctx.out_shape)


# -- scatter with reduce='add' / 'multiply' ---------------------------------------------------------


_OLD_REDUCE = {"add": (stablehlo.add, stablehlo.or_), "multiply": (stablehlo.multiply, stablehlo.and_)}


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_string(ctx, x, dim, index, src, *, reduce):
    """torch.scatter's legacy ``reduce=``: 'add' or 'multiply' into ``x`` (or/and for bool); ``src`` may be
    larger than ``index`` (only its leading block is read) or a number."""
    dtype, index_sizes = ctx.out_dtype, ctx.arg_meta(2).shape
    if isinstance(src, ir.Value):
        r = len(index_sizes)
        updates = convert(strided_slice(ctx, src, [0] * r, list(index_sizes), [1] * r, index_sizes), dtype)
    else:
        updates = full_like(ctx, index_sizes, src, dtype)
    plan = along_dim_plan(ctx, normalize_dim(dim, rank(x)), index, index_sizes)
    return scatter_plan(x, plan, updates, _OLD_REDUCE[reduce][dtype == torch.bool])


# -- strided and diagonal writes ---------------------------------------------------------------------


@lower(aten.as_strided_scatter.default, prims.as_strided_scatter.default)
def as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    """``src`` written at element ``storage_offset + sum(i_d * stride_d)`` of x's row-major flattening (x is a
    value of its own in an exported graph; see views.as_strided)."""
    sizes, count = ctx.arg_meta(1).shape, ctx.arg_meta(1).numel()
    offset = ctx.literal(4, "storage_offset") or 0
    position = broadcast_in_dim(ctx, ctx.size_value(offset), sizes, [])
    for d, step in enumerate(ctx.literal(3, "stride")):
        steps = stablehlo.multiply(iota(ctx, sizes, d), broadcast_in_dim(ctx, ctx.size_value(step), sizes, []))
        position = stablehlo.add(position, steps)
    plan = IndexPlan(reshape(ctx, position, [count, 1]), [0], [], [count])
    flat = reshape(ctx, x, [ctx.arg_meta(0).numel()])
    updates = reshape(ctx, convert(src, ctx.out_dtype), [count])
    return reshape(ctx, scatter_plan(flat, plan, updates), ctx.out_shape)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
    """``src`` (x's other dims, then the diagonal) written at full coordinates: its own position along the other
    dims, ``(i + row, i + col)`` along ``dim1``/``dim2``."""
    ndim = rank(x)
    dim1, dim2 = normalize_dim(dim1, ndim), normalize_dim(dim2, ndim)
    sizes = list(ctx.arg_meta(1).shape)
    if any(isinstance(s, int) and s == 0 for s in sizes):  # an empty diagonal
        return x
    diagonal = iota(ctx, sizes, len(sizes) - 1)
    other = iter(range(len(sizes) - 1))
    columns = []
    for d in range(ndim):
        if d in (dim1, dim2):
            start = max(-offset, 0) if d == dim1 else max(offset, 0)
            column = stablehlo.add(diagonal, full_like(ctx, sizes, start, torch.int64))
        else:
            column = iota(ctx, sizes, next(other))
        columns.append(reshape(ctx, column, [*sizes, 1]))
    plan = IndexPlan(stablehlo.concatenate(columns, len(sizes)), list(range(ndim)), [], sizes)
    return scatter_plan(x, plan, convert(src, ctx.out_dtype))


# -- segment_reduce ------------------------------------------------------------------------------------


def _segment_ends(ctx, lengths, lead, segments):
    """Inclusive running sums of ``lengths`` (``(*lead, segments)``) along the last dim."""
    square = [*lead, segments, segments]
    inner = len(lead)
    taken = compare(iota(ctx, square, inner + 1), iota(ctx, square, inner), "LE")  # i <= k
    spread = broadcast_in_dim(ctx, lengths, square, [*range(inner), inner + 1])
    return reduce(ctx, stablehlo.select(taken, spread, full_like(ctx, square, 0, torch.int64)), [inner + 1], 0,
                  stablehlo.add)


def _segment_ids(ctx, data_sizes, axis, ends, start):
    """Segment of each position along ``axis``: how many segments end at or before it (``segments``, out of
    range and so dropped by the scatter, before ``start``), broadcast to ``data_sizes``."""
    lead, length, segments = list(data_sizes[:axis]), data_sizes[axis], ctx.out_shape[axis]
    grid = [*lead, length, segments]
    position = iota(ctx, grid, axis)
    ended = compare(broadcast_in_dim(ctx, ends, grid, [*range(axis), axis + 1]), position, "LE")
    ids = reduce(ctx, convert(ended, torch.int64), [axis + 1], 0, stablehlo.add)
    before = compare(iota(ctx, [*lead, length], axis),
                     broadcast_in_dim(ctx, reshape(ctx, start, lead), [*lead, length], list(range(axis))), "LT")
    ids = stablehlo.select(before, broadcast_in_dim(ctx, ctx.size_value(segments), [*lead, length], []), ids)
    return broadcast_in_dim(ctx, ids, data_sizes, list(range(axis + 1)))


_SEGMENT = {"sum": (stablehlo.add, 0), "mean": (stablehlo.add, 0), "prod": (stablehlo.multiply, 1),
            "max": (maximum, -math.inf), "min": (minimum, math.inf)}


@lower(aten.segment_reduce.default)
def segment_reduce(ctx, data, reduce_, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    """Each segment reduced from ``initial`` (else the reduction's identity); an empty segment keeps it, except
    that an empty mean without ``initial`` is NaN, as torch's kernel does."""
    if lengths is None and offsets is None:
        raise NotImplementedError("segment_reduce with indices (torch supports only lengths and offsets)")
    data_sizes, out_sizes, dtype = ctx.arg_meta(0).shape, ctx.out_shape, ctx.out_dtype
    axis = normalize_dim(axis, len(data_sizes))
    lead, segments = list(data_sizes[:axis]), out_sizes[axis]
    if offsets is not None:
        offsets = convert(offsets, torch.int64)
        edges = [*lead, segments]
        r = axis + 1
        start = strided_slice(ctx, offsets, [0] * r, [*lead, 1], [1] * r, [*lead, 1])
        ends = strided_slice(ctx, offsets, [0] * axis + [1], [*lead, segments + 1], [1] * r, edges)
        lengths = stablehlo.subtract(ends, strided_slice(ctx, offsets, [0] * r, [*lead, segments], [1] * r, edges))
    else:
        lengths = convert(lengths, torch.int64)
        ends, start = _segment_ends(ctx, lengths, lead, segments), full_like(ctx, [*lead, 1], 0, torch.int64)
    ids = _segment_ids(ctx, data_sizes, axis, ends, start)
    combine, identity = _SEGMENT[reduce_]
    result = scatter_plan(full_like(ctx, out_sizes, identity if initial is None else initial, dtype),
                          along_dim_plan(ctx, axis, ids, data_sizes), convert(data, dtype), combine)
    if reduce_ != "mean":
        return result
    counts = broadcast_in_dim(ctx, lengths, out_sizes, list(range(axis + 1)))
    empty = compare(counts, full_like(ctx, out_sizes, 0, torch.int64), "EQ")
    divided = stablehlo.divide(result, convert(stablehlo.select(empty, full_like(ctx, out_sizes, 1, torch.int64),
                                                                counts), dtype))
    kept = result if initial is not None else full_like(ctx, out_sizes, math.nan, dtype)
    return stablehlo.select(empty, kept, divided)
