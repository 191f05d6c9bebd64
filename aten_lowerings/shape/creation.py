"""Tensor creation and identity-like ops: arange, full, zeros/ones (and new_*/*_like), scalar_tensor, dtype casts,
clone/alias/detach, eval-mode dropout, metadata asserts.

Sizes and dtypes come from the node's output; size arguments (possibly
symbolic) are not read. ``empty`` is lowered as zeros.
"""
from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..emit.elementwise import as_tensor
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import iota

aten = torch.ops.aten


def _constant_fill(fill):
    def rule(ctx, *args, **kwargs):
        return full_like(ctx, ctx.out_shape, fill, ctx.out_dtype)

    return rule


lower(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.zero.default,
      aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default,
      aten.new_empty_strided.default, aten.empty_permuted.default)(_constant_fill(0))
lower(aten.ones.default, aten.ones_like.default, aten.new_ones.default)(_constant_fill(1))


@lower(aten.full.default, aten.full_like.default, aten.fill.Scalar, aten.fill.Tensor, aten.copy.default)
def full(ctx, _, value, *args, **kwargs):
    """The second argument (a number, a SymInt or a tensor) converted and broadcast to the output."""
    return as_tensor(ctx, value, ctx.out_dtype, ctx.out_shape)


@lower(aten.new_full.default)
def new_full(ctx, x, size, value, **kwargs):
    return as_tensor(ctx, value, ctx.out_dtype, ctx.out_shape)


@lower(aten.scalar_tensor.default)
def scalar_tensor(ctx, value, **kwargs):
    return as_tensor(ctx, value, ctx.out_dtype, ())


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(ctx, *bounds, **kwargs):
    """start + i * step, computed in the output's compute dtype (float32 for half types)."""
    start = bounds[0] if len(bounds) > 1 else 0
    step = bounds[2] if len(bounds) > 2 else 1
    dtype, sizes = compute_dtype(ctx.out_dtype), ctx.out_shape
    offsets = stablehlo.multiply(iota(ctx, sizes, 0, dtype), as_tensor(ctx, step, dtype, sizes))
    return convert(stablehlo.add(as_tensor(ctx, start, dtype, sizes), offsets), ctx.out_dtype)


@lower(aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default,
       aten.type_as.default, aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
       aten.lift_fresh_copy.default, aten.alias_copy.default, aten.detach_copy.default)
def cast(ctx, x, *args, **kwargs):
    """Values are never aliased or laid out in StableHLO: all of these are a dtype conversion at most (of a Python
    number, as a retraced vmap leaves ``_to_copy(1)``: its 0-d tensor)."""
    if isinstance(x, (int, float, bool)):
        return constant(x, ctx.out_dtype)
    return convert(x, ctx.out_dtype)


@lower(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten._assert_async.default,
       aten._assert_async.msg)
def assert_(ctx, *args, **kwargs):
    """No code: ``_assert_tensor_metadata`` restates a dtype the graph already has; ``_assert_scalar`` is a
    runtime check on symbolic sizes and ``_assert_async`` one on tensor values (e.g. ``one_hot``'s indices
    are in range), which StableHLO cannot raise: they are dropped here."""
    return None
