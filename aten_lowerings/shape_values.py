"""Symbolic sizes as MLIR values.

torch.export describes a dynamic dim by a sympy expression over symbols that
stand for input dims. Each symbol is bound once, to ``get_dimension_size`` of
the first graph input that carries it; expressions over symbols become scalar
arithmetic. Sizes are 0-d ``tensor<i64>`` values.

Every size, shape tensor and dim read is emitted once and reused (cached by its expression, its tuple of
sizes, its value and dim), so a dynamic module stays close to its static twin in size; ``scope`` keeps
values emitted inside a control-flow region from being handed out after it.
"""
from __future__ import annotations

import itertools
from contextlib import ExitStack, contextmanager

import numpy as np
import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, Mod, PythonMod

from torch_stablehlo.size_exprs import integer_expr

def I64() -> ir.IntegerType:  # noqa: N802  (reads like the type it returns)
    return ir.IntegerType.get_signless(64)


def i64_scalar(value: int) -> ir.Value:
    scalar_type = ir.RankedTensorType.get([], I64())
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(scalar_type, ir.IntegerAttr.get(I64(), int(value))))


def size_expr(size) -> sympy.Expr:
    """An int or SymInt as a sympy expression (an integer where export pinned it)."""
    if isinstance(size, torch.SymInt):
        pinned = size.node.maybe_as_int()
        return sympy.Integer(pinned) if pinned is not None else integer_expr(size.node.expr)
    return sympy.Integer(size)


class SymbolicDims:
    """Binds shape symbols to graph inputs and emits size expressions, shape tensors and dim reads, each once."""

    def __init__(self):
        self._sources: dict[sympy.Expr, tuple[ir.Value, int]] = {}  # a size expression -> an input dim of it
        # a symbol seen only inside a derived dim (``2*s0``, ``s0 + 1``: torch.export's derived Dims)
        self._derived: dict[sympy.Symbol, tuple[ir.Value, int, sympy.Expr]] = {}
        self._cache: dict[sympy.Expr, ir.Value] = {}
        self._shapes: dict[tuple, ir.Value] = {}  # sizes (expressions, or 0-d values) -> their shape tensor
        self._reads: dict[tuple[ir.Value, int], ir.Value] = {}  # (value, dim) -> its size
        self._known: dict[ir.Value, tuple[sympy.Expr, ...]] = {}  # a value -> its torch sizes
        self._named: dict[ir.Value, sympy.Expr] = {}  # a size value emitted here -> its expression
        self._scalars: dict[sympy.Symbol, ir.Value] = {}  # a symbol that is an int argument's value (0-d i64)

    def bind_input(self, value: ir.Value, sizes) -> None:
        self.note(value, sizes)
        for dim, size in enumerate(sizes):
            if isinstance(size, torch.SymInt):
                expr = size.node.expr
                self._sources.setdefault(expr, (value, dim))
                if not isinstance(expr, sympy.Symbol) and len(expr.free_symbols) == 1:
                    (symbol,) = expr.free_symbols
                    if expr.is_polynomial(symbol) and sympy.degree(expr, symbol) == 1:
                        self._derived.setdefault(symbol, (value, dim, expr))

    def bind_scalar(self, symbol: sympy.Symbol, value: ir.Value) -> None:
        """``symbol`` is the value of an int argument (``value``, 0-d i64), where no input dim has it."""
        self._scalars.setdefault(symbol, value)

    def size(self, size) -> ir.Value:
        """0-d i64 value of an int or SymInt; a 0-d i64 value is returned as it is."""
        return size if isinstance(size, ir.Value) else self._expr(size_expr(size))

    def note(self, value: ir.Value, sizes) -> None:
        """Record ``value``'s torch sizes (a lowered node's meta), so ``read`` and ``sizes_of`` know them. Sizes
        that do not fit the value's type (a rule returning another layout) are not recorded."""
        exprs = tuple(size_expr(s) for s in sizes)
        shape = value.type.shape if isinstance(value.type, ir.RankedTensorType) else None
        if shape is not None and len(shape) == len(exprs) and all(
                not e.is_Integer or int(e) == d for e, d in zip(exprs, shape) if d != ir.ShapedType.get_dynamic_size()):
            self._known[value] = exprs

    def is_size(self, value: ir.Value) -> bool:
        """Whether ``value`` is a size emitted here (an expression of input dims, not a number read from data)."""
        return value in self._named

    def sizes_of(self, value: ir.Value) -> tuple[sympy.Expr, ...] | None:
        """``value``'s torch sizes as sympy expressions, where ``note`` recorded them."""
        return self._known.get(value)

    def read(self, value: ir.Value, dim: int) -> ir.Value:
        """0-d i64 size of ``value``'s dim ``dim``: its size expression where known, else ``get_dimension_size``
        (once per value and dim)."""
        known = self._known.get(value)
        if known is not None and self._emittable(known[dim]):
            return self._expr(known[dim])
        return self._read(value, dim)

    def _read(self, value: ir.Value, dim: int) -> ir.Value:
        if (value, dim) not in self._reads:
            self._reads[value, dim] = _read_size(value, dim)
        return self._reads[value, dim]

    @contextmanager
    def scope(self):
        """Sizes first emitted inside are forgotten on leaving: the region of a control-flow op, whose values do
        not dominate what follows it. Values from outside stay usable inside (regions capture them). Nested
        ``SymbolicDims`` (``PaddedDims.actual``) are scoped with it."""
        saved = dict(self._cache), dict(self._shapes), dict(self._reads)
        with ExitStack() as nested:
            for dims in [d for d in vars(self).values() if isinstance(d, SymbolicDims)]:
                nested.enter_context(dims.scope())
            try:
                yield
            finally:
                self._cache, self._shapes, self._reads = saved

    def shape(self, sizes) -> ir.Value:
        """1-d i64 shape tensor (for the dynamic_* ops) of ints, SymInts and 0-d i64 values."""
        return self._shape(tuple(self._named.get(s, s) if isinstance(s, ir.Value) else size_expr(s) for s in sizes))

    def _shape(self, key: tuple) -> ir.Value:
        """A run of static sizes is one constant, a symbolic size one reshaped scalar; other shapes concatenate
        those parts. Each is cached, so shapes that share a size or a run share its part."""
        if key in self._shapes:
            return self._shapes[key]
        if all(isinstance(s, sympy.Integer) for s in key):
            shape_type = ir.RankedTensorType.get([len(key)], I64())
            value = stablehlo.constant(ir.DenseElementsAttr.get(np.asarray(key, dtype="int64"), type=shape_type))
        elif len(key) == 1:
            (size,) = key
            scalar = size if isinstance(size, ir.Value) else self._expr(size)
            value = stablehlo.reshape(ir.RankedTensorType.get([1], I64()), scalar)
        else:
            runs = itertools.groupby(key, key=lambda s: isinstance(s, sympy.Integer))
            parts = [p for static, run in runs for p in ([tuple(run)] if static else [(s,) for s in run])]
            value = stablehlo.concatenate([self._shape(part) for part in parts], 0)
        self._shapes[key] = value
        return value

    def _emittable(self, expr: sympy.Expr) -> bool:
        """Whether every symbol of ``expr`` is bound (to an input dim, or by ``PaddedDims.bind``)."""
        return all(s in self._cache or s in self._sources or s in self._derived or s in self._scalars
                   for s in expr.free_symbols)

    def _expr(self, expr: sympy.Expr) -> ir.Value:
        if expr not in self._cache:
            self._cache[expr] = self._emit(expr)
            self._named[self._cache[expr]] = expr
        return self._cache[expr]

    def _emit(self, expr: sympy.Expr) -> ir.Value:
        if isinstance(expr, sympy.Integer):
            return i64_scalar(int(expr))
        if expr in self._sources:
            return self._read(*self._sources[expr])
        if isinstance(expr, sympy.Symbol):
            if expr in self._scalars:
                return self._scalars[expr]
            if expr in self._derived:  # a*s + b = size, so s = (size - b) / a
                value, dim, derived = self._derived[expr]
                slope, offset = derived.coeff(expr), derived.subs(expr, 0)
                size = stablehlo.subtract(self._read(value, dim), i64_scalar(int(offset)))
                return stablehlo.divide(size, i64_scalar(int(slope)))
            raise NotImplementedError(
                f"the size {expr} is data-dependent (from .item(), nonzero, ...) and has no upper bound, so no padded "
                f"size can hold it: bound it where it is made (torch._check({expr} <= N)), or make the size static")
        operands = [self._expr(a) for a in expr.args]
        if isinstance(expr, sympy.Add):
            return _fold(stablehlo.add, operands)
        if isinstance(expr, sympy.Mul):
            return _fold(stablehlo.multiply, operands)
        if isinstance(expr, (FloorDiv,)):
            return stablehlo.divide(*operands)  # sizes are non-negative: truncation is floor
        if isinstance(expr, CeilDiv):
            num, den = operands
            one = i64_scalar(1)
            return stablehlo.divide(stablehlo.subtract(stablehlo.add(num, den), one), den)
        if isinstance(expr, (Mod, PythonMod)):
            return stablehlo.remainder(*operands)
        if isinstance(expr, Max):
            return _fold(stablehlo.maximum, operands)
        if isinstance(expr, Min):
            return _fold(stablehlo.minimum, operands)
        if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and expr.exp > 0:
            return _fold(stablehlo.multiply, [operands[0]] * int(expr.exp))
        raise NotImplementedError(f"cannot emit the size expression {expr} ({type(expr).__name__})")


def _read_size(value: ir.Value, dim: int) -> ir.Value:
    return stablehlo.convert(ir.RankedTensorType.get([], I64()), stablehlo.get_dimension_size(value, dim))


def _fold(op, operands):
    result = operands[0]
    for operand in operands[1:]:
        result = op(result, operand)
    return result
