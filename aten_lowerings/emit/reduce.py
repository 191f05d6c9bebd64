"""Reductions other families build on: ``stablehlo.reduce`` with a binary op, reduce regions, inclusive scans as
``reduce_window``, (value, index) extremes with torch's NaN and tie rules, and p-norms."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..mlir_types import tensor_type
from ..promotion import convert
from ..shapes import iota, normalize_dim, reshape
from ..values import dtype_of, rank, static_shape, value_type
from .elementwise import as_tensor, compare
from .extremes import highest, is_nan, lowest, maximum, minimum


def reduce_region(operation, scalar_types, body):
    """Fill ``operation``'s reduction region: ``body(*scalar block arguments)`` returns the results."""
    block = operation.regions[0].blocks.append(*scalar_types)
    with ir.InsertionPoint(block):
        stablehlo.return_(body(*block.arguments))


def reduce(ctx, value: ir.Value, dims: Sequence[int], init, op) -> ir.Value:
    """``stablehlo.reduce`` of ``value`` over ``dims`` (removed from the result) with the binary ``op``
    (e.g. ``stablehlo.add``) starting from the Python number ``init``."""
    dims = sorted(dims)
    element = value_type(value).element_type
    shape = [d for i, d in enumerate(static_shape(value)) if i not in dims]
    operation = stablehlo.ReduceOp([ir.RankedTensorType.get(shape, element)], [value],
                                   [constant(init, dtype_of(value))], dims)
    scalar = ir.RankedTensorType.get([], element)
    reduce_region(operation, [scalar, scalar], lambda a, b: [op(a, b)])
    return operation.result


def scan(values, inits, dim: int, combine) -> list[ir.Value]:
    """Inclusive scan of same-shaped ``values`` along a static ``dim``: one ``reduce_window`` whose window spans
    the dim, padded in front with ``inits`` (numbers); ``combine(*accumulators, *elements)`` returns a list."""
    shape = static_shape(values[0])
    window, padding = [1] * len(shape), np.zeros((len(shape), 2), dtype=np.int64)
    window[dim], padding[dim, 0] = shape[dim], shape[dim] - 1
    operation = stablehlo.ReduceWindowOp(
        [v.type for v in values], values, [constant(i, dtype_of(v)) for i, v in zip(inits, values)], window,
        padding=ir.DenseIntElementsAttr.get(padding))
    scalars = [tensor_type([], dtype_of(v)) for v in values]
    reduce_region(operation, scalars * 2, combine)
    return list(operation.results)


def arg_extreme(ctx, x, dim, direction: str):
    """(values, int64 indices) of the max (``GT``) or min (``LT``) along ``dim``; ``dim=None`` flattens.

    Like torch, NaN beats every number and ties go to the first index.
    """
    sizes = ctx.arg_meta(0).shape
    if dim is None or rank(x) == 0:
        sizes = [ctx.arg_meta(0).numel()]
        x, dim = reshape(ctx, x, sizes), 0
    dim = normalize_dim(dim, rank(x))
    dtype = dtype_of(x)
    shape = [d for i, d in enumerate(static_shape(x)) if i != dim]
    init = (lowest if direction == "GT" else highest)(dtype)
    operation = stablehlo.ReduceOp([tensor_type(shape, dtype), tensor_type(shape, torch.int64)],
                                   [x, iota(ctx, sizes, dim)], [constant(init, dtype), constant(0, torch.int64)],
                                   [dim])

    scalars = [tensor_type([], dtype), tensor_type([], torch.int64)]
    reduce_region(operation, scalars * 2, arg_picker(direction, dtype))
    return operation.results


def arg_picker(direction: str, dtype: torch.dtype, last: bool = False):
    """Combiner of (value, index) pairs keeping the max (``GT``) or min (``LT``), NaN beating every number;
    ties go to the first index (the last if ``last``), so the order of the pairs does not matter."""

    def pick(a, a_index, b, b_index):
        better, tie = compare(a, b, direction), compare(a, b, "EQ")
        if dtype.is_floating_point:
            a_nan, b_nan = is_nan(a), is_nan(b)
            better = stablehlo.or_(better, stablehlo.and_(a_nan, stablehlo.not_(b_nan)))
            tie = stablehlo.or_(tie, stablehlo.and_(a_nan, b_nan))
        first = stablehlo.or_(better, stablehlo.and_(tie, compare(a_index, b_index, "GT" if last else "LT")))
        return [stablehlo.select(first, a, b), stablehlo.select(first, a_index, b_index)]

    return pick


def p_norm(ctx, magnitude, sizes, dims, p):
    """The p-norm over ``dims`` of ``magnitude`` (absolute values, torch sizes ``sizes``), with
    torch.linalg.vector_norm's special cases: p = +-inf the extreme, 0 the count of nonzeros, 1, 2; the
    reduced dims are dropped."""
    dtype = dtype_of(magnitude)
    if p in (math.inf, -math.inf):  # init: the identity of the extreme over values >= 0
        return reduce(ctx, magnitude, dims, 0 if p > 0 else math.inf, maximum if p > 0 else minimum)
    if p == 0:
        nonzero = convert(compare(magnitude, full_like(ctx, sizes, 0, dtype), "NE"), dtype)
        return reduce(ctx, nonzero, dims, 0, stablehlo.add)
    if p == 1:
        return reduce(ctx, magnitude, dims, 0, stablehlo.add)
    if p == 2:
        return stablehlo.sqrt(reduce(ctx, stablehlo.multiply(magnitude, magnitude), dims, 0, stablehlo.add))
    total = reduce(ctx, stablehlo.power(magnitude, full_like(ctx, sizes, p, dtype)), dims, 0, stablehlo.add)
    return stablehlo.power(total, as_tensor(ctx, 1.0 / p, dtype, [s for d, s in enumerate(sizes) if d not in dims]))
