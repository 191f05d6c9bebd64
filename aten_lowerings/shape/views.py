"""Views and shape ops: view/reshape, (un)squeeze, permute/transpose, expand, flatten, cat/stack,
split/chunk/unbind, slice/select/narrow, diff, repeat/tile, flip/roll, tril/triu, diagonal, unfold, as_strided, resize,
and the ``*_copy`` variants of the views.

Views are copies here (StableHLO values are immutable); export has already
functionalised every mutation through a view. Slices, and the bounds they take
(ints, SymInts or 0-d i64 values), are ``emit.slicing``'s.
"""
from __future__ import annotations

import math

import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..constants import constant, full_like
from ..emit.elementwise import compare
from ..emit.padded import PaddedDims, data_dependent_result
from ..emit.slicing import dim_length, index_value, known_int, slice_bounds, slice_dim, strided_slice, take, wrap_index
from ..mlir_types import tensor_type
from ..promotion import convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, iota, normalize_dim, normalize_dims, reshape
from ..values import rank, static_shape

aten = torch.ops.aten

# -- slices ------------------------------------------------------------------------


def _add(ctx, a, b):
    """``a + b`` of ints, SymInts or 0-d i64 values: an int when both are known."""
    if known_int(a) is not None and known_int(b) is not None:
        return known_int(a) + known_int(b)
    return stablehlo.add(index_value(ctx, a), index_value(ctx, b))


@lower(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, rank(x))
    start, end = slice_bounds(ctx, start, end, dim_length(ctx, x, dim))
    if free_unbacked_symbols(ctx.out_shape[dim]) and not free_unbacked_symbols(ctx.arg_meta(0).shape[dim]) \
            and not (isinstance(ctx.dims, PaddedDims) and ctx.dims.exact(ctx.out_shape[dim])):
        # bounds read from tensor data (tensor_split by a tensor) on a dim of known size
        return _padded_slice(ctx, x, dim, start, end, step)
    return slice_dim(ctx, x, dim, start, end, ctx.out_shape, step)


def _padded_slice(ctx, x, dim, start, end, step):
    """A slice of data-dependent length, held padded to the dim's size (see ``emit.padded``): ``x`` itself
    from start 0, else ``x``'s rows from ``start`` on, wrapping around, whose first ``end - start`` are the
    slice (a gather, so the dims may be symbolic)."""
    if step != 1:
        raise NotImplementedError(f"a slice with data-dependent bounds needs step 1, not {step}")
    if known_int(start) == 0:
        padded = x
    else:
        sizes = list(ctx.arg_meta(0).shape)
        length = sizes[dim]
        positions = stablehlo.remainder(
            stablehlo.add(iota(ctx, [length], 0), broadcast_in_dim(ctx, index_value(ctx, start), [length], [])),
            broadcast_in_dim(ctx, ctx.size_value(length), [length], []))
        padded = take(ctx, x, dim, positions, sizes)
    actual = stablehlo.subtract(index_value(ctx, end), index_value(ctx, start))
    result = data_dependent_result(ctx, padded, actual, ctx.out_shape[dim], dim)
    offset = ctx.out_meta.storage_offset()  # export gives the view's offset a data-dependent symbol too
    if free_unbacked_symbols(offset) and isinstance(offset.node.expr, sympy.Symbol):
        zero = ctx.size_value(0)  # values here are not views: their storage offset is 0 (scalars.sym_storage_offset)
        ctx.dims.bind(offset.node.expr, zero, zero)
    return result


@lower(aten.narrow.default, aten.narrow_copy.default)
def narrow(ctx, x, dim, start, length):
    dim = normalize_dim(dim, rank(x))
    start = wrap_index(ctx, start, dim_length(ctx, x, dim))
    return slice_dim(ctx, x, dim, start, _add(ctx, start, length), ctx.out_shape)


@lower(aten.select.int, aten.select_copy.int)
def select(ctx, x, dim, index):
    dim = normalize_dim(dim, rank(x))
    index = wrap_index(ctx, index, dim_length(ctx, x, dim))
    sizes = list(ctx.out_shape)
    sizes.insert(dim, 1)
    return reshape(ctx, slice_dim(ctx, x, dim, index, _add(ctx, index, 1), sizes), ctx.out_shape)


def _split(ctx, x, dim, lengths, sizes):
    """Consecutive pieces of ``x`` along ``dim`` with the given lengths and result sizes."""
    pieces, offset = [], 0
    for length, piece_sizes in zip(lengths, sizes):
        pieces.append(slice_dim(ctx, x, dim, offset, offset + length, piece_sizes))
        offset = offset + length
    return pieces


@lower(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default,
       aten.tensor_split.sections, aten.tensor_split.indices, aten.split_copy.Tensor,
       aten.split_with_sizes_copy.default)
def split(ctx, x, _sizes_or_sections, dim=0):
    """Every split-like op cuts consecutive pieces; their lengths are read off the node's outputs."""
    dim = normalize_dim(dim, rank(x))
    sizes = [meta.shape for meta in ctx.out_meta]
    return _split(ctx, x, dim, [s[dim] for s in sizes], sizes)


@lower(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, x, dim=0):
    dim = normalize_dim(dim, rank(x))
    out_sizes = [meta.shape for meta in ctx.out_meta]
    piece_sizes = [[*s[:dim], 1, *s[dim:]] for s in out_sizes]
    pieces = _split(ctx, x, dim, [1] * len(out_sizes), piece_sizes)
    return [reshape(ctx, piece, s) for piece, s in zip(pieces, out_sizes)]


# -- reshapes and broadcasts ------------------------------------------------------------


@lower(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_as.default,
       aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
       aten.flatten.using_ints, aten.unflatten.int, aten.view_copy.default, aten._reshape_copy.default,
       aten._reshape_alias_copy.default, aten.unsqueeze_copy.default, aten.squeeze_copy.default,
       aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def view(ctx, x, *_shape_args):
    """All of these keep the element order: a reshape to the node's output shape."""
    return reshape(ctx, x, ctx.out_shape)


def _stored(dtype: torch.dtype) -> torch.dtype:
    """bool is stored as a byte: ``view(dtype)`` reads and writes that byte."""
    return torch.uint8 if dtype == torch.bool else dtype


@lower(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(ctx, x, _dtype):
    """The same bytes read as another dtype (``bitcast_convert``, little-endian as on every PJRT host): to a
    narrower dtype each element becomes a run along the last dim, to a wider one each run becomes one element."""
    source, target = _stored(ctx.arg_meta(0).dtype), _stored(ctx.out_dtype)
    if source.is_complex or target.is_complex:
        raise NotImplementedError("view(dtype) from or to a complex dtype")
    x, ratio = convert(x, source), source.itemsize // target.itemsize
    if target.itemsize > source.itemsize:
        x = reshape(ctx, x, [*ctx.out_shape, target.itemsize // source.itemsize])
    sizes = [*ctx.arg_meta(0).shape, ratio] if ratio > 1 else ctx.out_shape
    value = reshape(ctx, stablehlo.bitcast_convert(tensor_type(sizes, target), x), ctx.out_shape)
    return convert(value, ctx.out_dtype)


@lower(aten.expand.default, aten.expand_as.default, aten.expand_copy.default, aten.broadcast_to.default)
def expand(ctx, x, *_size_args, implicit=False):
    return broadcast_to(ctx, x, ctx.out_shape)


def _repeat(ctx, x, repeats):
    """Broadcast into interleaved (repeat, size) dims, then merge each pair."""
    in_sizes = [1] * (len(repeats) - rank(x)) + list(ctx.arg_meta(0).shape)
    x = reshape(ctx, x, in_sizes)
    interleaved = [s for pair in zip(repeats, in_sizes) for s in pair]
    tiled = broadcast_in_dim(ctx, x, interleaved, list(range(1, len(interleaved), 2)))
    return reshape(ctx, tiled, ctx.out_shape)


@lower(aten.repeat.default)
def repeat(ctx, x, _repeats):
    return _repeat(ctx, x, list(ctx.literal(1)))


@lower(aten.repeat_interleave.self_int)
def repeat_interleave(ctx, x, _repeats, dim=None, *, output_size=None):
    """Each element ``repeats`` times in a row along ``dim`` (of the flattened tensor where ``dim`` is None): a
    broadcast into a new dim after ``dim``, merged with it."""
    sizes = list(ctx.arg_meta(0).shape)
    if dim is None:
        sizes, dim = [math.prod(sizes)], 0
        x = reshape(ctx, x, sizes)
    dim = normalize_dim(dim, len(sizes))
    spread = [*sizes[:dim + 1], ctx.literal(1), *sizes[dim + 1:]]
    tiled = broadcast_in_dim(ctx, x, spread, [d if d <= dim else d + 1 for d in range(len(sizes))])
    return reshape(ctx, tiled, ctx.out_shape)


@lower(aten.tile.default)
def tile(ctx, x, _dims):
    dims = list(ctx.literal(1))
    return _repeat(ctx, x, [1] * (rank(x) - len(dims)) + dims)


# -- permutations ------------------------------------------------------------------------


def _dims_in_order(dims, ndim: int) -> list[int]:
    return [normalize_dim(d, ndim) for d in ([dims] if isinstance(dims, int) else dims)]


@lower(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims):
    return stablehlo.transpose(x, _dims_in_order(dims, rank(x)))


@lower(aten.transpose.int, aten.swapaxes.default, aten.swapdims.default, aten.transpose_copy.int)
def transpose(ctx, x, dim0, dim1):
    perm = list(range(rank(x)))
    dim0, dim1 = normalize_dim(dim0, rank(x)), normalize_dim(dim1, rank(x))
    perm[dim0], perm[dim1] = dim1, dim0
    return stablehlo.transpose(x, perm)


@lower(aten.t.default, aten.t_copy.default)
def t(ctx, x):
    return transpose(ctx, x, 0, 1) if rank(x) == 2 else x


@lower(aten.mT.default)
def mT(ctx, x):  # noqa: N802 (torch's name)
    return transpose(ctx, x, -2, -1)


@lower(aten.numpy_T.default)
def numpy_T(ctx, x):  # noqa: N802 (torch's name)
    return stablehlo.transpose(x, list(reversed(range(rank(x)))))


@lower(aten.movedim.int, aten.movedim.intlist)
def movedim(ctx, x, source, destination):
    source, destination = _dims_in_order(source, rank(x)), _dims_in_order(destination, rank(x))
    perm = [None] * rank(x)
    for src, dst in zip(source, destination):
        perm[dst] = src
    rest = iter(d for d in range(rank(x)) if d not in source)
    return stablehlo.transpose(x, [next(rest) if p is None else p for p in perm])


# -- joins ------------------------------------------------------------------------------------


def concatenate(ctx, tensors, dim: int, dtype: torch.dtype) -> ir.Value:
    """torch.cat: operands converted to ``dtype``; legacy 1-d empty tensors are skipped as torch does."""
    kept = [t for t in tensors if static_shape(t) != [0]] or tensors[:1]
    kept = [convert(t, dtype) for t in kept]
    return kept[0] if len(kept) == 1 else stablehlo.concatenate(kept, dim)


@lower(aten.cat.default)
def cat(ctx, tensors, dim=0):
    dim = normalize_dim(dim, len(ctx.out_shape))
    return concatenate(ctx, tensors, dim, ctx.out_dtype)


@lower(aten.stack.default)
def stack(ctx, tensors, dim=0):
    dim = normalize_dim(dim, len(ctx.out_shape))
    sizes = list(ctx.out_shape)
    sizes[dim] = 1
    return concatenate(ctx, [reshape(ctx, t, sizes) for t in tensors], dim, ctx.out_dtype)


# -- differences, flips, rolls, triangles -----------------------------------------------------------


@lower(aten.diff.default)
def diff(ctx, x, n=1, dim=-1, prepend=None, append=None):
    """``n`` rounds of ``v[1:] - v[:-1]`` along ``dim`` (``!=`` for bool) over ``cat(prepend, x, append)``."""
    dim = normalize_dim(dim, rank(x))
    if known_int(ctx.out_shape[dim]) == 0:  # n >= length: torch returns an empty tensor
        return full_like(ctx, ctx.out_shape, 0, ctx.out_dtype)
    value = concatenate(ctx, [t for t in (prepend, x, append) if t is not None], dim, ctx.out_dtype)
    subtract = stablehlo.xor if ctx.out_dtype == torch.bool else stablehlo.subtract
    for remaining in range(n - 1, -1, -1):
        sizes = list(ctx.out_shape)
        sizes[dim] = sizes[dim] + remaining
        length = sizes[dim] + 1
        value = subtract(slice_dim(ctx, value, dim, 1, length, sizes), slice_dim(ctx, value, dim, 0, length - 1, sizes))
    return value


@lower(aten.flip.default)
def flip(ctx, x, dims):
    return stablehlo.reverse(x, normalize_dims(dims, rank(x)))


def _roll_dim(ctx, x, shift: int, dim: int, sizes):
    """Roll one dim: the window of ``cat(x, x)`` starting at ``(-shift) mod size``."""
    size = dim_length(ctx, x, dim)
    if isinstance(size, int):
        start = -shift % size if size else 0
        end = start + size
    else:
        remainder = stablehlo.remainder(index_value(ctx, -shift), size)
        start = stablehlo.remainder(stablehlo.add(remainder, size), size)
        end = stablehlo.add(start, size)
    return slice_dim(ctx, stablehlo.concatenate([x, x], dim), dim, start, end, sizes)


@lower(aten.roll.default)
def roll(ctx, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:  # roll the flattened tensor
        flat_size = [ctx.out_meta.numel()]
        rolled = _roll_dim(ctx, reshape(ctx, x, flat_size), shifts[0], 0, flat_size)
        return reshape(ctx, rolled, ctx.out_shape)
    for shift, dim in zip(shifts, dims):
        x = _roll_dim(ctx, x, shift, normalize_dim(dim, rank(x)), ctx.out_shape)
    return x


def _triangle(keep: str):
    """tril keeps ``col - row <= diagonal`` (``LE``), triu keeps ``col - row >= diagonal`` (``GE``)."""

    def rule(ctx, x, diagonal=0):
        sizes = ctx.out_shape
        matrix = list(sizes[-2:])
        offsets = stablehlo.subtract(iota(ctx, matrix, 1), iota(ctx, matrix, 0))
        mask = compare(offsets, full_like(ctx, matrix, diagonal, torch.int64), keep)
        mask = broadcast_in_dim(ctx, mask, sizes, [len(sizes) - 2, len(sizes) - 1])
        return stablehlo.select(mask, x, full_like(ctx, sizes, 0, ctx.out_dtype))

    return rule


lower(aten.tril.default)(_triangle("LE"))
lower(aten.triu.default)(_triangle("GE"))


# -- diagonals, strided views, resize -----------------------------------------------------------------


@lower(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    """The two dims moved last, the square block holding the diagonal cut out and flattened, then every
    (length + 1)-th element."""
    dim1, dim2 = normalize_dim(dim1, rank(x)), normalize_dim(dim2, rank(x))
    x = stablehlo.transpose(x, [d for d in range(rank(x)) if d not in (dim1, dim2)] + [dim1, dim2])
    *batch, length = ctx.out_shape
    lead = len(batch)
    row, col = (max(-offset, 0), max(offset, 0)) if known_int(length) != 0 else (0, 0)  # an empty one may start outside
    block = strided_slice(ctx, x, [0] * lead + [row, col], batch + [row + length, col + length], [1] * rank(x),
                          [*batch, length, length])
    flat = reshape(ctx, block, [*batch, length * length])
    return slice_dim(ctx, flat, lead, 0, length * length, ctx.out_shape, length + 1)


@lower(aten.unfold.default, aten.unfold_copy.default)
def unfold(ctx, x, dimension, size, step):
    """Windows of ``size`` every ``step`` along ``dimension`` (a 0-d ``x`` seen as 1-d): one gather of positions
    ``window * step + offset``, then the offsets' dim moved last."""
    x_sizes = list(ctx.arg_meta(0).shape) or [1]
    dim = normalize_dim(dimension, len(x_sizes))
    grid = [ctx.out_shape[dim] if rank(x) else 1, size]
    positions = stablehlo.add(stablehlo.multiply(iota(ctx, grid, 0), full_like(ctx, grid, step, torch.int64)),
                              iota(ctx, grid, 1))
    windows = take(ctx, reshape(ctx, x, x_sizes), dim, positions, [*x_sizes[:dim], *grid, *x_sizes[dim + 1:]])
    order = [d for d in range(len(x_sizes) + 1) if d != dim + 1] + [dim + 1]
    return reshape(ctx, stablehlo.transpose(windows, order), ctx.out_shape)


@lower(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(ctx, x, size, stride, storage_offset=None):
    """Element ``storage_offset + sum(i_d * stride_d)`` of the row-major flattening of ``x``. In an exported
    graph ``x`` is a value of its own, not a view of a larger storage (functionalisation has materialised
    views), so offsets and strides count from its first element in row-major order; on an eager view or a
    non-contiguous tensor they would count in the underlying storage instead."""
    sizes = ctx.out_shape
    position = full_like(ctx, sizes, storage_offset or 0, torch.int64)
    for d, step in enumerate(ctx.literal(2)):
        steps = stablehlo.multiply(iota(ctx, sizes, d), broadcast_in_dim(ctx, ctx.size_value(step), sizes, []))
        position = stablehlo.add(position, steps)
    return take(ctx, reshape(ctx, x, [ctx.arg_meta(0).numel()]), 0, position, sizes)


@lower(aten.resize.default, aten.resize_.default)
def resize(ctx, x, size, memory_format=None):
    """``resize`` (what a growing ``resize_`` functionalises to; a shrinking one becomes ``as_strided``), and
    ``resize_``'s value where a graph keeps it: the row-major elements kept, new ones zero (torch leaves them
    uninitialised)."""
    old, new = ctx.arg_meta(0).numel(), ctx.out_meta.numel()
    flat = stablehlo.pad(reshape(ctx, x, [old]), constant(0, ctx.out_dtype), [0], [new - old], [0])
    return reshape(ctx, flat, ctx.out_shape)
