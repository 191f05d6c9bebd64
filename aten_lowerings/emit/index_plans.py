"""Index plans: where index tensors go in one ``gather`` (reads) or ``scatter`` (writes).

torch's advanced indexing becomes one plan: the index tensors are broadcast together, wrapped, and stacked along
a last dim; dims without an index are whole windows. Gathers and scatters along a dim use full coordinates
(iota for every other dim). A write at consecutive positions along one dim (a KV cache written at
``cache_position``) is a ``dynamic_update_slice`` instead (``contiguous_start``, ``update_slice``), which XLA
does in place.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..mlir_types import DYNAMIC, tensor_type
from ..promotion import convert
from ..shapes import broadcast_in_dim, broadcast_to, iota, is_static, reshape
from ..values import dtype_of, rank, static_shape, value_type
from .elementwise import compare


class IndexPlan(NamedTuple):
    """Where the index tensors go: ``indices`` is (batch..., len(dims)) int64, or (batch...) with
    ``implicit_vector`` (one indexed dim: no trailing size-1 dim, which dynamic batch dims would have to be
    reshaped to; IREE cannot lower that reshape)."""
    indices: ir.Value
    dims: list[int]            # the operand dims that are indexed
    window_positions: list[int]  # result position of each non-indexed operand dim
    sizes: list                # torch sizes of the indexed result
    implicit_vector: bool = False

    @property
    def index_vector_dim(self) -> int:
        return rank(self.indices) - (0 if self.implicit_vector else 1)


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
        if not ctx.facts.non_negative(indexed[d][0]):  # arange indices need no wrap (nor its compare and select)
            negative = compare(index, full_like(ctx, batch, 0, torch.int64), "LT")
            index = stablehlo.select(negative, stablehlo.add(index, size), index)
        columns.append(index)
    indices = columns[0] if len(columns) == 1 else \
        stablehlo.concatenate([reshape(ctx, c, [*batch, 1]) for c in columns], len(batch))

    window = [d for d in range(len(x_sizes)) if d not in indexed]
    first = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
    positions = [j if j < first else j + len(batch) for j in range(len(window))]
    sizes = [x_sizes[d] for d in window]
    sizes[first:first] = batch
    return IndexPlan(indices, dims, positions, sizes, implicit_vector=len(columns) == 1)


def along_dim_plan(ctx, dim: int, index, index_sizes) -> IndexPlan:
    """Every operand dim indexed: ``index`` along ``dim``, the position itself (iota) along the others."""
    if not index_sizes:
        raise NotImplementedError("gather/scatter along a dim of a 0-d tensor")
    columns = [convert(index, torch.int64) if d == dim else iota(ctx, index_sizes, d)
               for d in range(len(index_sizes))]
    columns = [reshape(ctx, c, [*index_sizes, 1]) for c in columns]
    indices = stablehlo.concatenate(columns, len(index_sizes))
    return IndexPlan(indices, list(range(len(index_sizes))), [], list(index_sizes))


def gather_plan(ctx, x, x_sizes, plan: IndexPlan) -> ir.Value:
    numbers = stablehlo.GatherDimensionNumbers.get(
        offset_dims=plan.window_positions, collapsed_slice_dims=plan.dims, operand_batching_dims=[],
        start_indices_batching_dims=[], start_index_map=plan.dims, index_vector_dim=plan.index_vector_dim)
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
        index_vector_dim=plan.index_vector_dim)
    op = stablehlo.ScatterOp([value_type(x)], [x], plan.indices, [convert(updates, dtype_of(x))], numbers)
    scalar = ir.RankedTensorType.get([], value_type(x).element_type)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        old, new = block.arguments
        stablehlo.return_([new if combine is None else combine(old, new)])
    return op.result


def contiguous_start(ctx, index: ir.Value) -> ir.Value | None:
    """The first of a 1-d integer ``index``'s values as a 0-d i64 value when they are known to be consecutive
    (``start, start + 1, ...``): one element, or a range the walk recorded (``value_facts``: an ``arange`` plus
    a number, as transformers' static cache writes at ``arange(n) + cumulative_length``); else None."""
    shape = static_shape(index)
    if len(shape) != 1 or shape[0] == DYNAMIC:
        return None
    return convert(reshape(ctx, index, []), torch.int64) if shape[0] == 1 else ctx.facts.range_start(index)


def update_slice(ctx, x: ir.Value, dim: int, start: ir.Value, update: ir.Value) -> ir.Value:
    """``update`` written into ``x`` (static shapes) from ``start`` (0-d i64) along ``dim``, whole along the other
    dims, by ``dynamic_update_slice``. A write that does not fit (``start`` negative or too large: torch raises)
    leaves ``x`` as it is, as scatter drops out-of-bounds updates; it is never clamped to another position, as
    ``dynamic_update_slice`` alone would do."""
    sizes, length = static_shape(x), static_shape(update)[dim]
    zero, last = constant(0, torch.int64), constant(sizes[dim] - length, torch.int64)
    fits = stablehlo.and_(compare(start, zero, "GE"), compare(start, last, "LE"))
    starts = [stablehlo.clamp(zero, start, last) if d == dim else zero for d in range(len(sizes))]
    old = stablehlo.dynamic_slice(x, starts, static_shape(update))
    return stablehlo.dynamic_update_slice(x, stablehlo.select(fits, update, old), starts)
