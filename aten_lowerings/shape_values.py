"""Symbolic sizes as MLIR values.

torch.export describes a dynamic dim by a sympy expression over symbols that
stand for input dims. Each symbol is bound once, to ``get_dimension_size`` of
the first graph input that carries it; expressions over symbols become scalar
arithmetic. Sizes are 0-d ``tensor<i64>`` values.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import numpy as np
import sympy
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, Mod, PythonMod

def I64() -> ir.IntegerType:  # noqa: N802  (reads like the type it returns)
    return ir.IntegerType.get_signless(64)


def i64_scalar(value: int) -> ir.Value:
    scalar_type = ir.RankedTensorType.get([], I64())
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(scalar_type, ir.IntegerAttr.get(I64(), int(value))))


class SymbolicDims:
    """Binds shape symbols to graph inputs and emits size expressions (cached per expression)."""

    def __init__(self):
        self._sources: dict[sympy.Expr, tuple[ir.Value, int]] = {}  # a size expression -> an input dim of it
        # a symbol seen only inside a derived dim (``2*s0``, ``s0 + 1``: torch.export's derived Dims)
        self._derived: dict[sympy.Symbol, tuple[ir.Value, int, sympy.Expr]] = {}
        self._cache: dict[sympy.Expr, ir.Value] = {}

    def bind_input(self, value: ir.Value, sizes) -> None:
        for dim, size in enumerate(sizes):
            if isinstance(size, torch.SymInt):
                expr = size.node.expr
                self._sources.setdefault(expr, (value, dim))
                if not isinstance(expr, sympy.Symbol) and len(expr.free_symbols) == 1:
                    (symbol,) = expr.free_symbols
                    if expr.is_polynomial(symbol) and sympy.degree(expr, symbol) == 1:
                        self._derived.setdefault(symbol, (value, dim, expr))

    def size(self, size) -> ir.Value:
        """0-d i64 value of an int or SymInt."""
        if isinstance(size, torch.SymInt):
            pinned = size.node.maybe_as_int()
            return i64_scalar(pinned) if pinned is not None else self._expr(size.node.expr)
        return i64_scalar(size)

    @contextmanager
    def scope(self):
        """Sizes first emitted inside are forgotten on leaving: the region of a control-flow op, whose values do
        not dominate what follows it. Values from outside stay usable inside (regions capture them). Nested
        ``SymbolicDims`` (``PaddedDims.actual``) are scoped with it."""
        saved = dict(self._cache)
        with ExitStack() as nested:
            for dims in [d for d in vars(self).values() if isinstance(d, SymbolicDims)]:
                nested.enter_context(dims.scope())
            try:
                yield
            finally:
                self._cache = saved

    def shape(self, sizes) -> ir.Value:
        """1-d i64 shape tensor for a list of ints/SymInts (for the dynamic_* ops)."""
        if all(isinstance(s, int) for s in sizes):
            shape_type = ir.RankedTensorType.get([len(sizes)], I64())
            return stablehlo.constant(ir.DenseElementsAttr.get(
                np.asarray(sizes, dtype="int64"), type=shape_type))
        one_d = ir.RankedTensorType.get([1], I64())
        parts = [stablehlo.reshape(one_d, self.size(s)) for s in sizes]
        return stablehlo.concatenate(parts, 0)

    def _expr(self, expr: sympy.Expr) -> ir.Value:
        if expr not in self._cache:
            self._cache[expr] = self._emit(expr)
        return self._cache[expr]

    def _emit(self, expr: sympy.Expr) -> ir.Value:
        if isinstance(expr, sympy.Integer):
            return i64_scalar(int(expr))
        if expr in self._sources:
            return _read_size(*self._sources[expr])
        if isinstance(expr, sympy.Symbol):
            if expr in self._derived:  # a*s + b = size, so s = (size - b) / a
                value, dim, derived = self._derived[expr]
                slope, offset = derived.coeff(expr), derived.subs(expr, 0)
                size = stablehlo.subtract(_read_size(value, dim), i64_scalar(int(offset)))
                return stablehlo.divide(size, i64_scalar(int(slope)))
            raise NotImplementedError(
                f"size symbol {expr} is not a dim of any graph input (data-dependent sizes are not supported here)")
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
