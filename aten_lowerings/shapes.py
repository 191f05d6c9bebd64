"""Shapes of torch sizes, static or symbolic: broadcasts, reshapes, dim sizes, dim normalisation and iotas.

A rule passes torch sizes (ints or SymInts, usually taken from ``ctx.out_shape``); these emit the static op when
every dim is known and the ``dynamic_*`` op with a shape value otherwise, so rules do not branch on it.
"""
from __future__ import annotations

from typing import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .context import LoweringContext
from .mlir_types import DYNAMIC, mlir_shape, tensor_type
from .shape_values import size_expr
from .values import producer, rank, static_shape, value_type


def is_static(sizes) -> bool:
    return all(isinstance(s, int) or s.node.maybe_as_int() is not None for s in sizes)


def has_sizes(ctx: LoweringContext, value: ir.Value, sizes) -> bool:
    """Whether ``value``, whose type has the shape of torch ``sizes``, is known to have those sizes: they are
    static, or the value's symbolic sizes are recorded and equal them."""
    return is_static(sizes) or ctx.dims.sizes_of(value) == tuple(size_expr(s) for s in sizes)


def broadcast_in_dim(ctx: LoweringContext, value: ir.Value, sizes, dims: Sequence[int],
                     element: ir.Type | None = None) -> ir.Value:
    """``broadcast_in_dim`` to torch sizes (static or symbolic); ``dims`` maps operand dims to result dims.
    ``element`` is the result's element type where it differs from the operand's (a per-axis quant type's
    axis moves with its dim). A dynamic broadcast says which operand dims expand: the static size-1 ones (torch
    never broadcasts a symbolic size, export assumes it is not 1), so consumers that need to know (IREE) can
    lower it."""
    result_type = ir.RankedTensorType.get(mlir_shape(sizes), element or value_type(value).element_type)
    if value_type(value) == result_type and list(dims) == list(range(len(dims))) and has_sizes(ctx, value, sizes):
        return value
    if is_static(sizes):
        return stablehlo.broadcast_in_dim(result_type, value, list(dims))
    expanding = [i for i, (size, d) in enumerate(zip(static_shape(value), dims))
                 if size == 1 and size_expr(sizes[d]) != 1]  # sympy's != compares, torch's would guard
    kept = [i for i in range(len(dims)) if i not in expanding]
    return _noted(ctx, stablehlo.dynamic_broadcast_in_dim(result_type, value, ctx.shape_value(sizes), list(dims),
                                                          known_expanding_dimensions=expanding or None,
                                                          known_nonexpanding_dimensions=kept or None), sizes)


def broadcast_to(ctx: LoweringContext, value: ir.Value, sizes) -> ir.Value:
    """Numpy-style broadcast (trailing dims aligned) to torch sizes."""
    offset = len(sizes) - rank(value)
    return broadcast_in_dim(ctx, value, sizes, list(range(offset, len(sizes))))


def reshape(ctx: LoweringContext, value: ir.Value, sizes) -> ir.Value:
    """``value`` reshaped to torch ``sizes`` (static or symbolic). A value of the same type is returned as it is
    only where its sizes are known to be ``sizes``: with one ``?`` dim at most (the element count fixes it), or
    its recorded sizes equal them; ``?x?`` to ``?x?`` may still move elements between the dims."""
    result_type = ir.RankedTensorType.get(mlir_shape(sizes), value_type(value).element_type)
    if value_type(value) == result_type and (static_shape(value).count(DYNAMIC) <= 1 or has_sizes(ctx, value, sizes)):
        return value
    source = producer(value)
    if source is not None and source.name in ("stablehlo.reshape", "stablehlo.dynamic_reshape"):
        return reshape(ctx, source.operands[0], sizes)  # a reshape of a reshape: one reshape of the first's operand
    if is_static(sizes):
        return stablehlo.reshape(result_type, value)
    return _noted(ctx, stablehlo.dynamic_reshape(result_type, value, ctx.shape_value(sizes)), sizes)


def _noted(ctx: LoweringContext, value: ir.Value, sizes) -> ir.Value:
    """``value``, a dynamic op's result of torch ``sizes``, with its sizes recorded (``has_sizes`` then knows them)."""
    ctx.dims.note(value, sizes)
    return value


def dim_size(ctx: LoweringContext, value: ir.Value, dim: int) -> ir.Value:
    """0-d i64 size of one dim of a value (constant when static)."""
    size = static_shape(value)[dim]
    if size != DYNAMIC:
        return ctx.size_value(size)
    return ctx.dims.read(value, dim)


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def normalize_dims(dims, ndim: int) -> list[int]:
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(normalize_dim(d, ndim) for d in dims)


def iota(ctx: LoweringContext, sizes, dim: int, dtype: torch.dtype = torch.int64) -> ir.Value:
    """0, 1, 2, ... along ``dim`` of a tensor of torch sizes (static or symbolic)."""
    result_type = tensor_type(sizes, dtype)
    if is_static(sizes):
        return stablehlo.iota(result_type, dim)
    return _noted(ctx, stablehlo.dynamic_iota(result_type, ctx.shape_value(sizes), dim), sizes)
