"""Conversion reads the program it is given and changes nothing in it: ``ep.module()`` behaves after
``export_to_stablehlo(ep)`` exactly as before, its guards included.

What a conversion could change unseen is the program's ShapeEnv: ``int()``, ``float()`` or ``bool()`` of a SymInt,
or a branch on one, records a guard or replaces the symbol by the one value it has in the example (a
specialisation), after which ``ep.module()`` stops checking the symbol's range and the module emitted holds that one
value. Rules take symbolic sizes as values (``aten_lowerings`` refuses to cast them); ``untouched`` is the net
beneath: whatever a conversion recorded in the ShapeEnv is undone, and a specialisation is an error naming the
symbol, since the module emitted would be right for one size only.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import sympy
from torch.utils._sympy.symbol import SymT, symbol_is_type

from ..errors import LoweringError


@dataclass(frozen=True)
class ShapeEnvRecords:
    """What a ShapeEnv has recorded about its symbols (the parts a guard or a specialisation changes)."""
    replacements: dict
    var_to_range: dict
    guards: int
    divisible: frozenset
    deferred_runtime_asserts: dict
    num_deferred_runtime_asserts: int

    @classmethod
    def of(cls, shape_env) -> "ShapeEnvRecords":
        return cls(dict(shape_env.replacements), dict(shape_env.var_to_range), len(shape_env.guards),
                   frozenset(shape_env.divisible),
                   {symbol: list(asserts) for symbol, asserts in shape_env.deferred_runtime_asserts.items()},
                   shape_env.num_deferred_runtime_asserts)

    def restore(self, shape_env) -> None:
        shape_env.replacements = dict(self.replacements)
        shape_env.var_to_range = dict(self.var_to_range)
        del shape_env.guards[self.guards:]
        shape_env.divisible = set(self.divisible)
        shape_env.deferred_runtime_asserts = {s: list(a) for s, a in self.deferred_runtime_asserts.items()}
        shape_env.num_deferred_runtime_asserts = self.num_deferred_runtime_asserts
        shape_env._update_version_counter()  # its caches are keyed by what it has recorded


@contextmanager
def untouched(shape_env, what: str = "converting"):
    """Run the body, then undo whatever it recorded in ``shape_env`` (None: nothing to watch); raises
    LoweringError where it specialised a symbol (replaced it by a number)."""
    if shape_env is None:
        yield
        return
    before = ShapeEnvRecords.of(shape_env)
    try:
        yield
    finally:
        after = ShapeEnvRecords.of(shape_env)
        if after != before:
            before.restore(shape_env)
    specialised = {symbol: value for symbol, value in after.replacements.items()
                   if symbol not in before.replacements and isinstance(value, sympy.Integer)
                   and not _forced(symbol, value, before, after)}
    if specialised:
        named = ", ".join(f"{symbol} to {value}" for symbol, value in sorted(specialised.items(), key=str))
        raise LoweringError(f"{what} specialised the symbolic size {named} (a lowering read it as a number), so the "
                            "module would hold that one value; the program was left as it was. Please report it with "
                            "the program: a rule must take the size as a value (ctx.dims.size)")


def _forced(symbol: sympy.Symbol, value: sympy.Integer, before: ShapeEnvRecords, after: ShapeEnvRecords) -> bool:
    """Whether ``value`` is the only one the program allows the symbol, so replacing the symbol by it specialises
    nothing: the range the symbol had is ``value`` alone (the program's checks force it, ``torch._check(u == 5)``).
    A symbol the decomposition's retrace made is new: a data-dependent one stands for one of the program's (the
    retrace renames it so), so the range it has must be ``value`` alone; a backed one stands for an int input the
    program holds constant (its guard pins the new symbol to that constant)."""
    bounds = before.var_to_range.get(symbol)
    if bounds is None:
        if not symbol_is_type(symbol, SymT.UNBACKED_INT):
            return True
        bounds = after.var_to_range.get(symbol)
    return bounds is not None and bounds.lower == bounds.upper == value
