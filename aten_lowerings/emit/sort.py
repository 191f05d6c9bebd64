"""Stable sorts with indices: one ``stablehlo.sort`` over (values, iota indices) along a dim, NaN ordered above
every number, as torch does; and compaction (the positions of a mask's true elements, in order) as a stable
sort of the negated mask: O(n log n), where a cumulative sum as ``reduce_window`` would be O(n^2)."""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant
from ..mlir_types import tensor_type
from ..shapes import iota, normalize_dim
from ..values import dtype_of, rank, value_type
from .elementwise import compare
from .extremes import is_nan


def _before(a, b, descending: bool):
    """Whether ``a`` goes before ``b``: a < b (a > b if ``descending``) with NaN the largest."""
    before = compare(a, b, "GT" if descending else "LT")
    if not dtype_of(a).is_floating_point:
        return before
    a_nan, b_nan = is_nan(a), is_nan(b)
    nan_first = stablehlo.and_(a_nan if descending else b_nan, stablehlo.not_(b_nan if descending else a_nan))
    return stablehlo.or_(stablehlo.and_(before, stablehlo.not_(stablehlo.or_(a_nan, b_nan))), nan_first)


def sort_with_indices(ctx, x, dim: int, descending: bool, sizes=None) -> tuple[ir.Value, ir.Value]:
    """(sorted values, their int64 positions in ``x``) along ``dim``; ``sizes``: x's torch sizes if x is not
    the node's first argument."""
    if rank(x) == 0:
        return x, constant(0, torch.int64)
    dim = normalize_dim(dim, rank(x))
    indices = iota(ctx, ctx.arg_meta(0).shape if sizes is None else sizes, dim)
    operation = stablehlo.SortOp([value_type(x), value_type(indices)], [x, indices], dimension=dim, is_stable=True)
    scalars = [tensor_type([], dtype_of(x)), tensor_type([], torch.int64)]
    block = operation.regions[0].blocks.append(scalars[0], scalars[0], scalars[1], scalars[1])
    with ir.InsertionPoint(block):
        stablehlo.return_([_before(block.arguments[0], block.arguments[1], descending)])
    return operation.results[0], operation.results[1]


def true_first(ctx, mask, count):
    """Flat positions of a 1-d bool ``mask`` (``count`` long), its true elements first, each group in order."""
    return sort_with_indices(ctx, stablehlo.not_(mask), 0, False, [count])[1]
