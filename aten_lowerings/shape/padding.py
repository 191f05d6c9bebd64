"""Padding: constant_pad_nd (``stablehlo.pad``); reflection, replication and circular padding (slices,
reverse, concatenate); ``aten.pad``, which names its mode, lowered straight to those (no decomposition).

torch lists pads from the last dim backwards, ``(last_low, last_high, second_last_low, ...)``; a negative pad
crops. Reflection and replication read their edges from the uncropped input, circular padding from the
cropped one, as torch's kernels do.
"""
from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant
from ..emit.slicing import slice_dim
from ..registry import lower
from ..shapes import broadcast_in_dim
from ..values import rank

aten = torch.ops.aten


def pad_pairs(pad, ndim: int) -> list[tuple[int, int]]:
    """torch's flat pad list as a (low, high) pair for each of ``ndim`` dims (leading dims unpadded)."""
    pairs = [(pad[i], pad[i + 1]) for i in range(0, len(pad), 2)][::-1]
    return [(0, 0)] * (ndim - len(pairs)) + pairs


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    """``stablehlo.pad``; ``dynamic_pad`` where a pad is a symbolic size (Mamba's ``(chunk - seq % chunk) %
    chunk``), its amounts computed at run time."""
    lows, highs = zip(*pad_pairs(ctx.literal(1), rank(x)))  # ints, or SymInts where symbolic
    fill = constant(value, ctx.out_dtype)
    if all(isinstance(p, int) for p in lows + highs):
        return stablehlo.pad(x, fill, list(lows), list(highs), [0] * rank(x), results=[ctx.out_type()])
    return stablehlo.dynamic_pad(ctx.out_type(), x, fill, ctx.shape_value(lows), ctx.shape_value(highs),
                                 ctx.shape_value([0] * rank(x)))


def _resized(sizes, dim: int, length):
    return [length if d == dim else s for d, s in enumerate(sizes)]


def _copied(ctx, x, dim: int, start, length, sizes):
    """``length`` elements from ``start`` along ``dim``."""
    return slice_dim(ctx, x, dim, start, start + length, _resized(sizes, dim, length))


def _mirrored(ctx, x, dim: int, start, length, sizes):
    """``length`` elements from ``start`` along ``dim``, reversed."""
    return stablehlo.reverse(_copied(ctx, x, dim, start, length, sizes), [dim])


def _repeated(ctx, x, dim: int, start, length, sizes):
    """The element at ``start`` along ``dim``, repeated ``length`` times."""
    edge = _copied(ctx, x, dim, start, 1, sizes)
    return broadcast_in_dim(ctx, edge, _resized(sizes, dim, length), list(range(rank(x))))


def _edge_padding(edge, low_start, high_start):
    """A rule padding each dim with ``edge(ctx, x, dim, start, length, sizes)`` pieces. ``low_start`` and
    ``high_start`` say where along the input the low and high pieces are read, from ``(kept, size, pad)``:
    ``kept`` is the (start, end) range of the input that negative pads leave."""

    def rule(ctx, x, padding):
        sizes = list(ctx.arg_meta(0).shape)
        if not all(isinstance(p, int) for p in padding):
            raise NotImplementedError("reflection, replication and circular padding by a symbolic amount (the "
                                      "constant mode takes one)")
        for dim, (low, high) in enumerate(pad_pairs(padding, len(sizes))):
            if low == high == 0:
                continue
            size = sizes[dim]
            kept = max(-low, 0), size + min(high, 0)
            parts = [_copied(ctx, x, dim, kept[0], kept[1] - kept[0], sizes)]
            if low > 0:
                parts.insert(0, edge(ctx, x, dim, low_start(kept, size, low), low, sizes))
            if high > 0:
                parts.append(edge(ctx, x, dim, high_start(kept, size, high), high, sizes))
            x = stablehlo.concatenate(parts, dim) if len(parts) > 1 else parts[0]
            sizes[dim] = size + low + high
        return x

    return rule


_MODES = {
    "reflect": lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)(
        _edge_padding(_mirrored, lambda kept, size, pad: 1, lambda kept, size, pad: size - 1 - pad)),
    "replicate": lower(aten.replication_pad1d.default, aten.replication_pad2d.default,
                       aten.replication_pad3d.default)(
        _edge_padding(_repeated, lambda kept, size, pad: 0, lambda kept, size, pad: size - 1)),
    # circular padding wraps around what negative pads leave
    "circular": lower(aten._pad_circular.default)(
        _edge_padding(_copied, lambda kept, size, pad: kept[1] - pad, lambda kept, size, pad: kept[0])),
}


@lower(aten.pad.default)
def pad(ctx, x, padding, mode="constant", value=None):
    """``F.pad``'s op: the constant mode (``value`` None pads with 0) or the mode's own rule above."""
    if mode == "constant":
        return constant_pad_nd(ctx, x, padding, 0 if value is None else value)
    return _MODES[mode](ctx, x, padding)
