"""Data-dependent sizes held as padded results.

torch.export gives a size that depends on the data (nonzero's row count, a slice bounded by tensor values) a
data-dependent ("unbacked") symbol, ``u0``. As XLA's bounded dynamism does, the result is emitted padded to its
static upper bound (e.g. nonzero's is the input's element count), and the true size is computed as a scalar
beside it (``PaddedDims.bind``):

- in shapes, ``u0`` stands for the padded size: ops on a padded tensor see a static tensor whose first
  ``u0`` rows are the result (the graph lowering lets only ops that keep that true take one, ``keeps_padding``:
  elementwise and layout ops, ``cond`` (its branches are checked op by op), and reductions with an identity,
  whose operand the walk first fills with that identity past the true sizes, ``padding_filled``; any other
  raises, naming the op);
- as a value (``x.shape[0]``, the graph's SymInt arithmetic and asserts), ``u0`` is the true size;
- a graph output with a ``u0`` dim is returned padded, ``u0`` as an extra result of ``@main``, and the
  artifact slices it to that size (see ``exporter.conversion.signature.data_dependent_sizes``).

The padding rows hold valid values (index 0 for nonzero's coordinates, elements of the input elsewhere), so
an index taken from them stays in range.
"""
from __future__ import annotations

import operator

import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..constants import full_like
from ..shape_values import SymbolicDims
from ..shapes import broadcast_in_dim, dim_size, iota
from .elementwise import compare
from .extremes import highest, lowest
from .slicing import slice_dim

aten = torch.ops.aten


class PaddedDims(SymbolicDims):
    """Symbolic sizes where some symbols are data-dependent: in shapes such a symbol is its padded size
    (``size``/``shape``), as a value its true size (``actual``)."""

    def __init__(self):
        super().__init__()
        self.actual = SymbolicDims()  # the same input dims; data-dependent symbols -> their true sizes
        self.bound: set[sympy.Symbol] = set()
        # unbounded ``.item()`` sizes a call gives (by name): the size @main takes for each (``call_time_sizes``),
        # and the value the graph computes for it, which @main returns for the caller to check
        self.given: dict[str, ir.Value] = {}
        self.computed: dict[str, ir.Value] = {}

    def bind_input(self, value: ir.Value, sizes) -> None:
        super().bind_input(value, sizes)
        self.actual.bind_input(value, sizes)

    def bind_scalar(self, symbol: sympy.Symbol, value: ir.Value) -> None:
        super().bind_scalar(symbol, value)
        self.actual.bind_scalar(symbol, value)

    def bind(self, symbol: sympy.Symbol, padded: ir.Value, actual: ir.Value) -> None:
        """``symbol`` is ``padded`` (0-d i64) in shapes and ``actual`` as a value."""
        if symbol in self.bound:
            return
        self._cache[symbol] = padded
        self.actual._cache[symbol] = actual
        self.bound.add(symbol)

    def give(self, name: str, argument: ir.Value) -> None:
        """The size ``name`` a call gives is ``argument``'s dim 0 less its dim 1 (``Signature.call_sizes``)."""
        self.given[name] = stablehlo.subtract(self.read(argument, 0), self.read(argument, 1))

    def exact(self, size) -> bool:
        """Whether ``size`` (an int or SymInt) holds no padding: its data-dependent symbols are all given by the
        call (``given``), none padded."""
        return all(str(s) in self.given for s in free_unbacked_symbols(size))

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
    if given_size(ctx, size, actual):  # the call gives it: the padded result cut to it (exact)
        sizes = [size if d == dim else n for d, n in enumerate(ir.RankedTensorType(padded.type).shape)]
        return slice_dim(ctx, padded, dim, 0, ctx.dims.given[str(symbol)], sizes)
    ctx.dims.bind(symbol, dim_size(ctx, padded, dim), actual)
    return padded


def bound_scalar(ctx, value: ir.Value, meta) -> ir.Value:
    """``value`` (0-d i64) is a data-dependent int (``.item()``), ``meta`` its SymInt: where torch knows an upper
    bound for it (``torch._check(n <= 5)``), its symbol is bound, so a tensor of that size is held padded to the
    bound with ``value`` as its true size (as ``nonzero``'s result is). Without a bound, a size a call gives
    (``call_time_sizes``) is that size in shapes and ``value`` as a value; else the symbol stays unbound, and a size
    made of it raises naming it (``shape_values``)."""
    if not (isinstance(meta, torch.SymInt) and free_unbacked_symbols(meta) and isinstance(meta.node.expr, sympy.Symbol)
            and isinstance(ctx.dims, PaddedDims)):
        return value
    upper = _upper_bound(meta)
    if not given_size(ctx, meta, value) and upper is not None:
        ctx.dims.bind(meta.node.expr, ctx.size_value(upper), value)
    return value


def given_size(ctx, size, computed: ir.Value) -> bool:
    """Where ``size`` (a SymInt of one data-dependent symbol) is one the call gives (``call_time_sizes``): bind it
    (the given size in shapes, ``computed``, 0-d i64, as a value) and record ``computed`` for @main to return.
    Returns whether it is."""
    if not (isinstance(size, torch.SymInt) and isinstance(ctx.dims, PaddedDims)
            and str(size.node.expr) in ctx.dims.given):
        return False
    ctx.dims.bind(size.node.expr, ctx.dims.given[str(size.node.expr)], computed)
    ctx.dims.computed[str(size.node.expr)] = computed
    return True


def _upper_bound(meta: torch.SymInt) -> int | None:
    """The integer upper bound torch knows for a data-dependent int (None: none, or one over other symbols)."""
    bounds = meta.node.shape_env.bound_sympy(meta.node.expr)  # None where torch records no range for it
    upper = bounds.upper if bounds is not None else None
    return int(upper) if isinstance(upper, sympy.Integer) else None


_ITEMS = {aten._local_scalar_dense.default, aten.item.default}
_SIZED_BY_DATA = {aten.bincount.default, aten.repeat_interleave.Tensor}  # ops whose result's dim 0 is such a size
# ops whose result is held padded to a bound (``data_dependent_result``), or cut to a size the call gives
_PADDED_SOURCES = {aten.nonzero.default, aten.masked_select.default, aten.index.Tensor}


def call_time_sizes(graph_module: torch.fx.GraphModule, rerunnable: bool = True) -> list[sympy.Symbol]:
    """The sizes a call gives: each symbol a top-graph ``.item()`` (or ``bincount``, ``repeat_interleave``) makes
    with no integer upper bound (no padded size can hold it), and, where the program may be run again for them
    (``rerunnable``: it draws no random numbers and writes no state), each one a top-graph ``.item()``,
    ``nonzero``, ``masked_select`` or boolean-mask index makes that some op of the graph cannot take padded
    (``keeps_padding``: a sort, a product over it, attention): in both cases only where some tensor of the graph
    has it in its shape. @main takes each as the size of an argument (shape refinement then makes it static like
    an input dim) and returns the value its graph computes for it; the caller runs it again with those values
    until they agree (``exporter.formats.artifact``)."""
    in_shapes, unpaddable = set(), set()
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                meta = node.meta.get("val")
                for value in meta if isinstance(meta, (list, tuple)) else [meta]:
                    if isinstance(value, torch.Tensor):
                        in_shapes |= free_unbacked_symbols(value.shape)
                if rerunnable and node.op == "call_function" and node.target is not operator.getitem \
                        and not isinstance(meta, torch.SymInt) and not keeps_padding(node):
                    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: unpaddable.update(
                        free_unbacked_symbols(a.meta["val"].shape)) if is_padded(a) else None)
    symbols = []
    for node in graph_module.graph.nodes:
        for size in _sizes_made(node):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol) \
                    and free_unbacked_symbols(size) and size.node.expr in in_shapes \
                    and size.node.expr not in symbols \
                    and (_upper_bound(size) is None or size.node.expr in unpaddable):
                symbols.append(size.node.expr)
    return symbols


def _sizes_made(node: torch.fx.Node) -> list:
    """The data-dependent sizes ``node`` makes that a call may give (``call_time_sizes``)."""
    meta = node.meta.get("val")
    if node.target in _ITEMS:
        return [meta]
    if node.target in _SIZED_BY_DATA:
        return [meta.shape[0]]
    if node.target in _PADDED_SOURCES and isinstance(meta, torch.Tensor):
        return list(meta.shape)
    return []


# -- which ops may take a padded tensor (the graph lowering checks every node) ---------------------------------

_LAYOUT_OPS = {aten.clone.default, aten.alias.default, aten.detach.default, aten._to_copy.default,
               aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.contiguous.default,
               aten.lift_fresh_copy.default, aten.permute.default, aten.transpose.int, aten.t.default,
               aten.unsqueeze.default, aten.stack.default, aten._assert_tensor_metadata.default, aten.sym_size.int,
               aten.alias_copy.default, aten.detach_copy.default, aten.permute_copy.default,
               aten.transpose_copy.int, aten.t_copy.default, aten.unsqueeze_copy.default,
               aten.expand.default, aten.expand_copy.default}  # expand: torch never broadcasts a symbolic size
# reshapes: they keep the padding where only the leading dim is padded, in and out (the padding rows are then the
# tail of the row-major elements, as in the result)
_RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default,
             aten.flatten.using_ints, aten.unflatten.int, aten._reshape_copy.default}
# ops along one dim (``dim``, the second argument; the third for splits): they keep the padding of the other
# dims in place
_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor,
           aten.split_with_sizes_copy.default}
_ALONG_DIM = {aten.cat.default, aten.unbind.int, aten.select.int, aten.squeeze.dim, aten.slice.Tensor,
              aten.narrow.default, aten.index_select.default, aten.unbind_copy.int, aten.select_copy.int,
              aten.squeeze_copy.dim, aten.slice_copy.Tensor, aten.narrow_copy.default, *_SPLITS}
# gathers: padded indices give padded rows of the result; a padded source would take wrapped (negative) indices
# from its padding, so it must not be
_GATHERS = {aten.index.Tensor, aten.gather.default}


# reductions whose padding rows, filled with the identity (by dtype), leave the result as over the true rows alone
# (mean and var are not: they divide by the dim's size, which is the padded one in shapes)
_IDENTITY = {aten.sum.default: lambda dtype: 0, aten.sum.dim_IntList: lambda dtype: 0,
             aten.prod.default: lambda dtype: 1, aten.prod.dim_int: lambda dtype: 1,
             aten.amax.default: lowest, aten.amin.default: highest, aten.max.default: lowest,
             aten.min.default: highest, aten.any.default: lambda dtype: False, aten.any.dim: lambda dtype: False,
             aten.any.dims: lambda dtype: False, aten.all.default: lambda dtype: True,
             aten.all.dim: lambda dtype: True, aten.all.dims: lambda dtype: True}
_CONTROL_FLOW = {torch.ops.higher_order.cond}  # the branches' ops are checked one by one as they are lowered


def padding_filled(ctx, value: ir.Value) -> ir.Value:
    """The operand of a reduction (``ctx.node``, one of ``_IDENTITY``'s) with its elements past the true sizes
    of its padded dims set to the reduction's identity."""
    meta = ctx.arg_meta(0)
    sizes = list(meta.shape)
    kept = None
    for dim, size in enumerate(sizes):
        if isinstance(size, torch.SymInt) and free_unbacked_symbols(size):
            actual = broadcast_in_dim(ctx, ctx.dims.actual.size(size), sizes, [])
            inside = compare(iota(ctx, sizes, dim), actual, "LT")
            kept = inside if kept is None else stablehlo.and_(kept, inside)
    if kept is None:
        return value
    return stablehlo.select(kept, value, full_like(ctx, sizes, _IDENTITY[ctx.node.target](meta.dtype), meta.dtype))


def fills_padding(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a reduction that takes a padded tensor once its padding is filled (``padding_filled``)."""
    return node.target in _IDENTITY and is_padded(node.args[0])


def keeps_padding(node: torch.fx.Node) -> bool:
    """Whether an op on tensors padded along some dims gives its results padded alike (rows in place)."""
    target = node.target
    if target in _LAYOUT_OPS or target in _CONTROL_FLOW or target in _IDENTITY \
            or torch.Tag.pointwise in getattr(target, "tags", ()):
        return True
    if target in _GATHERS:
        return not is_padded(node.args[0])
    if target in _RESHAPES:
        return all(not _padded_dim(n, d) for n in (node, node.args[0]) for d in range(1, n.meta["val"].dim()))
    if target not in _ALONG_DIM:
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if target in _SPLITS:
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
