"""Control flow: ``torch.cond`` -> ``stablehlo.if``; ``while_loop`` -> ``stablehlo.while``; ``scan`` and
``map_impl`` -> one ``stablehlo.while`` over the leading dim of their inputs (not unrolled).

torch.export gives each a nested GraphModule per branch or body; the graph walker lowers it into the op's
region (``ctx.lower_graph``). Regions use values from outside them by capture, as JAX's cond does and as its
loops do for sizes: a branch reads its operands, a body its loop-invariant inputs (torch's
``additional_inputs``: parameters and buffers; the scanned tensors) and any symbolic size straight from the
enclosing block. The while carries only what changes from one step to the next. Sizes computed inside a region
are forgotten on leaving it (``SymbolicDims.scope``), so none is used where it does not dominate.

Branches must return the same shapes and dtypes, and a loop must keep those of what it carries: where they
differ (torch.export then gives the result a data-dependent size) the rule raises, and the graph walker names
the op and its source line. A ``cond`` of padded operands (``emit.padded``) may return them padded: each branch
returns the true sizes beside its results, and the result's data-dependent size is bound to the one taken.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from torch_stablehlo.stablehlo_ir.dtypes import SCALAR_DTYPES

from .constants import constant, full_like
from .emit.elementwise import compare
from .emit.loops import while_loop as emit_while
from .emit.padded import PaddedDims, data_dependent_result
from .mlir_types import mlir_shape, tensor_type
from .promotion import convert
from .registry import lower
from .shape_values import I64, i64_scalar
from .shapes import is_static, reshape
from .values import value_type

higher_order = torch.ops.higher_order


@lower(higher_order.cond)
def cond(ctx, pred, true_graph, false_graph, operands):
    """``stablehlo.if`` whose branches are ``true_graph(*operands)`` and ``false_graph(*operands)``; a predicate
    torch.export fixed (a static size compared) picks its branch here, inline."""
    true_outputs, false_outputs = _outputs(true_graph), _outputs(false_graph)
    if true_outputs != false_outputs:
        raise ValueError(f"the branches of torch.cond return different shapes or dtypes ({', '.join(true_outputs)} "
                         f"and {', '.join(false_outputs)}); stablehlo.if needs them equal")
    if isinstance(pred, bool):
        return tuple(ctx.lower_graph(true_graph if pred else false_graph, operands))
    padded = _padded_dims(ctx)
    op = stablehlo.IfOp(_result_types(ctx, "torch.cond", padded_ok=bool(padded)) + [tensor_type([], torch.int64)]
                        * len(padded), _predicate(ctx, pred))
    for region, graph in ((op.true_branch, true_graph), (op.false_branch, false_graph)):
        with ir.InsertionPoint(region.blocks.append()), ctx.dims.scope():
            sizes = [_metas(graph)[i].shape[dim] for i, dim in padded]
            if not all(ctx.dims.knows(size) for size in sizes):
                raise ValueError("a branch of torch.cond returns a tensor of data-dependent shape that is not one "
                                 "of its operands' padded sizes; StableHLO's control flow needs one shape")
            true_sizes = [ctx.dims.actual.size(size) for size in sizes]
            stablehlo.return_([_as_value(v) for v in ctx.lower_graph(graph, operands)] + true_sizes)
    results = list(op.results)
    for (i, dim), actual in zip(padded, results[len(results) - len(padded):]):
        results[i] = data_dependent_result(ctx, results[i], actual, ctx.out_meta[i].shape[dim], dim)
    return tuple(results[:len(results) - len(padded)])


def _padded_dims(ctx) -> list[tuple[int, int]]:
    """(result, dim) of each data-dependent dim of the node's results, where its operands are padded (the walk's
    dims are ``PaddedDims``): the branches return padded tensors, and their true sizes beside them."""
    if not isinstance(ctx.dims, PaddedDims) or not ctx.dims.bound:
        return []
    return [(i, dim) for i, meta in enumerate(ctx.out_meta) if isinstance(meta, torch.Tensor)
            for dim, size in enumerate(meta.shape) if isinstance(size, torch.SymInt) and free_unbacked_symbols(size)]


@lower(higher_order.while_loop)
def while_loop(ctx, cond_graph, body_graph, carried, additional=()):
    """``stablehlo.while`` carrying ``carried``: ``while cond_graph(*carried, *additional): carried =
    body_graph(*carried, *additional)``."""
    _result_types(ctx, "while_loop")

    def condition(*values):
        (pred,) = ctx.lower_graph(cond_graph, [*values, *additional])
        return _predicate(ctx, pred)

    def body(*values):
        return _carried(ctx.lower_graph(body_graph, [*values, *additional]), values, "while_loop's body")

    return tuple(emit_while([_as_value(v) for v in carried], _scoped(ctx, condition), _scoped(ctx, body)))


@lower(higher_order.scan)
def scan(ctx, combine_graph, init, xs, additional=()):
    """One ``stablehlo.while`` over the rows of the ``xs`` (reversed ones are flipped around it by torch):
    ``carry, ys[i] = combine_graph(*carry, *[x[i] for x in xs], *additional)``; returns the last carry and the
    stacked ys."""
    return _scan(ctx, combine_graph, list(init), list(xs), list(additional), ctx.literal(2))


@lower(higher_order.map_impl)
def map_impl(ctx, body_graph, xs, args):
    """One ``stablehlo.while`` over the rows of the ``xs``: ``ys[i] = body_graph(*[x[i] for x in xs], *args)``
    (``torch._higher_order_ops.map``)."""
    return _scan(ctx, body_graph, [], list(xs), list(args), ctx.literal(1))


def _scan(ctx, graph, init: list, xs: list, additional: list, x_metas: list) -> tuple:
    """One ``stablehlo.while`` over the leading dim of ``xs`` (never empty: torch refuses that), carrying a
    counter, the carry and the ys, each written into its row of a tensor of the result's shape."""
    op_name = str(ctx.node.target)
    _result_types(ctx, op_name)
    carry_count = len(init)
    y_metas = ctx.out_meta[carry_count:]
    ys = [full_like(ctx, meta.shape, 0, meta.dtype) for meta in y_metas]
    length = ctx.size_value(x_metas[0].shape[0])

    def condition(step, *_):
        return compare(step, length, "LT")

    def body(step, *values):
        rows = [_row(ctx, x, step, meta.shape[1:]) for x, meta in zip(xs, x_metas)]
        outputs = ctx.lower_graph(graph, [*values[:carry_count], *rows, *additional])
        written = [_write_row(ctx, stacked, y, step, meta.shape[1:])
                   for stacked, y, meta in zip(values[carry_count:], outputs[carry_count:], y_metas)]
        carry = _carried(outputs[:carry_count], values[:carry_count], f"{op_name}'s body")
        return [stablehlo.add(step, i64_scalar(1)), *carry, *written]

    initial = [i64_scalar(0), *[_as_value(v) for v in init], *ys]
    return tuple(emit_while(initial, _scoped(ctx, condition), _scoped(ctx, body))[1:])


def _row(ctx, x: ir.Value, step: ir.Value, sizes) -> ir.Value:
    """``x[step]``: the row along dim 0 (of ``sizes``), for a 0-d i64 ``step`` in range."""
    element = value_type(x).element_type
    zeros = [i64_scalar(0)] * len(sizes)
    if is_static(sizes):
        row = stablehlo.dynamic_slice(x, [step, *zeros], [1, *mlir_shape(sizes)])
    else:  # slice sizes known only at run time: JAX's form, which shape refinement makes a dynamic_slice
        one_d = ir.RankedTensorType.get([1], I64())
        start = stablehlo.concatenate([stablehlo.reshape(one_d, i) for i in [step, *zeros]], 0)
        strides = stablehlo.concatenate([stablehlo.reshape(one_d, i64_scalar(1))] * (len(sizes) + 1), 0)
        row = stablehlo.real_dynamic_slice(ir.RankedTensorType.get(mlir_shape([1, *sizes]), element), x, start,
                                           stablehlo.add(start, ctx.shape_value([1, *sizes])), strides)
    return reshape(ctx, row, sizes)


def _write_row(ctx, stacked: ir.Value, row: ir.Value, step: ir.Value, sizes) -> ir.Value:
    """``stacked`` with ``row`` (of ``sizes``) written at ``stacked[step]``."""
    zeros = [i64_scalar(0)] * len(sizes)
    return stablehlo.dynamic_update_slice(stacked, reshape(ctx, _as_value(row), [1, *sizes]), [step, *zeros])


def _scoped(ctx, build):
    """``build`` (a region's contents) with the sizes it computes kept inside that region."""
    def scoped(*values):
        with ctx.dims.scope():
            return build(*values)
    return scoped


def _predicate(ctx, pred) -> ir.Value:
    """A 0-d i1 value of a predicate: a bool, a one-element tensor or a SymBool's value."""
    if isinstance(pred, bool):
        return constant(pred, torch.bool)
    return convert(reshape(ctx, pred, []), torch.bool)


def _as_value(value) -> ir.Value:
    """A value as it is carried: a Python scalar (a loop counter) as a 0-d tensor."""
    return constant(value, SCALAR_DTYPES[type(value)]) if type(value) in SCALAR_DTYPES else value


def _carried(outputs, values, where: str) -> list:
    """A loop body's next carried values, checked to keep the types of ``values``."""
    outputs = [_as_value(v) for v in outputs]
    changed = [(str(v.type), str(o.type)) for v, o in zip(values, outputs) if v.type != o.type]
    if changed:
        raise ValueError(f"{where} changes what it carries: {changed[0][0]} becomes {changed[0][1]}")
    return outputs


def _result_types(ctx, op_name: str, padded_ok: bool = False) -> list[ir.Type]:
    """The node's result types; raises where torch.export gave a tensor result a data-dependent size (its
    branches or steps disagree on a shape), unless ``padded_ok`` (a ``cond`` of padded operands)."""
    types = []
    for meta in ctx.out_meta:
        if not isinstance(meta, torch.Tensor):
            types.append(tensor_type([], SCALAR_DTYPES[type(meta)]))
        elif free_unbacked_symbols(meta.shape) and not padded_ok:
            raise ValueError(f"{op_name} returns a tensor of data-dependent shape {list(meta.shape)} (its branches "
                             "or steps give different shapes); StableHLO's control flow needs one shape")
        else:
            types.append(tensor_type(meta.shape, meta.dtype))
    return types


def _metas(graph: torch.fx.GraphModule) -> list:
    """The metas (or constants) a nested graph returns."""
    output = next(n for n in reversed(graph.graph.nodes) if n.op == "output")
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in output.args[0]]


def _outputs(graph: torch.fx.GraphModule) -> list[str]:
    """The dtypes and shapes a nested graph returns, e.g. ``float32[s0, 4]``."""
    metas = _metas(graph)
    return [f"{str(m.dtype).removeprefix('torch.')}{list(m.shape)}" if isinstance(m, torch.Tensor)
            else type(m).__name__ for m in metas]
