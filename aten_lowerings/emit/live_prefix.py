"""Attention over the live prefix of its keys: a static KV cache is mostly empty while decoding, and its mask says
so, so the products need read only the keys up to the last one the mask keeps.

Key lengths are compiled in buckets (64, 128, 256, ... below the keys' length, then the whole length), and a
``stablehlo.case`` picks the shortest bucket that holds every live key, the last key any row keeps. A key is
dead where a bool mask is false or a float mask is at most its dtype's lowest finite number (``-inf``
included): its softmax weight is exactly zero in every row that keeps some key, so dropping it changes nothing
but the order of the sums. If some row keeps no key at all, every bucket is the whole length (torch's result
for that row depends on all of them).

The choice needs only the keys' length to be static: the other dims (the query length of a program exported
with a dynamic prompt, the batch) may be symbolic, so such a program called one token at a time reads the live
prefix as a static one does. The branches read plain slices of the keys; how XLA CPU best reads a cache just
written in place is a rewrite of the module it compiles (``stablehlo_ir.cache_reads``).

Why: a decode step reads its whole cache otherwise, most of it empty; reading only the live bucket makes the
steps of ``bench/decode_speed.py`` faster (README, "Speed and scale", has the figures).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..mlir_types import DYNAMIC
from ..promotion import convert
from ..values import dtype_of, rank, static_shape
from .elementwise import compare
from .reduce import reduce
from .slicing import slice_dim

SHORTEST = 64
"""The shortest bucket: keys are read at least this many at a time (a decode step early in its cache reads 64
keys rather than 128: the copy of each bucket's keys and values and the products over them, a few percent of a
small decoder's step)."""


def bucket_lengths(mask, keys: Sequence[ir.Value]) -> list[int]:
    """The key lengths to compile attention for: ``SHORTEST``, twice that, ... below the keys' length, then that
    length; empty (attention as it is) unless the keys' length (dim -2, rank >= 2) and the mask's last dim are
    static and equal, and the keys are at least twice ``SHORTEST`` long. Other dims may be symbolic."""
    if mask is None or any(rank(key) < 2 or static_shape(key)[-2] == DYNAMIC for key in keys):
        return []
    length = static_shape(keys[0])[-2]
    if any(static_shape(key)[-2] != length for key in keys) or static_shape(mask)[-1] != length or \
            length < 2 * SHORTEST:
        return []
    lengths = [SHORTEST]
    while lengths[-1] * 2 < length:
        lengths.append(lengths[-1] * 2)
    return lengths + [length]


def over_live_prefix(ctx, mask: ir.Value, mask_sizes, keys: Sequence[ir.Value], key_sizes, lengths: Sequence[int],
                     result_types, attend: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``attend(mask, keys)`` (results of ``result_types``) over the shortest of ``lengths`` holding every live
    key: mask and keys (of torch sizes ``mask_sizes`` and ``key_sizes``, one list per key) cut to that length
    along the keys' dim (the mask's last), each bucket one branch of a ``stablehlo.case``."""
    index = _bucket_index(_live_length(ctx, mask, mask_sizes), lengths)
    case = stablehlo.CaseOp(result_types, index, len(lengths))
    for region, length in zip(case.regions, lengths):
        with ir.InsertionPoint(region.blocks.append()), ctx.dims.scope():
            cut = [_prefix(ctx, key, rank(key) - 2, sizes, length) for key, sizes in zip(keys, key_sizes)]
            stablehlo.return_(attend(_prefix(ctx, mask, rank(mask) - 1, mask_sizes, length), cut))
    return list(case.results)


def _live_length(ctx, mask: ir.Value, sizes) -> ir.Value:
    """One past the last key some row keeps (a 0-d int64); the whole length when some row keeps no key."""
    last = rank(mask) - 1
    length = static_shape(mask)[last]
    if dtype_of(mask) == torch.bool:
        live = mask
    else:
        lowest = full_like(ctx, sizes, torch.finfo(dtype_of(mask)).min, dtype_of(mask))
        live = stablehlo.not_(compare(mask, lowest, "LE"))  # NaN counts as live: it reaches the result
    rows_kept = reduce(ctx, live, [last], False, stablehlo.or_)
    every_row_keeps = reduce(ctx, rows_kept, list(range(last)), True, stablehlo.and_)
    kept = reduce(ctx, live, list(range(last)), False, stablehlo.or_)
    ends = stablehlo.iota(ir.RankedTensorType.get([length], ir.IntegerType.get_signless(64)), 0)
    ends = stablehlo.add(ends, constant(1, torch.int64, [length]))
    ends = stablehlo.select(kept, ends, constant(0, torch.int64, [length]))
    live_length = reduce(ctx, ends, [0], 0, stablehlo.maximum)
    return stablehlo.select(every_row_keeps, live_length, constant(length, torch.int64))


def _bucket_index(length: ir.Value, lengths: Sequence[int]) -> ir.Value:
    """How many of ``lengths`` (but the last) are shorter than ``length``: the branch to take (0-d int32)."""
    index = constant(0, torch.int32)
    for bucket in lengths[:-1]:
        longer = convert(compare(length, constant(bucket, torch.int64), "GT"), torch.int32)
        index = stablehlo.add(index, longer)
    return index


def _prefix(ctx, value: ir.Value, dim: int, sizes, length: int) -> ir.Value:
    """``value``'s (torch ``sizes``) first ``length`` entries along ``dim``."""
    cut = list(sizes)
    cut[dim] = length
    return slice_dim(ctx, value, dim, 0, length, cut)
