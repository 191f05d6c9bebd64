"""Indexing: embedding, index.Tensor, index_select, gather, index_put, scatter*, masked_fill, select/slice_scatter.

torch's advanced indexing becomes one ``gather`` (reads) or ``scatter`` (writes):
the index tensors are broadcast together, wrapped, and stacked along a last
dim; dims without an index are whole windows. ``gather``/``scatter`` along a
dim use full coordinates (iota for every other dim).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .elementwise import floor_quotient
from .helpers import (as_tensor, broadcast_in_dim, broadcast_to, compare, convert, dtype_of, full_like, iota,
                      is_static, normalize_dim, rank, reshape, value_type)
from .mlir_types import tensor_type
from .registry import lower
from .shape_ops import index_value, slice_bounds, strided_slice, wrap_index

aten = torch.ops.aten


class IndexPlan(NamedTuple):
    """Where the index tensors go: ``indices`` is (batch..., len(dims)) int64."""
    indices: ir.Value
    dims: list[int]            # the operand dims that are indexed
    window_positions: list[int]  # result position of each non-indexed operand dim
    sizes: list                # torch sizes of the indexed result


def index_plan(ctx, x_sizes, indexed: dict[int, tuple[ir.Value, object]]) -> IndexPlan:
    """Plan torch advanced indexing of a tensor of ``x_sizes`` by ``{dim: (index value, index meta)}``.

    If the indexed dims are adjacent the broadcast index dims replace them in
    place; otherwise they go first, as in torch.
    """
    for _, meta in indexed.values():
        if meta.dtype in (torch.bool, torch.uint8):
            raise NotImplementedError("indexing with a boolean mask has a data-dependent shape; "
                                      "use torch.where or masked_fill instead")
    dims = sorted(indexed)
    batch = list(torch.broadcast_shapes(*[meta.shape for _, meta in indexed.values()]))
    columns = []
    for d in dims:
        index = broadcast_to(ctx, convert(indexed[d][0], torch.int64), batch)
        size = broadcast_in_dim(ctx, ctx.size_value(x_sizes[d]), batch, [])
        negative = compare(index, full_like(ctx, batch, 0, torch.int64), "LT")
        wrapped = stablehlo.select(negative, stablehlo.add(index, size), index)
        columns.append(reshape(ctx, wrapped, [*batch, 1]))
    indices = columns[0] if len(columns) == 1 else stablehlo.concatenate(columns, len(batch))

    window = [d for d in range(len(x_sizes)) if d not in indexed]
    first = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
    positions = [j if j < first else j + len(batch) for j in range(len(window))]
    sizes = [x_sizes[d] for d in window]
    sizes[first:first] = batch
    return IndexPlan(indices, dims, positions, sizes)


def gather_plan(ctx, x, x_sizes, plan: IndexPlan) -> ir.Value:
    numbers = stablehlo.GatherDimensionNumbers.get(
        offset_dims=plan.window_positions, collapsed_slice_dims=plan.dims, operand_batching_dims=[],
        start_indices_batching_dims=[], start_index_map=plan.dims, index_vector_dim=rank(plan.indices) - 1)
    slice_sizes = [1 if d in plan.dims else s for d, s in enumerate(x_sizes)]
    result_type = tensor_type(plan.sizes, dtype_of(x))
    if is_static(slice_sizes):
        return stablehlo.gather(x, plan.indices, numbers, [int(s) for s in slice_sizes], results=[result_type])
    return stablehlo.dynamic_gather(x, plan.indices, ctx.shape_value(slice_sizes), numbers, results=[result_type])


def scatter_plan(x, plan: IndexPlan, updates, combine=None) -> ir.Value:
    """Write ``updates`` (shaped like the indexed result) into ``x``; ``combine(old, new)`` or replace."""
    numbers = stablehlo.ScatterDimensionNumbers.get(
        update_window_dims=plan.window_positions, inserted_window_dims=plan.dims, input_batching_dims=[],
        scatter_indices_batching_dims=[], scattered_dims_to_operand_dims=plan.dims,
        index_vector_dim=rank(plan.indices) - 1)
    op = stablehlo.ScatterOp([value_type(x)], [x], plan.indices, [convert(updates, dtype_of(x))], numbers)
    scalar = ir.RankedTensorType.get([], value_type(x).element_type)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        old, new = block.arguments
        stablehlo.return_([new if combine is None else combine(old, new)])
    return op.result


def _index_metas(ctx, position: int):
    return [None if node is None else node.meta["val"] for node in ctx.node.args[position]]


def _listed(indices, metas) -> dict:
    return {d: (index, meta) for d, (index, meta) in enumerate(zip(indices, metas)) if index is not None}


# -- reads ----------------------------------------------------------------------------


@lower(aten.index.Tensor)
def index(ctx, x, indices):
    x_sizes = ctx.arg_meta(0).shape
    return gather_plan(ctx, x, x_sizes, index_plan(ctx, x_sizes, _listed(indices, _index_metas(ctx, 1))))


def _along(ctx, x, dim, index, index_meta):
    """One-dim indexing operands with a 0-d ``x`` seen as 1-d and a 0-d index as one element, as torch does:
    ``(x, x_sizes, {dim: (index, meta)})``."""
    x_sizes = list(ctx.arg_meta(0).shape) or [1]
    index_sizes = list(index_meta.shape) or [1]
    meta = torch.empty(index_sizes, dtype=index_meta.dtype, device="meta")
    dim = normalize_dim(dim, len(x_sizes))
    return reshape(ctx, x, x_sizes), x_sizes, {dim: (reshape(ctx, index, index_sizes), meta)}


def _take(ctx, x, dim, index, index_meta):
    """``x`` indexed along one dim (index_select, embedding), reshaped to the node's output."""
    x, x_sizes, indexed = _along(ctx, x, dim, index, index_meta)
    return reshape(ctx, gather_plan(ctx, x, x_sizes, index_plan(ctx, x_sizes, indexed)), ctx.out_shape)


@lower(aten.index_select.default)
def index_select(ctx, x, dim, index):
    return _take(ctx, x, dim, index, ctx.arg_meta(2))


@lower(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``padding_idx`` only affects the gradient."""
    return _take(ctx, weight, 0, indices, ctx.arg_meta(1))


def along_dim_plan(ctx, dim: int, index, index_sizes) -> IndexPlan:
    """Every operand dim indexed: ``index`` along ``dim``, the position itself (iota) along the others."""
    if not index_sizes:
        raise NotImplementedError("gather/scatter along a dim of a 0-d tensor")
    columns = [convert(index, torch.int64) if d == dim else iota(ctx, index_sizes, d)
               for d in range(len(index_sizes))]
    columns = [reshape(ctx, c, [*index_sizes, 1]) for c in columns]
    indices = stablehlo.concatenate(columns, len(index_sizes))
    return IndexPlan(indices, list(range(len(index_sizes))), [], list(index_sizes))


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


@lower(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    metas = _index_metas(ctx, 1)
    if len(indices) == 1 and metas[0].dtype in (torch.bool, torch.uint8):
        return _masked_put(ctx, x, indices[0], metas[0], values, accumulate)
    return _put(ctx, x, _listed(indices, _index_metas(ctx, 1)), values, accumulate)


@lower(aten.index_copy.default)
def index_copy(ctx, x, dim, index, source):
    return _put_along(ctx, x, dim, index, source)


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
    if dtype == torch.bool:
        return reduce == "amin"
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    return torch.iinfo(dtype).min if reduce == "amax" else torch.iinfo(dtype).max


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
