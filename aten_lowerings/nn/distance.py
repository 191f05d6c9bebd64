"""Distances and bags of embeddings: _cdist_forward, _pdist_forward, _embedding_bag.

p-norm distances take the difference of every pair of rows and reduce it over
the feature dim (the last); cdist's p=2 uses torch's matmul form
(|x|^2 + |y|^2 - 2 x.y) where torch's ``compute_mode`` does. Embedding bags
gather the rows and scatter them into their bags.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import array_constant, full_like
from ..emit.contraction import contract
from ..emit.elementwise import as_tensor, compare
from ..emit.extremes import maximum, minimum
from ..emit.index_plans import IndexPlan, gather_plan, index_plan, scatter_plan
from ..emit.reduce import p_norm, reduce
from ..emit.slicing import slice_dim
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, iota, reshape
from ..values import dtype_of

aten = torch.ops.aten


def _p_norm(ctx, difference, sizes, p: float):
    """The p-norm of ``difference`` (torch sizes ``sizes``) over its last dim."""
    return p_norm(ctx, stablehlo.abs(difference), sizes, [len(sizes) - 1], p)


def _uses_matmul(p, compute_mode, rows, other_rows) -> bool:
    """torch's choice: compute_mode 1 always, None/0 beyond 25 rows on either side, 2 never; only for p=2."""
    if p != 2 or compute_mode == 2:
        return False
    return compute_mode == 1 or rows > 25 or other_rows > 25


@lower(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    """x1 (B..., P, M) and x2 (B..., R, M), batch dims broadcast, give (B..., P, R)."""
    out, features = list(ctx.out_shape), ctx.arg_meta(0).shape[-1]
    batch, (rows, other_rows) = out[:-2], out[-2:]
    dtype = compute_dtype(ctx.out_dtype)
    x1, x2 = convert(x1, dtype), convert(x2, dtype)
    if _uses_matmul(p, compute_mode, rows, other_rows):
        return convert(_euclidean_by_matmul(ctx, x1, x2, batch, rows, other_rows, features), ctx.out_dtype)
    sizes = [*out, features]

    def spread(arg, x):  # (B'..., rows, M) -> (B..., P, R, M): x1's rows along P, x2's along R
        dims = _aligned(ctx, arg, len(batch) + 2)[:-2] + [len(batch) + arg, len(out)]
        return broadcast_in_dim(ctx, x, sizes, dims)

    difference = stablehlo.subtract(spread(0, x1), spread(1, x2))
    return convert(_p_norm(ctx, difference, sizes, p), ctx.out_dtype)


def _euclidean_by_matmul(ctx, x1, x2, batch, rows, other_rows, features):
    """sqrt(max(|x|^2 + |y|^2 - 2 x.y, 0)), the form torch takes for many rows."""
    x1 = broadcast_in_dim(ctx, x1, [*batch, rows, features], _aligned(ctx, 0, len(batch) + 2))
    x2 = broadcast_in_dim(ctx, x2, [*batch, other_rows, features], _aligned(ctx, 1, len(batch) + 2))
    out, dims = [*batch, rows, other_rows], list(range(len(batch)))
    cross = contract(x1, x2, dims, dims, [len(batch) + 1], [len(batch) + 1], ctx.out_meta.shape, dtype_of(x1))
    norms = [reduce(ctx, stablehlo.multiply(x, x), [len(batch) + 1], 0, stablehlo.add) for x in (x1, x2)]
    squared = stablehlo.add(broadcast_in_dim(ctx, norms[0], out, dims + [len(batch)]),
                            broadcast_in_dim(ctx, norms[1], out, dims + [len(batch) + 1]))
    squared = stablehlo.subtract(squared, stablehlo.multiply(as_tensor(ctx, 2, dtype_of(cross), out), cross))
    return stablehlo.sqrt(stablehlo.maximum(squared, full_like(ctx, out, 0, dtype_of(cross))))


def _aligned(ctx, arg: int, full_rank: int) -> list[int]:
    """Result dims of argument ``arg``'s dims when it is broadcast (from the right) to ``full_rank`` dims."""
    arg_rank = len(ctx.arg_meta(arg).shape)
    return list(range(full_rank - arg_rank, full_rank))


@lower(aten._pdist_forward.default)
def pdist(ctx, x, p=2.0):
    """Distances between rows i < j of x (N, M), in row-major order of the pairs."""
    count, features = ctx.arg_meta(0).shape
    if not isinstance(count, int):
        raise NotImplementedError("pdist over a symbolic number of rows")
    first, second = np.triu_indices(count, k=1)
    x = convert(x, compute_dtype(ctx.out_dtype))
    pairs = len(first)
    rows = [_rows(ctx, x, [count, features], array_constant(i.astype(np.int64), torch.int64), pairs)
            for i in (first, second)]
    return convert(_p_norm(ctx, stablehlo.subtract(*rows), [pairs, features], p), ctx.out_dtype)


def _rows(ctx, x, x_sizes, positions, count):
    """Rows of ``x`` (2-d, torch sizes ``x_sizes``) at the 1-d int64 ``positions`` (``count`` of them)."""
    plan = IndexPlan(reshape(ctx, positions, [count, 1]), [0], [1], [count, x_sizes[1]])
    return gather_plan(ctx, x, x_sizes, plan)



@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags of rows of ``weight``: sum (mode 0), mean (1) or max (2); rows at ``padding_idx`` are left out.

    The other outputs are torch's bookkeeping: offset2bag (each index's bag), bag_size (rows kept per bag;
    zeros for sum), max_indices (max: the row each maximum came from; mean: bag_size; sum: zeros).
    """
    (bags, width), count = ctx.out_meta[0].shape, ctx.arg_meta(1).shape[0]
    out_dtype, weight_sizes = ctx.out_meta[0].dtype, ctx.arg_meta(0).shape
    dtype = compute_dtype(out_dtype)
    bag = _bag_of_each_index(ctx, slice_dim(ctx, offsets, 0, 0, bags, [bags]), count, bags)
    into_bags = IndexPlan(reshape(ctx, bag, [count, 1]), [0], [1], [])
    kept = compare(indices, full_like(ctx, [count], padding_idx, dtype_of(indices)), "NE")
    sizes = scatter_plan(full_like(ctx, [bags], 0, torch.int64), into_bags._replace(window_positions=[]),
                     convert(kept, torch.int64), stablehlo.add)
    rows = gather_plan(ctx, weight, weight_sizes, index_plan(ctx, weight_sizes, {0: (indices, ctx.arg_meta(1))}))
    rows = convert(rows, dtype)
    if per_sample_weights is not None:
        rows = stablehlo.multiply(rows, broadcast_in_dim(ctx, convert(per_sample_weights, dtype), [count, width], [0]))
    kept = broadcast_in_dim(ctx, kept, [count, width], [0])
    left_out = -math.inf if mode == 2 else 0  # what a padding row adds to its bag
    rows = stablehlo.select(kept, rows, full_like(ctx, [count, width], left_out, dtype))
    bagged = scatter_plan(full_like(ctx, [bags, width], left_out, dtype), into_bags, rows,
                      maximum if mode == 2 else stablehlo.add)
    per_bag = broadcast_in_dim(ctx, sizes, [bags, width], [0])
    if mode == 0:
        return (convert(bagged, out_dtype), bag,
                *(full_like(ctx, ctx.out_meta[i].shape, 0, torch.int64) for i in (2, 3)))
    if mode == 1:
        divisor = stablehlo.maximum(convert(per_bag, dtype), full_like(ctx, [bags, width], 1, dtype))
        return convert(stablehlo.divide(bagged, divisor), out_dtype), bag, sizes, sizes
    empty = compare(per_bag, full_like(ctx, [bags, width], 0, torch.int64), "EQ")
    output = stablehlo.select(empty, full_like(ctx, [bags, width], 0, dtype), bagged)
    source = _first_maximum(ctx, rows, bagged, into_bags, indices, count, (bags, width))
    source = stablehlo.select(empty, full_like(ctx, [bags, width], 0, torch.int64), source)
    return convert(output, out_dtype), bag, sizes, source


def _bag_of_each_index(ctx, starts, count, bags):
    """(count,) int64: the bag each index falls in, i.e. how many bag starts are at or before it, minus one."""
    position = iota(ctx, [count, bags], 0)
    started = compare(broadcast_in_dim(ctx, starts, [count, bags], [1]), position, "LE")
    return stablehlo.subtract(reduce(ctx, convert(started, torch.int64), [1], 0, stablehlo.add),
                              full_like(ctx, [count], 1, torch.int64))


def _first_maximum(ctx, rows, peak, into_bags, indices, count, out_sizes):
    """For each bag and column, the entry of ``indices`` whose row holds the bag's maximum (the first one)."""
    width = out_sizes[1]
    own_peak = gather_plan(ctx, peak, list(out_sizes), into_bags._replace(sizes=[count, width]))
    position = iota(ctx, [count, width], 0)
    candidate = stablehlo.select(compare(rows, own_peak, "EQ"), position,
                                 full_like(ctx, [count, width], count - 1, torch.int64))
    first = scatter_plan(full_like(ctx, list(out_sizes), count - 1, torch.int64), into_bags, candidate, minimum)
    at = IndexPlan(reshape(ctx, first, [*out_sizes, 1]), [0], [], list(out_sizes))
    return gather_plan(ctx, indices, [count], at)
