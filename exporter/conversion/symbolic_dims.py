"""Symbolic dims of a signature: the names users gave them, and the checks a call's input sizes must pass.

A signature names each symbolic input dim by its expression over root symbols: ``batch`` (or torch's
``s77`` when the user gave no name), or a derived dim such as ``2*batch`` or ``batch + 1``; ``dims`` maps
each expression torch.export constrained to its ``[min, max]``. A call binds each root symbol from the
inputs (from a derived dim too, by solving ``a*s + b = size``), then every dim must be in its range and
equal to its expression.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import sympy
import torch

from torch_stablehlo.exported_program import shape_env_of
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..errors import DimensionError
from . import dim_grammar


@lru_cache(maxsize=4096)
def parse_dim(text: str) -> sympy.Expr:
    """The sympy expression of a symbolic dim's text (parsed by ``dim_grammar``, never evaluated); every name in it
    is an integer symbol. Raises ``dim_grammar.DimSyntaxError``."""
    return dim_grammar.parse(text)


# -- names -------------------------------------------------------------------------------------------------

def user_dim_names(ep: torch.export.ExportedProgram) -> dict[str, str]:
    """torch's symbol name -> the ``torch.export.Dim`` name the user gave it (``s77`` -> ``batch``).

    torch.export keeps no names in the program itself, but its ShapeEnv (reachable from the placeholders'
    fake tensors, in the process that exported) records for each symbol the input dims it came from and the
    Dim name the user gave each of them. Symbols without a name (``Dim.AUTO``, ``Dim.DYNAMIC``, a program
    loaded from disk) keep torch's; so does any name that would clash with another symbol's.
    """
    shape_env = shape_env_of(ep)
    if shape_env is None:
        return {}
    debug_names = getattr(shape_env, "source_name_to_debug_name", {})
    symbols = {symbol for expr in ep.range_constraints for symbol in expr.free_symbols}
    names: dict[str, str] = {}
    for symbol in sorted(symbols, key=str):
        for source in shape_env.var_to_sources.get(symbol, []):
            source_name = source.name() if callable(source.name) else source.name
            name = debug_names.get(source_name, source_name)
            if name.isidentifier():
                names[str(symbol)] = name
                break
    taken = {str(symbol) for symbol in symbols}
    counts = {name: list(names.values()).count(name) for name in names.values()}
    return {symbol: name for symbol, name in names.items()
            if counts[name] == 1 and (name == symbol or name not in taken)}


def rename_dim(text, names: dict[str, str]):
    """A dim (an int, or a symbolic dim's text) with its symbols renamed by ``names``."""
    if not isinstance(text, str) or not names:
        return text
    expr = parse_dim(text)
    renamed = expr.subs({symbol: sympy.Symbol(names[str(symbol)], integer=True)
                         for symbol in expr.free_symbols if str(symbol) in names}, simultaneous=True)
    return str(renamed)


def renamed_spec(spec: TensorSpec | None, names: dict[str, str]) -> TensorSpec | None:
    if spec is None or not names:
        return spec
    return dataclasses.replace(spec, shape=tuple(rename_dim(d, names) for d in spec.shape))


# -- checks at call time -------------------------------------------------------------------------------------

@dataclass
class _Dim:
    input: str
    index: int
    text: str
    expr: sympy.Expr
    size: int

    def where(self) -> str:
        return f"input '{self.input}' dim {self.index}"


def check_dims(specs: Sequence[TensorSpec], values: Sequence, ranges: dict[str, list]) -> dict[str, int]:
    """Bind the root symbols from the sizes of ``values`` (tensors matching ``specs``) and check every symbolic
    dim: within its range (``ranges``: dim text -> [min, max], max None when unbounded), and equal to its
    expression. Returns symbol name -> size; raises DimensionError naming the input, the dim, the size given
    and the range or relation it breaks."""
    dims = [_Dim(spec.name, index, text, parse_dim(text), int(value.shape[index]))
            for spec, value in zip(specs, values) for index, text in enumerate(spec.shape) if isinstance(text, str)]
    for dim in dims:
        check_range(dim.text, dim.size, ranges, f"{dim.where()} is {dim.size}, outside the allowed range {{}} of "
                                                 f"its symbolic dim {dim.text}")
    bound: dict[sympy.Symbol, tuple[int, _Dim]] = {}
    pending = sorted(dims, key=lambda d: not isinstance(d.expr, sympy.Symbol))  # plain symbols bind first
    while pending:
        progress = False
        for dim in list(pending):
            free = [s for s in dim.expr.free_symbols if s not in bound]
            if not free:
                _check_relation(dim, bound)
            elif len(free) == 1 and dim.expr.is_polynomial(free[0]) and sympy.degree(dim.expr, free[0]) == 1:
                bound[free[0]] = (_solve(dim, free[0], bound), dim)
            else:
                continue
            pending.remove(dim)
            progress = True
        if not progress:  # not linear in one unknown: nothing more to bind (torch's input dims always are)
            break
    for symbol, (size, dim) in bound.items():
        if dim.expr != symbol:  # a root bound through a derived dim: its own range applies too
            check_range(str(symbol), size, ranges, f"{dim.where()} is {dim.size} ({dim.text}), which gives "
                                                     f"{symbol} = {size}, outside the allowed range {{}} of {symbol}")
    return {str(symbol): size for symbol, (size, _) in bound.items()}


def check_range(text: str, size: int, ranges: dict, message: str) -> None:
    """Raise DimensionError(``message`` with the range filled in) if ``size`` is outside dim ``text``'s range."""
    low, high = ranges.get(text, (None, None))
    if (low is not None and size < low) or (high is not None and size > high):
        raise DimensionError(message.format(f"[{low}, {'inf' if high is None else high}]"))


def _values(bound: dict) -> dict:
    return {symbol: size for symbol, (size, _) in bound.items()}


def _origin(symbol, bound) -> str:
    size, dim = bound[symbol]
    return f"{symbol} = {size} from {dim.where()}"


def _check_relation(dim: _Dim, bound: dict) -> None:
    expected = int(dim.expr.subs(_values(bound)))
    if expected == dim.size:
        return
    origins = "; ".join(_origin(s, bound) for s in sorted(dim.expr.free_symbols, key=str))
    if isinstance(dim.expr, sympy.Symbol):
        raise DimensionError(f"{dim.where()} is {dim.size}, but it is the symbolic dim {dim.text}, which must be "
                             f"the same on every input that has it ({origins})")
    raise DimensionError(f"{dim.where()} is {dim.size}, but it must equal {dim.text} = {expected} ({origins})")


def _solve(dim: _Dim, symbol: sympy.Symbol, bound: dict) -> int:
    """The size of ``symbol`` for which ``dim.expr`` (linear in it) equals the dim's size."""
    expr = dim.expr.subs(_values(bound))
    slope, offset = expr.coeff(symbol), expr.subs(symbol, 0)
    root = sympy.Rational(dim.size - offset, slope)
    if not root.is_integer:
        raise DimensionError(f"{dim.where()} is {dim.size}, but it must be {dim.text} for an integer {symbol} "
                             f"({dim.size} is not {expr} for any integer {symbol})")
    return int(root)
