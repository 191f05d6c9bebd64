"""Indexing: embedding, index.Tensor, index_select, gather, index_put, scatter*, masked_fill, select/slice_scatter.

torch's advanced indexing becomes one ``gather`` (reads) or ``scatter`` (writes) through an index plan
(``emit.index_plans``).
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.elementwise import as_tensor, floor_quotient
from ..emit.extremes import highest, lowest
from ..emit.index_plans import (IndexPlan, along_dim_plan, contiguous_start, gather_plan, index_plan,
                                scatter_plan, update_slice)
from ..emit.padded import data_dependent_result
from ..emit.reduce import reduce
from ..emit.sort import true_first
from ..emit.slicing import index_value, slice_bounds, strided_slice, take, wrap_index
from ..promotion import convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, iota, is_static, normalize_dim, reshape
from ..values import dtype_of, rank, static_shape

aten = torch.ops.aten


def _index_metas(ctx, position: int):
    return [None if node is None else node.meta["val"] for node in ctx.node.args[position]]


def _listed(indices, metas) -> dict:
    return {d: (index, meta) for d, (index, meta) in enumerate(zip(indices, metas)) if index is not None}


# -- reads ----------------------------------------------------------------------------


@lower(aten.index.Tensor)
def index(ctx, x, indices):
    x_sizes = ctx.arg_meta(0).shape
    indexed = _listed(indices, _index_metas(ctx, 1))
    if list(indexed) == [0] and indexed[0][1].dtype == torch.bool:
        return _masked_rows(ctx, x, *indexed[0])
    return gather_plan(ctx, x, x_sizes, index_plan(ctx, x_sizes, indexed))


def _masked_rows(ctx, x, mask, mask_meta):
    """``x[mask]`` for one boolean mask over x's leading dims: the selected rows in row-major order, padded to
    one per mask element (``emit.padded``), the number selected as the true size."""
    x_sizes, mask_sizes = list(ctx.arg_meta(0).shape), list(mask_meta.shape)
    if not all(isinstance(s, int) for s in mask_sizes):
        raise NotImplementedError("indexing with a boolean mask of symbolic shape (its result is padded to the "
                                  "mask's element count, which needs static sizes)")
    count = math.prod(mask_sizes)
    rows = [count, *x_sizes[len(mask_sizes):]]
    flat_mask = reshape(ctx, mask, [count])
    order = true_first(ctx, flat_mask, count)
    meta = torch.empty([count], dtype=torch.int64, device="meta")
    padded = gather_plan(ctx, reshape(ctx, x, rows), rows, index_plan(ctx, rows, {0: (order, meta)}))
    selected = reduce(ctx, convert(flat_mask, torch.int64), [0], 0, stablehlo.add)
    return data_dependent_result(ctx, padded, selected, ctx.out_shape[0])


def _along(ctx, x, dim, index, index_meta):
    """One-dim indexing operands with a 0-d ``x`` seen as 1-d and a 0-d index as one element, as torch does:
    ``(x, x_sizes, {dim: (index, meta)})``."""
    x_sizes = list(ctx.arg_meta(0).shape) or [1]
    index_sizes = list(index_meta.shape) or [1]
    meta = torch.empty(index_sizes, dtype=index_meta.dtype, device="meta")
    dim = normalize_dim(dim, len(x_sizes))
    return reshape(ctx, x, x_sizes), x_sizes, {dim: (reshape(ctx, index, index_sizes), meta)}


@lower(aten.index_select.default)
def index_select(ctx, x, dim, index):
    """``x`` indexed along one dim, reshaped to the node's output."""
    x, x_sizes, indexed = _along(ctx, x, dim, index, ctx.arg_meta(2))
    return reshape(ctx, gather_plan(ctx, x, x_sizes, index_plan(ctx, x_sizes, indexed)), ctx.out_shape)


@lower(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` taken as they are: torch's embedding rejects negative indices, so none are wrapped.
    ``padding_idx`` only affects the gradient."""
    return take(ctx, weight, 0, convert(indices, torch.int64), ctx.out_shape)


@lower(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    dim = normalize_dim(dim, rank(x))
    return gather_plan(ctx, x, ctx.arg_meta(0).shape, along_dim_plan(ctx, dim, index, ctx.arg_meta(2).shape))


# -- writes ------------------------------------------------------------------------------


def _put(ctx, x, indexed: dict, values, accumulate: bool, x_sizes=None) -> ir.Value:
    plan = index_plan(ctx, x_sizes or ctx.arg_meta(0).shape, indexed)
    updates = broadcast_to(ctx, convert(values, ctx.out_dtype), plan.sizes)
    return scatter_plan(x, plan, updates, _accumulate(ctx.out_dtype) if accumulate else None)


def _put_along(ctx, x, dim, index, source, combine=None):
    """index_copy/index_add/index_reduce: ``source``'s slices written (or combined) into ``x`` along ``dim``;
    ``combine(x, x_sizes, plan, updates)`` replaces the plain write."""
    x, x_sizes, indexed = _along(ctx, x, dim, index, ctx.arg_meta(2))
    plan = index_plan(ctx, x_sizes, indexed)
    updates = reshape(ctx, convert(source, ctx.out_dtype), plan.sizes)
    result = scatter_plan(x, plan, updates) if combine is None else combine(x, x_sizes, plan, updates)
    return reshape(ctx, result, ctx.out_shape)


def _masked_put(ctx, x, mask, mask_meta, values, accumulate: bool) -> ir.Value:
    """``x[mask] = values`` (or ``+=``) for one boolean mask over x's leading dims, with values that broadcast
    to every selected element (a shape without the data-dependent count of selected elements)."""
    sizes, values_sizes = ctx.out_shape, list(ctx.arg_meta(2).shape)
    window = len(sizes) - mask_meta.dim()
    if any(s != 1 for s in values_sizes[:max(len(values_sizes) - window, 0)]):
        raise NotImplementedError("index_put with a boolean mask and values per selected element has a "
                                  "data-dependent shape; use torch.where instead")
    values = reshape(ctx, convert(values, ctx.out_dtype), values_sizes[max(len(values_sizes) - window, 0):])
    values = broadcast_to(ctx, values, sizes)
    mask = broadcast_in_dim(ctx, convert(mask, torch.bool), sizes, list(range(mask_meta.dim())))
    if accumulate:
        values = _accumulate(ctx.out_dtype)(x, values)
    return stablehlo.select(mask, values, x)


def _accumulate(dtype):
    return stablehlo.or_ if dtype == torch.bool else stablehlo.add


def _put_range(ctx, x, dim: int, index, values, wraps: bool):
    """``values`` written at consecutive positions along ``dim`` (``contiguous_start``) by ``update_slice``,
    which XLA does in place; None where that is not known (dynamic shapes, other indices) and a scatter
    writes them. ``wraps``: a negative index counts from the end (index_put), which a one-element range takes
    and a longer one only when its start is known to be non-negative."""
    start = contiguous_start(ctx, index) if is_static(ctx.out_shape) and rank(x) > 0 else None
    if start is None:
        return None
    sizes = list(ctx.out_shape)
    sizes[dim] = static_shape(index)[0]
    if wraps and sizes[dim] == 1:
        start = wrap_index(ctx, start, ctx.out_shape[dim])
    elif wraps and not ctx.facts.non_negative(index):
        return None
    return update_slice(ctx, x, dim, start, broadcast_to(ctx, convert(values, ctx.out_dtype), sizes))


@lower(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    metas = _index_metas(ctx, 1)
    if len(indices) == 1 and metas[0].dtype in (torch.bool, torch.uint8):
        return _masked_put(ctx, x, indices[0], metas[0], values, accumulate)
    listed = _listed(indices, metas)
    if not accumulate and len(listed) == 1:  # x[:, :, positions] = values
        (dim, (index, meta)), = listed.items()
        written = _put_range(ctx, x, dim, index, values, wraps=True) if meta.dim() == 1 else None
        if written is not None:
            return written
    return _put(ctx, x, listed, values, accumulate)


@lower(aten.index_copy.default)
def index_copy(ctx, x, dim, index, source):
    """A static KV cache's write at ``cache_position``: in place where the positions are a range."""
    written = _put_range(ctx, x, normalize_dim(dim, rank(x)), reshape(ctx, index, [ctx.arg_meta(2).numel()]),
                         source, wraps=False)
    return written if written is not None else _put_along(ctx, x, dim, index, source)


@lower(aten.index_add.default)
def index_add(ctx, x, dim, index, source, *, alpha=1):
    if alpha != 1:
        source = stablehlo.multiply(source, as_tensor(ctx, alpha, dtype_of(source), ctx.arg_meta(3).shape))
    return _put_along(ctx, x, dim, index, source,
                      lambda x, _, plan, updates: scatter_plan(x, plan, updates, _accumulate(ctx.out_dtype)))


@lower(aten.index_reduce.default)
def index_reduce(ctx, x, dim, index, source, reduce, *, include_self=True):
    return _put_along(ctx, x, dim, index, source,
                      lambda x, x_sizes, plan, updates: _reduce_into(ctx, x, x_sizes, plan, updates, reduce,
                                                                     include_self))


def _updates(ctx, src, index_sizes, dtype):
    """scatter's ``src`` cut to the index's shape (it may be larger), or a number as a splat."""
    if not isinstance(src, ir.Value):
        return full_like(ctx, index_sizes, src, dtype)
    r = len(index_sizes)
    return convert(strided_slice(ctx, src, [0] * r, list(index_sizes), [1] * r, index_sizes), dtype)


_COMBINE = {"sum": stablehlo.add, "mean": stablehlo.add, "prod": stablehlo.multiply,
            "amax": stablehlo.maximum, "amin": stablehlo.minimum}


def _identity(reduce: str, dtype: torch.dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    return lowest(dtype) if reduce == "amax" else highest(dtype)


def _scatter_along(ctx, x, dim, index, src, reduce=None, include_self=True):
    """torch.scatter/scatter_add/scatter_reduce: ``x[..., index[i], ...] (reduce)= src[i]`` along ``dim``."""
    dtype = ctx.out_dtype
    index_sizes = ctx.arg_meta(2).shape
    plan = along_dim_plan(ctx, normalize_dim(dim, rank(x)), index, index_sizes)
    updates = _updates(ctx, src, index_sizes, dtype)
    if reduce is None:
        return scatter_plan(x, plan, updates)
    return _reduce_into(ctx, x, ctx.out_shape, plan, updates, reduce, include_self)


def _reduce_into(ctx, x, x_sizes, plan: IndexPlan, updates, reduce: str, include_self: bool):
    """``updates`` (shaped ``plan.sizes``) combined into ``x`` with the reduction ``reduce`` (scatter_reduce's
    names: sum, prod, mean, amax, amin); ``include_self=False`` leaves x's own values out where written."""
    dtype, sizes = ctx.out_dtype, plan.sizes
    if not include_self:  # scattered positions start from the reduction's identity instead of x
        x = scatter_plan(x, plan, full_like(ctx, sizes, _identity(reduce, dtype), dtype))
    result = scatter_plan(x, plan, updates, _COMBINE[reduce])
    if reduce != "mean":
        return result
    counts = scatter_plan(full_like(ctx, x_sizes, int(include_self), dtype), plan,
                      full_like(ctx, sizes, 1, dtype), stablehlo.add)
    counts = stablehlo.maximum(counts, full_like(ctx, x_sizes, 1, dtype))
    if dtype.is_floating_point:
        return stablehlo.divide(result, counts)
    # floor_quotient works in the node's output shape; index_reduce sees a 0-d x as 1-d
    return floor_quotient(ctx, reshape(ctx, result, ctx.out_shape), reshape(ctx, counts, ctx.out_shape))


@lower(aten.scatter.src, aten.scatter.value)
def scatter(ctx, x, dim, index, src):
    return _scatter_along(ctx, x, dim, index, src)


@lower(aten.scatter_add.default)
def scatter_add(ctx, x, dim, index, src):
    return _scatter_along(ctx, x, dim, index, src, "sum")


@lower(aten.scatter_reduce.two)
def scatter_reduce(ctx, x, dim, index, src, reduce, *, include_self=True):
    return _scatter_along(ctx, x, dim, index, src, reduce, include_self)


def _scatter_slices(ctx, x, src, dim: int, positions: ir.Value, count) -> ir.Value:
    """Write ``src`` into ``x`` at the ``count`` 1-d ``positions`` along ``dim`` (src's ``dim`` runs over them)."""
    window = [j for j in range(rank(x)) if j != dim]
    plan = IndexPlan(reshape(ctx, positions, [count, 1]), [dim], window, [])
    return scatter_plan(x, plan, src)


@lower(aten.select_scatter.default)
def select_scatter(ctx, x, src, dim, index):
    dim = normalize_dim(dim, rank(x))
    index = wrap_index(ctx, index, ctx.arg_meta(0).shape[dim])
    sizes = list(ctx.arg_meta(1).shape)
    sizes.insert(dim, 1)
    position = reshape(ctx, index_value(ctx, index), [1])
    return _scatter_slices(ctx, x, reshape(ctx, src, sizes), dim, position, 1)


@lower(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, rank(x))
    start, _ = slice_bounds(ctx, start, end, ctx.arg_meta(0).shape[dim])
    length = ctx.arg_meta(1).shape[dim]
    steps = stablehlo.multiply(iota(ctx, [length], 0), full_like(ctx, [length], step, torch.int64))
    offset = broadcast_in_dim(ctx, index_value(ctx, start), [length], [])
    return _scatter_slices(ctx, x, src, dim, stablehlo.add(steps, offset), length)


# -- masks ---------------------------------------------------------------------------------


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    sizes, dtype = ctx.out_shape, ctx.out_dtype
    return stablehlo.select(broadcast_to(ctx, mask, sizes), as_tensor(ctx, value, dtype, sizes),
                            as_tensor(ctx, x, dtype, sizes))
