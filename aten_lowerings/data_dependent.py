"""Ops whose output size depends on the data: nonzero (and argwhere), masked_select, unique (``_unique2``),
unique_consecutive; and the ones with no static bound, which raise (repeat_interleave without output_size,
bincount).

torch.export gives such a size a data-dependent ("unbacked") symbol, ``u0``. As XLA's bounded dynamism does,
the result is emitted padded to its static upper bound (e.g. nonzero's is the input's element count), and
the true size is computed as a scalar beside it (``PaddedDims.bind``):

- in shapes, ``u0`` stands for the padded size: ops on a padded tensor see a static tensor whose first
  ``u0`` rows are the result (the graph lowering lets only ops that keep that true take one: elementwise
  and layout ops; any other raises, naming the op);
- as a value (``x.shape[0]``, the graph's SymInt arithmetic and asserts), ``u0`` is the true size;
- a graph output with a ``u0`` dim is returned padded, ``u0`` as an extra result of ``@main``, and the
  artifact slices it to that size (see ``exporter.signature.data_dependent_sizes``).

The padding rows hold valid values (index 0 for nonzero's coordinates, elements of the input elsewhere), so
an index taken from them stays in range. unique and unique_consecutive need inputs of static shape.
"""
from __future__ import annotations

import math

import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from .helpers import (broadcast_in_dim, broadcast_to, compare, constant, convert, dim_size, dtype_of, full_like,
                      iota, reduce, reshape)
from .indexing import IndexPlan, gather_plan, scatter_plan
from .reductions import scan
from .registry import lower
from .shape_ops import slice_dim
from .shape_values import SymbolicDims
from .sorting import true_first, sort_with_indices

aten = torch.ops.aten


class PaddedDims(SymbolicDims):
    """Symbolic sizes where some symbols are data-dependent: in shapes such a symbol is its padded size
    (``size``/``shape``), as a value its true size (``actual``)."""

    def __init__(self):
        super().__init__()
        self.actual = SymbolicDims()  # the same input dims; data-dependent symbols -> their true sizes
        self.bound: set[sympy.Symbol] = set()

    def bind_input(self, value: ir.Value, sizes) -> None:
        super().bind_input(value, sizes)
        self.actual.bind_input(value, sizes)

    def bind(self, symbol: sympy.Symbol, padded: ir.Value, actual: ir.Value) -> None:
        """``symbol`` is ``padded`` (0-d i64) in shapes and ``actual`` as a value."""
        if symbol in self.bound:
            return
        self._cache[symbol] = padded
        self.actual._cache[symbol] = actual
        self.bound.add(symbol)

    def knows(self, size) -> bool:
        """Whether ``size`` (a SymInt) is over input dims and bound data-dependent symbols only."""
        return free_unbacked_symbols(size) <= self.bound


def data_dependent_result(ctx, padded: ir.Value, actual: ir.Value, size, dim: int = 0) -> ir.Value:
    """The result of a data-dependent op: ``padded`` along ``dim`` (its bound), ``actual`` its true size (0-d
    i64); ``size`` is the torch size export gave that dim. A size export pinned is sliced to."""
    pinned = size if isinstance(size, int) else size.node.maybe_as_int()
    if pinned is not None:
        sizes = list(ir.RankedTensorType(padded.type).shape)
        sizes[dim] = pinned
        return slice_dim(ctx, padded, dim, 0, pinned, sizes)
    symbol = size.node.expr
    if not isinstance(symbol, sympy.Symbol):
        raise NotImplementedError(f"the data-dependent size {symbol} is an expression, not one symbol")
    if not isinstance(ctx.dims, PaddedDims):
        raise NotImplementedError("data-dependent sizes need the graph lowering's PaddedDims")
    ctx.dims.bind(symbol, dim_size(ctx, padded, dim), actual)
    return padded


def _static_shape(ctx) -> list[int]:
    sizes = list(ctx.arg_meta(0).shape)
    if not all(isinstance(s, int) for s in sizes):
        raise NotImplementedError(f"{ctx.node.target} of a tensor with symbolic sizes (its output is padded to a "
                                  "static bound, which needs static input sizes)")
    return sizes


def _count(flat_mask: ir.Value) -> ir.Value:
    """The number of true elements of a 1-d bool value, 0-d i64."""
    return reduce(None, convert(flat_mask, torch.int64), [0], 0, stablehlo.add)


def _gather_1d(ctx, values: ir.Value, length: int, positions: ir.Value, count: int) -> ir.Value:
    """``values[positions]`` for 1-d ``values`` (``length``) and int64 ``positions`` (``count``)."""
    plan = IndexPlan(reshape(ctx, positions, [count, 1]), [0], [], [count])
    return gather_plan(ctx, values, [length], plan)


@lower(aten.nonzero.default)
def nonzero(ctx, x):
    """Coordinates of the nonzero elements, one row each, in row-major order: padded to one row per element
    (with coordinates 0)."""
    sizes = list(ctx.arg_meta(0).shape)
    count = math.prod(sizes)
    flat = reshape(ctx, x, [count])
    mask = flat if dtype_of(x) == torch.bool else compare(flat, full_like(ctx, [count], 0, dtype_of(x)), "NE")
    found = _count(mask)
    if not sizes or (isinstance(count, int) and count == 0):  # no coordinates, or no elements
        return data_dependent_result(ctx, full_like(ctx, [count, len(sizes)], 0, torch.int64), found,
                                     ctx.out_shape[0])
    order = true_first(ctx, mask, count)
    kept = compare(iota(ctx, [count], 0), _splat(ctx, found, count), "LT")
    zero = full_like(ctx, [count], 0, torch.int64)
    columns = []
    for dim, size in enumerate(sizes):
        coordinate = stablehlo.remainder(stablehlo.divide(order, _splat(ctx, math.prod(sizes[dim + 1:]), count)),
                                         _splat(ctx, size, count))
        columns.append(reshape(ctx, stablehlo.select(kept, coordinate, zero), [count, 1]))
    return data_dependent_result(ctx, stablehlo.concatenate(columns, 1), found, ctx.out_shape[0])


def _splat(ctx, size, count) -> ir.Value:
    """A 1-d int64 value of ``count`` elements, each ``size`` (an int, SymInt or 0-d i64 value)."""
    value = size if isinstance(size, ir.Value) else ctx.size_value(size)
    return broadcast_in_dim(ctx, value, [count], [])


@lower(aten.masked_select.default)
def masked_select(ctx, x, mask):
    """The elements of ``x`` where ``mask`` (both broadcast) is true, in row-major order; padded to one per
    element."""
    sizes = list(torch.broadcast_shapes(ctx.arg_meta(0).shape, ctx.arg_meta(1).shape))
    count = math.prod(sizes)
    flat_x = reshape(ctx, broadcast_to(ctx, x, sizes), [count])
    flat_mask = reshape(ctx, broadcast_to(ctx, mask, sizes), [count])
    if isinstance(count, int) and count == 0:
        return data_dependent_result(ctx, flat_x, constant(0, torch.int64), ctx.out_shape[0])
    padded = _gather_1d(ctx, flat_x, count, true_first(ctx, flat_mask, count), count)
    return data_dependent_result(ctx, padded, _count(flat_mask), ctx.out_shape[0])


def _unique_runs(ctx, flat: ir.Value, count: int, positions: ir.Value, return_inverse, return_counts):
    """One value per run of equal elements of 1-d ``flat`` (``count`` > 0 long; ``positions``: where each
    element came from in the input): (values, inverse, counts), values and counts padded to ``count``."""
    previous = stablehlo.concatenate([slice_dim(ctx, flat, 0, 0, 1, [1]),
                                      slice_dim(ctx, flat, 0, 0, count - 1, [count - 1])], 0)
    first = compare(iota(ctx, [count], 0), constant(0, torch.int64, [count]), "EQ")
    starts_run = stablehlo.or_(first, compare(flat, previous, "NE"))  # NaNs are never equal: each its own run
    found = _count(starts_run)
    order = true_first(ctx, starts_run, count)  # the runs' first positions, then the other positions
    inverse_meta, counts_meta = ctx.out_meta[1], ctx.out_meta[2]
    values = data_dependent_result(ctx, _gather_1d(ctx, flat, count, order, count), found, ctx.out_meta[0].shape[0])
    if not return_inverse:
        inverse = full_like(ctx, list(inverse_meta.shape), 0, torch.int64)
    else:  # the run of each element: how many runs start at or before it, less one
        (run_of,) = scan([convert(starts_run, torch.int64)], [0], 0, lambda a, b: [stablehlo.add(a, b)])
        run_of = stablehlo.subtract(run_of, constant(1, torch.int64, [count]))
        inverse = scatter_plan(full_like(ctx, [count], 0, torch.int64),
                               IndexPlan(reshape(ctx, positions, [count, 1]), [0], [], []), run_of)
        inverse = reshape(ctx, inverse, list(inverse_meta.shape))
    if not return_counts:
        counts = full_like(ctx, list(counts_meta.shape), 0, torch.int64)
    else:  # the next run's start (``count`` after the last run) less this run's
        end = constant(count, torch.int64, [count])
        starts = stablehlo.select(compare(iota(ctx, [count], 0), _splat(ctx, found, count), "LT"), order, end)
        ends = stablehlo.concatenate([slice_dim(ctx, starts, 0, 1, count, [count - 1]),
                                      constant(count, torch.int64, [1])], 0)
        counts = data_dependent_result(ctx, stablehlo.subtract(ends, starts), found, counts_meta.shape[0])
    return [values, inverse, counts]


def _empty_unique(ctx, x):
    """unique of no elements: all three outputs empty."""
    zero = constant(0, torch.int64)
    return [data_dependent_result(ctx, reshape(ctx, x, [0]), zero, ctx.out_meta[0].shape[0]),
            full_like(ctx, list(ctx.out_meta[1].shape), 0, torch.int64),
            data_dependent_result(ctx, full_like(ctx, [0], 0, torch.int64), zero, ctx.out_meta[2].shape[0])]


@lower(aten._unique2.default)
def unique2(ctx, x, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique: the distinct values in ascending order (also for ``sorted=False``, which leaves the order
    to the implementation), padded to the input's element count."""
    count = math.prod(_static_shape(ctx))
    if count == 0:
        return _empty_unique(ctx, x)
    values, positions = sort_with_indices(ctx, reshape(ctx, x, [count]), 0, False, [count])
    return _unique_runs(ctx, values, count, positions, return_inverse, return_counts)


@lower(aten.unique_consecutive.default)
def unique_consecutive(ctx, x, return_inverse=False, return_counts=False, dim=None):
    """One element per run of equal consecutive elements (of the flattened input), padded to its element
    count."""
    if dim is not None:
        raise NotImplementedError("unique_consecutive along a dim (dim=...) is not supported; only flattened")
    count = math.prod(_static_shape(ctx))
    if count == 0:
        return _empty_unique(ctx, x)
    return _unique_runs(ctx, reshape(ctx, x, [count]), count, iota(ctx, [count], 0), return_inverse,
                        return_counts)


@lower(aten.repeat_interleave.Tensor)
def repeat_interleave(ctx, repeats, *, output_size=None):
    """``repeat_interleave(repeats)``: index i repeated repeats[i] times. Needs a static ``output_size``:
    the sum of the repeats has no bound a padded result could take."""
    size = ctx.out_shape[0]
    pinned = size if isinstance(size, int) else size.node.maybe_as_int()
    if pinned is None:
        raise NotImplementedError(
            "repeat_interleave's output size is the sum of the repeats, data-dependent and unbounded; pass "
            "output_size=N (the known total) so the output has a static size")
    length = ctx.arg_meta(0).shape[0]
    if not isinstance(length, int):
        raise NotImplementedError("repeat_interleave of repeats with a symbolic length")
    if pinned == 0 or length == 0:
        return full_like(ctx, [pinned], 0, torch.int64)
    (ends,) = scan([convert(repeats, torch.int64)], [0], 0, lambda a, b: [stablehlo.add(a, b)])
    # output i takes the index of the first run ending after i: how many runs end at or before i
    grid_ends = stablehlo.broadcast_in_dim(ir.RankedTensorType.get([pinned, length], ir.IntegerType.get_signless(64)),
                                           ends, [1])
    positions = iota(ctx, [pinned, length], 0)
    ended = convert(compare(grid_ends, positions, "LE"), torch.int64)
    index = reduce(ctx, ended, [1], 0, stablehlo.add)
    return stablehlo.clamp(constant(0, torch.int64), index, constant(length - 1, torch.int64))


@lower(aten.bincount.default)
def bincount(ctx, x, weights=None, minlength=0):
    raise NotImplementedError(
        "bincount's output size is max(x) + 1, data-dependent and unbounded, so no padded result can hold it; "
        "for values known to lie in [0, N), count with torch.zeros(N).scatter_add_(0, x, weights) or "
        "torch.nn.functional.one_hot(x, N).sum(0)")


# -- which ops may take a padded tensor (the graph lowering checks every node) ---------------------------------

_LAYOUT_OPS = {aten.clone.default, aten.alias.default, aten.detach.default, aten._to_copy.default,
               aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.contiguous.default,
               aten.lift_fresh_copy.default, aten.permute.default, aten.transpose.int, aten.t.default,
               aten.unsqueeze.default, aten.stack.default, aten._assert_tensor_metadata.default, aten.sym_size.int}
# ops along one dim (``dim``, the second argument): they keep the padding of the other dims in place
_ALONG_DIM = {aten.cat.default, aten.unbind.int, aten.select.int, aten.squeeze.dim, aten.slice.Tensor,
              aten.narrow.default, aten.index_select.default, aten.split.Tensor, aten.split_with_sizes.default}
# gathers: padded indices give padded rows of the result; a padded source would take wrapped (negative) indices
# from its padding, so it must not be
_GATHERS = {aten.index.Tensor, aten.gather.default}


def keeps_padding(node: torch.fx.Node) -> bool:
    """Whether an op on tensors padded along some dims gives its results padded alike (rows in place)."""
    target = node.target
    if target in _LAYOUT_OPS or torch.Tag.pointwise in getattr(target, "tags", ()):
        return True
    if target in _GATHERS:
        return not is_padded(node.args[0])
    if target not in _ALONG_DIM:
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if target in (aten.split.Tensor, aten.split_with_sizes.default):
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    first = node.args[0]
    operands = first if isinstance(first, (list, tuple)) else [first]
    return all(isinstance(o, torch.fx.Node) and isinstance(dim, int) and not _padded_dim(o, dim) for o in operands)


def _padded_dim(node: torch.fx.Node, dim: int) -> bool:
    shape = node.meta["val"].shape
    size = shape[dim] if -len(shape) <= dim < len(shape) else 0
    return isinstance(size, torch.SymInt) and bool(free_unbacked_symbols(size))


def is_padded(node) -> bool:
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(meta, torch.Tensor) and any(free_unbacked_symbols(s) for s in meta.shape
                                                  if isinstance(s, torch.SymInt))
