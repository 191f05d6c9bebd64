"""Flat and strided writes and reads: put/take, scatter with the old ``reduce=`` strings, as_strided_scatter,
diagonal_scatter, segment_reduce, bucketize; and the row-wise hash_tensor and renorm.

Each is one ``gather`` or ``scatter`` through indexing.py's plans (or a compare-and-count for bucketize and
segment ids), lowered directly: torch's decompositions of these ops read index values in Python
(data-dependent guards) or leave mutations that export refuses.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .elementwise import maximum, minimum
from .helpers import (as_tensor, broadcast_in_dim, compare, compute_dtype, convert, dtype_of, full_like,
                      iota, normalize_dim, normalize_dims, promoted_dtype, rank, reduce, reshape, round_to,
                      with_dtype)
from .indexing import IndexPlan, along_dim_plan, gather_plan, index_plan, scatter_plan
from .reductions import p_norm
from .registry import lower
from .shape_ops import strided_slice

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
    value of its own in an exported graph; see shape_ops.as_strided)."""
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


# -- bucketize -----------------------------------------------------------------------------------------


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


# -- row-wise hash and renorm ---------------------------------------------------------------------------


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
