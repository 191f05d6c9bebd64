"""Cholesky factors with StableHLO's own op (``stablehlo.cholesky``): cholesky, linalg_cholesky(_ex)."""
from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.elementwise import compare
from ..emit.reduce import reduce
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import iota
from ..values import dtype_of

aten = torch.ops.aten


def _factor(ctx, a, sizes, upper: bool):
    """The Cholesky factor of ``a`` (torch sizes ``sizes``) in its compute dtype, the other triangle zeroed
    (stablehlo leaves it implementation-defined); NaNs where the factorisation failed."""
    a = convert(a, compute_dtype(dtype_of(a)))
    factor = stablehlo.cholesky(a, lower=not upper)
    rows, cols = iota(ctx, sizes, len(sizes) - 2), iota(ctx, sizes, len(sizes) - 1)
    keep = compare(rows, cols, "LE" if upper else "GE")
    return stablehlo.select(keep, factor, full_like(ctx, sizes, 0, dtype_of(a)))


@lower(aten.cholesky.default)
def cholesky(ctx, a, upper=False):
    return convert(_factor(ctx, a, ctx.out_shape, upper), ctx.out_dtype)


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(ctx, a, *, upper=False, check_errors=False):
    """info: 0 where the factorisation succeeded, else 1 + the row of the first NaN on the factor's diagonal
    (torch's order of the first failing minor only where the backend's NaNs start there; XLA's CPU fills
    the whole factor with NaNs, which reads as 1)."""
    factor_meta, info_meta = ctx.out_meta
    sizes = factor_meta.shape
    factor = _factor(ctx, a, sizes, upper)
    rows, cols = iota(ctx, sizes, len(sizes) - 2, torch.int32), iota(ctx, sizes, len(sizes) - 1, torch.int32)
    failed = stablehlo.and_(compare(factor, factor, "NE"), compare(rows, cols, "EQ"))
    never = torch.iinfo(torch.int32).max
    order = stablehlo.select(failed, stablehlo.add(rows, full_like(ctx, sizes, 1, torch.int32)),
                             full_like(ctx, sizes, never, torch.int32))
    first = reduce(ctx, order, [len(sizes) - 2, len(sizes) - 1], never, stablehlo.minimum)
    info = stablehlo.select(compare(first, full_like(ctx, info_meta.shape, never, torch.int32), "EQ"),
                            full_like(ctx, info_meta.shape, 0, torch.int32), first)
    return convert(factor, factor_meta.dtype), convert(info, info_meta.dtype)


@lower(aten.linalg_cholesky.default)
def linalg_cholesky(ctx, a, *, upper=False):
    """linalg_cholesky_ex's factor. torch decomposes linalg_cholesky into linalg_cholesky_ex and an effectful
    ``_linalg_check_errors`` (a ``with_effects`` node threading a token through the program) that raises for
    an input that is not positive-definite; lowered whole, that check is left out: such an input gives NaNs."""
    return convert(_factor(ctx, a, ctx.out_shape, upper), ctx.out_dtype)
