"""Attention over the live prefix of its keys: a static KV cache is mostly empty while decoding, and its mask says
so, so the products need read only the keys up to the last one the mask keeps.

Key lengths are compiled in buckets (128, 256, 512, ... below the cache's length, then the whole length), and a
``stablehlo.case`` picks the shortest bucket that holds every live key, the last key any row keeps. A key is
dead where a bool mask is false or a float mask is at most its dtype's lowest finite number (``-inf``
included): its softmax weight is exactly zero in every row that keeps some key, so dropping it changes nothing
but the order of the sums. If some row keeps no key at all, every bucket is the whole length (torch's result
for that row depends on all of them).

The branches read a KV cache just written in place as it is after the write, in the shape the write made it
(``_as_stored``, ``_prefix``): read before the write with the written rows apart, or through a reshape, XLA's
copy insertion copies the whole cache two or three times a step inside a generate loop's ``while``.

Why: a decode step reads its whole cache otherwise, most of it empty; reading only the live bucket makes the
steps of ``bench/decode_speed.py`` faster (README, "Speed and scale", has the figures).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant
from ..mlir_types import DYNAMIC
from ..promotion import convert
from ..values import dtype_of, producer, rank, static_shape, value_type
from .elementwise import compare
from .reduce import reduce

SHORTEST = 128
"""The shortest bucket: keys are read at least this many at a time."""


def bucket_lengths(mask, keys: Sequence[ir.Value]) -> list[int]:
    """The key lengths to compile attention for: ``SHORTEST``, twice that, ... below the keys' length, then that
    length; empty (attention as it is) unless the mask and the keys (rank >= 2, keys along dim -2) have static
    shapes, the mask varies along the keys, and the keys are at least twice ``SHORTEST`` long."""
    if mask is None or any(DYNAMIC in static_shape(v) for v in (mask, *keys)):
        return []
    length = static_shape(keys[0])[-2]
    if static_shape(mask)[-1] != length or length < 2 * SHORTEST:
        return []
    lengths = [SHORTEST]
    while lengths[-1] * 2 < length:
        lengths.append(lengths[-1] * 2)
    return lengths + [length]


def over_live_prefix(mask: ir.Value, keys: Sequence[ir.Value], lengths: Sequence[int], result_types,
                     attend: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``attend(mask, keys)`` (results of ``result_types``) over the shortest of ``lengths`` holding every live
    key: mask and keys cut to that length along the keys' dim (the mask's last), each bucket one branch of a
    ``stablehlo.case``."""
    index = _bucket_index(_live_length(mask), lengths)
    stored = [_as_stored(key) for key in keys]
    case = stablehlo.CaseOp(result_types, index, len(lengths))
    for region, length in zip(case.regions, lengths):
        with ir.InsertionPoint(region.blocks.append()):
            cut = [_prefix(key, rank(key) - 2, *where, length) for key, where in zip(keys, stored)]
            stablehlo.return_(attend(_prefix(mask, rank(mask) - 1, mask, rank(mask) - 1, length), cut))
    return list(case.results)


def _live_length(mask: ir.Value) -> ir.Value:
    """One past the last key some row keeps (a 0-d int64); the whole length when some row keeps no key."""
    shape = static_shape(mask)
    last = len(shape) - 1
    if dtype_of(mask) == torch.bool:
        live = mask
    else:
        lowest = stablehlo.broadcast_in_dim(mask.type, constant(torch.finfo(dtype_of(mask)).min, dtype_of(mask)), [])
        live = stablehlo.not_(compare(mask, lowest, "LE"))  # NaN counts as live: it reaches the result
    rows_kept = reduce(None, live, [last], False, stablehlo.or_)
    every_row_keeps = reduce(None, rows_kept, list(range(last)), True, stablehlo.and_)
    kept = reduce(None, live, list(range(last)), False, stablehlo.or_)
    ends = stablehlo.iota(ir.RankedTensorType.get([shape[last]], ir.IntegerType.get_signless(64)), 0)
    ends = stablehlo.add(ends, constant(1, torch.int64, [shape[last]]))
    ends = stablehlo.select(kept, ends, constant(0, torch.int64, [shape[last]]))
    length = reduce(None, ends, [0], 0, stablehlo.maximum)
    return stablehlo.select(every_row_keeps, length, constant(shape[last], torch.int64))


def _bucket_index(length: ir.Value, lengths: Sequence[int]) -> ir.Value:
    """How many of ``lengths`` (but the last) are shorter than ``length``: the branch to take (0-d int32)."""
    index = constant(0, torch.int32)
    for bucket in lengths[:-1]:
        longer = convert(compare(length, constant(bucket, torch.int64), "GT"), torch.int32)
        index = stablehlo.add(index, longer)
    return index


def as_written(value: ir.Value) -> ir.Value:
    """The tensor ``value`` reshapes, seen through reshapes that only add or drop unit dims: how a KV cache is
    written and carried (a generate loop carries it without them, ``exporter.generate.steps.carried_shape``)."""
    while producer(value) is not None and producer(value).name == "stablehlo.reshape" and \
            _non_unit(static_shape(producer(value).operands[0])) == _non_unit(static_shape(value)):
        value = producer(value).operands[0]
    return value


def _as_stored(key: ir.Value) -> tuple[ir.Value, int]:
    """(``as_written(key)``, its dim that is ``key``'s dim -2, the keys' dim, of more than one entry). The branches
    read that tensor itself, so XLA hands them the buffer the write made, not a second, reshaped copy of it."""
    source = as_written(key)
    before = len(_non_unit(static_shape(key)[:-2]))  # non-unit dims in front of the keys' dim
    return source, [d for d, size in enumerate(static_shape(source)) if size != 1][before]


def _prefix(value: ir.Value, value_dim: int, source: ir.Value, dim: int, length: int) -> ir.Value:
    """``value``'s first ``length`` entries along ``value_dim``, read as ``source``'s along ``dim``. Always a
    ``slice``, the whole length too: the products then read a KV cache as it is after its write, where
    ``emit.contraction.written_rows`` would read it before the write, the written rows apart (inside a case, XLA
    then copies the whole cache to keep both)."""
    limits = list(static_shape(source))
    limits[dim] = length
    cut = stablehlo.slice(source, [0] * len(limits), limits, [1] * len(limits))
    shape = static_shape(value)
    shape[value_dim] = length
    return stablehlo.reshape(ir.RankedTensorType.get(shape, value_type(value).element_type), cut)


def _non_unit(shape) -> list[int]:
    return [size for size in shape if size != 1]
