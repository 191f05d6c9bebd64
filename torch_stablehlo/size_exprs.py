"""Size expressions in integer arithmetic: torch prints a size computed through floats (``round(s / 2.0)`` is
``RoundToInt(FloatTrueDiv(ToFloat(s), 2.0))``); ``integer_expr`` rewrites such an expression, where it is exactly
an integer function of the size, into the integer functions a dim's text and the size emitters know (``//``,
``%``, ``Min``, ``Max``). Anything else is left as it is (and refused, naming it, where it is read)."""
from __future__ import annotations

import sympy
from torch.utils._sympy.functions import (CeilDiv, CeilToInt, FloatTrueDiv, FloorDiv, FloorToInt, Max, Min, Mod,
                                          RoundToInt, ToFloat)


def integer_expr(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ``round``, ``floor`` or ``ceil`` of a non-negative size divided by a positive integer
    rewritten as integer arithmetic (``round`` halves to even, as Python's does)."""
    if not expr.has(RoundToInt, FloorToInt, CeilToInt):
        return expr
    return expr.replace(lambda e: isinstance(e, (RoundToInt, FloorToInt, CeilToInt)) and _quotient(e) is not None,
                        _rounded)


def _quotient(rounded) -> tuple[sympy.Expr, int] | None:
    """(a, c) where ``rounded`` rounds ``a / c``, ``a`` a non-negative integer expression, ``c`` a positive
    integer (written as a float or an integer)."""
    inner = rounded.args[0]
    if not isinstance(inner, FloatTrueDiv):
        return None
    numerator, denominator = inner.args
    numerator = numerator.args[0] if isinstance(numerator, ToFloat) else numerator
    if not (numerator.is_integer and numerator.is_nonnegative) or not denominator.is_number \
            or not float(denominator).is_integer() or float(denominator) <= 0:
        return None
    return numerator, int(denominator)


def _rounded(rounded) -> sympy.Expr:
    a, c = _quotient(rounded)
    if isinstance(rounded, FloorToInt):
        return FloorDiv(a, c)
    if isinstance(rounded, CeilToInt):
        return CeilDiv(a, c)
    quotient, twice_remainder = FloorDiv(a, c), 2 * Mod(a, c)
    above = Min(1, Max(0, twice_remainder - c))  # the remainder is over half: round up
    below = Min(1, Max(0, c - twice_remainder))  # under half: round down
    return quotient + above + (1 - above - below) * Mod(quotient, 2)  # exactly half: to the even neighbour
