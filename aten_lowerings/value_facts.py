"""Facts about values that their types do not say, recorded by the graph walk as it lowers each node and read by
the rules that care. A rule decides from its operands and these facts, never by reading back the ops other rules
emitted (how ``arange`` or ``add`` is lowered cannot change what ``index_copy`` emits).

- A range: a 1-d integer value that is ``start, start + 1, ...`` (an ``arange`` of step 1 plus numbers:
  transformers' static cache writes at ``arange(n) + cumulative_length``). Its start is kept as the terms of a
  sum and emitted only where a rule asks for it (``range_start``).
- Non-negative: an integer value all of whose elements are >= 0 (``arange`` indices through layout ops, widening
  conversions, sums and products), which an index needs no wrap for.

Each fact is derived from the node's torch op, its literal arguments and its operands' facts (``_derive``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .promotion import convert
from .shape_values import i64_scalar, size_expr

aten, prims = torch.ops.aten, torch.ops.prims

_LAYOUT = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
           aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.expand.default, aten.permute.default,
           aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int, aten.clone.default,
           aten.alias.default, aten.contiguous.default, aten.detach.default, aten.lift_fresh_copy.default,
           aten.repeat.default, aten.flatten.using_ints}  # a non-negative operand's values, moved
_CASTS = {aten._to_copy.default, aten.to.dtype, aten.type_as.default, prims.convert_element_type.default}
_ARANGE = {aten.arange.default, aten.arange.start, aten.arange.start_step}


class Range(NamedTuple):
    """A 1-d value ``start, start + 1, ...``: ``start`` is the sum of ``terms`` (ints, or values of one
    element)."""
    terms: tuple


class ValueFacts:
    """The facts known about the values lowered so far (by value)."""

    def __init__(self):
        self._ranges: dict[ir.Value, Range] = {}
        self._non_negative: set[ir.Value] = set()

    def non_negative(self, value: ir.Value) -> bool:
        """Whether every element of ``value`` is known to be >= 0."""
        return value in self._non_negative

    def range_start(self, value: ir.Value) -> ir.Value | None:
        """The first element of ``value`` as a 0-d int64 value (emitted here) when it is known to be a range."""
        found = self._ranges.get(value)
        if found is None:
            return None
        start = None
        for term in found.terms:
            term = i64_scalar(term) if isinstance(term, int) else convert(_scalar(term), torch.int64)
            start = term if start is None else stablehlo.add(start, term)
        return start

    def record(self, node: torch.fx.Node, args, result) -> None:
        """Record what ``node`` (its arguments lowered to ``args``) makes known about its result."""
        if not isinstance(result, ir.Value) or not isinstance(node.meta.get("val"), torch.Tensor):
            return
        if node.meta["val"].dtype.is_floating_point or node.meta["val"].dtype.is_complex:
            return
        arguments = list(zip(node.args, args))
        derived_range, non_negative = _derive(self, node, arguments)
        if derived_range is not None and node.meta["val"].dim() == 1:
            self._ranges[result] = derived_range
        if non_negative:
            self._non_negative.add(result)


def _derive(facts: ValueFacts, node: torch.fx.Node, arguments) -> tuple[Range | None, bool]:
    """(the result's range or None, whether it is non-negative) for ``node`` over ``arguments`` (pairs of an FX
    argument and its lowered value)."""
    target = node.target
    if target in _ARANGE:  # arange(end), arange(start, end), arange(start, end, step)
        start_argument, start = arguments[0] if len(arguments) > 1 else (0, 0)
        step = arguments[2][1] if len(arguments) > 2 else 1
        is_range = step == 1 and (isinstance(start, ir.Value) or _is_int(start))
        return (Range((start,)) if is_range else None,
                _is_number(step) and step > 0 and _known_non_negative(facts, start_argument, start))
    if not arguments:
        return None, False
    (first, first_value), rest = arguments[0], arguments[1:]
    if target in _LAYOUT:
        same = node.meta["val"].dim() == 1 and _same_shape(_shape(first), tuple(node.meta["val"].shape))  # as it is
        return (facts._ranges.get(first_value) if same else None), _known_non_negative(facts, first, first_value)
    if target in _CASTS:
        source = first.meta["val"].dtype if isinstance(first, torch.fx.Node) else None
        widening = source is not None and not source.is_floating_point and not source.is_complex and (
            source == torch.bool or node.meta["val"].itemsize >= source.itemsize)
        return (facts._ranges.get(first_value) if _shape(first) is not None and len(_shape(first)) == 1 else None,
                widening and _known_non_negative(facts, first, first_value))
    if target in (aten.add.Tensor, aten.add.Scalar) and len(rest) >= 1 and node.kwargs.get("alpha", 1) == 1:
        (second, second_value) = rest[0]
        both = _known_non_negative(facts, first, first_value) and _known_non_negative(facts, second, second_value)
        for ranged, number in (((first, first_value), (second, second_value)),
                               ((second, second_value), (first, first_value))):
            found = facts._ranges.get(ranged[1]) if isinstance(ranged[1], ir.Value) else None
            if found is not None and _one_element(*number):
                return Range(found.terms + (number[1],)), both
        return None, both
    if target in (aten.mul.Tensor, aten.mul.Scalar) and len(rest) >= 1:
        (second, second_value) = rest[0]
        kept = facts._ranges.get(first_value) if isinstance(first_value, ir.Value) and second_value == 1 else None
        return kept, (_known_non_negative(facts, first, first_value)
                      and _known_non_negative(facts, second, second_value))
    if target is aten.cat.default:
        return None, all(_known_non_negative(facts, a, v) for a, v in zip(first, first_value))
    return None, False


def _known_non_negative(facts: ValueFacts, argument, value) -> bool:
    """Whether an argument (a tensor, a size, a number) is known to be >= 0."""
    if isinstance(value, ir.Value):
        meta = argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None
        if isinstance(meta, torch.SymInt):
            return bool(size_expr(meta).is_nonnegative)
        return facts.non_negative(value)
    return _is_number(value) and value >= 0


def _one_element(argument, value) -> bool:
    """Whether an argument is one number: a literal, a size, or a tensor of one element."""
    if not isinstance(value, ir.Value):
        return _is_int(value)
    meta = argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None
    return isinstance(meta, torch.SymInt) or (isinstance(meta, torch.Tensor) and statically_known_true(meta.numel() == 1)
                                              and not meta.dtype.is_floating_point)


def _same_shape(shape, other: tuple) -> bool:
    """Whether two torch shapes are known equal without a guard (a data-dependent size may be in either)."""
    return shape is not None and len(shape) == len(other) and all(
        statically_known_true(size == other_size) for size, other_size in zip(shape, other))


def _shape(argument) -> tuple | None:
    """A tensor argument's torch sizes (None for anything else)."""
    meta = argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None
    return tuple(meta.shape) if isinstance(meta, torch.Tensor) else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(value: ir.Value) -> ir.Value:
    """A value of one element as a 0-d value."""
    value_type = ir.RankedTensorType(value.type)
    if value_type.rank == 0:
        return value
    return stablehlo.reshape(ir.RankedTensorType.get([], value_type.element_type), value)

