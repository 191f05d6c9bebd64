"""Size expressions in integer arithmetic: torch prints a size computed through floats (``round(s / 2.0)`` is
``RoundToInt(FloatTrueDiv(ToFloat(s), 2.0))``); ``integer_expr`` rewrites such an expression, where it is exactly
an integer function of the size, into the integer functions a dim's text and the size emitters know (``//``,
``%``, ``Min``, ``Max``). Anything else is left as it is (and refused, naming it, where it is read)."""
from __future__ import annotations

import sympy
from torch.utils._sympy.functions import (CeilDiv, CeilToInt, FloatTrueDiv, FloorDiv, FloorToInt, Max, Min, Mod,
                                          RoundToInt, ToFloat, TruncToInt)


_ROUNDINGS = (RoundToInt, FloorToInt, CeilToInt, TruncToInt)


def integer_expr(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ``round``, ``floor``, ``ceil`` or ``trunc`` of a non-negative size divided by a positive
    integer (or times a float no smaller than its reciprocal, as ``interpolate(scale_factor=0.5)`` sizes are)
    rewritten as integer arithmetic (``round`` halves to even, as Python's does)."""
    if not expr.has(*_ROUNDINGS):
        return expr
    return expr.replace(lambda e: isinstance(e, _ROUNDINGS) and _quotient(e) is not None, _rounded)


def _quotient(rounded) -> tuple[sympy.Expr, int] | None:
    """(a, c) where ``rounded`` rounds ``a / c``, ``a`` a non-negative integer expression, ``c`` a positive
    integer (written as a float or an integer)."""
    inner = rounded.args[0]
    if isinstance(inner, sympy.Mul) and len(inner.args) == 2 and inner.args[0].is_number:
        factor, numerator = inner.args
        if float(factor).is_integer() and float(factor) > 0:  # a size times 2.0: exact
            numerator, denominator = _integer(numerator) * int(factor), sympy.Integer(1)
        else:
            numerator, denominator = numerator, _reciprocal(factor)
        if denominator is None:
            return None
    elif isinstance(inner, FloatTrueDiv):
        numerator, denominator = inner.args
    else:
        return None
    numerator = _integer(numerator)
    if not (numerator.is_integer and numerator.is_nonnegative) or not denominator.is_number \
            or not float(denominator).is_integer() or float(denominator) <= 0:
        return None
    return numerator, int(denominator)


def _integer(value: sympy.Expr) -> sympy.Expr:
    return value.args[0] if isinstance(value, ToFloat) else value


def _reciprocal(factor) -> sympy.Integer | None:
    """The positive integer ``c`` where multiplying by the float ``factor`` divides by ``c`` exactly enough to
    round alike: ``factor`` (its binary value) is ``1 / c`` or just above it (``0.5``; ``0.1``, not ``1 / 3``)."""
    value = float(factor)
    if not value > 0 or not 1 / value < 2 ** 31:
        return None
    c = round(1 / value)
    exact = sympy.Rational(value)  # the float's binary value
    return sympy.Integer(c) if c >= 1 and exact >= sympy.Rational(1, c) and exact * c - 1 < sympy.Rational(1, 2 ** 40) \
        else None


def _rounded(rounded) -> sympy.Expr:
    a, c = _quotient(rounded)
    if isinstance(rounded, (FloorToInt, TruncToInt)):  # the quotient is non-negative: trunc is floor
        return FloorDiv(a, c)
    if isinstance(rounded, CeilToInt):
        return CeilDiv(a, c)
    quotient, twice_remainder = FloorDiv(a, c), 2 * Mod(a, c)
    above = Min(1, Max(0, twice_remainder - c))  # the remainder is over half: round up
    below = Min(1, Max(0, c - twice_remainder))  # under half: round down
    return quotient + above + (1 - above - below) * Mod(quotient, 2)  # exactly half: to the even neighbour
