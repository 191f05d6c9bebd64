"""Orthogonal polynomials of torch.special: Chebyshev T/U/V/W (plain and shifted to [0, 1]), Hermite H/He,
Laguerre L and Legendre P, each ``f(x, n)`` with a tensor degree ``n``.

The degree is data, so the three-term recurrence runs in a ``stablehlo.while`` loop until every element has
reached its own degree (or turned NaN); an element keeps its value once it is done. The special cases of
torch's CPU kernel come after as selects: 0 for n < 0, the values at the interval's ends, the cos/sin closed
forms of Chebyshev polynomials of high degree inside the interval, Hermite's NaN past a degree limit. As there,
a float degree is truncated to an integer, and one that is NaN or too large for int64 counts as negative.
"""
from __future__ import annotations

import torch
from jaxlib.mlir.dialects import chlo, stablehlo

from ..emit.elementwise import compare, elementwise_operands, scalar
from ..emit.loops import while_loop
from ..emit.reduce import reduce
from ..registry import lower
from ..values import static_shape

aten = torch.ops.aten
add, sub, mul, div, select = stablehlo.add, stablehlo.subtract, stablehlo.multiply, stablehlo.divide, stablehlo.select


def _overloads(name: str):
    """The overloads of ``aten.<name>``: tensor x and n, scalar x, scalar n."""
    packet = getattr(aten, name)
    return packet.default, packet.x_scalar, packet.n_scalar


def _polynomial(evaluate):
    """The rule computing ``evaluate(ctx, x, n)``: x and n promoted to the output's float dtype and broadcast, n
    truncated."""

    def rule(ctx, x, n):
        x, n = elementwise_operands(ctx, x, n, dtype=ctx.out_dtype)
        return evaluate(ctx, x, _degree(ctx, n))

    return rule


def _degree(ctx, n):
    """trunc(n); -1 where torch's cast to int64 does not give a nonnegative number (NaN, >= 2**63, inf)."""
    zero = scalar(ctx, 0, n)
    truncated = select(compare(n, zero, "LT"), stablehlo.ceil(n), stablehlo.floor(n))
    invalid = stablehlo.or_(compare(n, n, "NE"), compare(n, scalar(ctx, 2.0 ** 63, n), "GE"))
    return select(invalid, scalar(ctx, -1, n), truncated)


def _recurrence(ctx, first, steps, step):
    """P_m for m = max(1, steps) from P_0 = 1 and P_1 = ``first``: P_{j+1} = step(j, P_{j-1}, P_j) for
    j = 1, 2, ... while j < steps, elementwise; stops early where a value is NaN, as torch's loops do."""
    one = scalar(ctx, 1, first)
    dims = range(len(static_shape(first)))

    def running(j, q):
        return stablehlo.and_(compare(j, steps, "LT"), compare(q, q, "EQ"))

    def body(j, p, q):
        live = running(j, q)
        return [add(j, one), select(live, q, p), select(live, step(j, p, q), q)]

    def any_running(j, p, q):
        return reduce(ctx, running(j, q), dims, False, stablehlo.or_)

    return while_loop([one, one, first], any_running, body)[2]


def _cases(ctx, value, *cases):
    """``value`` overridden by each ``(where, then)`` in turn (so the last one wins)."""
    for where, then in cases:
        value = select(where, then, value)
    return value


# -- Chebyshev ----------------------------------------------------------------------------------------------

_KINDS = {"t": (6, 6), "u": (8, 6), "v": (8, 6), "w": (8, 4)}
"""Each kind's degree above which |y| < 1 uses the closed form: (plain, shifted), as torch's kernels."""


def _chebyshev(kind: str, shifted: bool):
    def evaluate(ctx, x, n):
        c = lambda number: scalar(ctx, number, x)
        y = sub(add(x, x), c(1)) if shifted else x
        y2 = add(y, y)
        first = {"t": y, "u": y2, "v": sub(y2, c(1)), "w": add(y2, c(1))}[kind]
        at_plus = compare(x, c(1), "EQ")  # y = 1
        at_minus = compare(x, c(0 if shifted else -1), "EQ")  # y = -1
        n1, n21 = add(n, c(1)), add(add(n, n), c(1))
        odd = compare(stablehlo.remainder(n, c(2)), c(0), "NE")
        alternating = lambda v: select(odd, stablehlo.negate(v), v)
        plus, minus = {"t": (c(1), alternating(c(1))), "u": (n1, alternating(n1)),
                       "v": (c(1), alternating(n21)), "w": (n21, alternating(c(1)))}[kind]

        theta = chlo.acos(y)
        if kind == "t":
            closed_value = stablehlo.cosine(mul(n, theta))
        elif kind == "u":
            sin_theta = stablehlo.sine(theta)
            n1_theta = mul(n1, theta)
            closed_value = select(compare(sin_theta, c(0), "NE"), div(stablehlo.sine(n1_theta), sin_theta),
                                  div(mul(n1, stablehlo.cosine(n1_theta)), y))
        else:
            half = div(theta, c(2))
            half_n_theta = mul(add(n, c(0.5)), theta)
            if kind == "v":
                closed_value = select(compare(stablehlo.sine(half), c(1), "NE"),
                                      div(stablehlo.cosine(half_n_theta), stablehlo.cosine(half)), minus)
            else:
                degenerate = minus if shifted else select(compare(x, c(0), "GT"), plus, minus)
                closed_value = select(compare(stablehlo.cosine(half), c(1), "NE"),
                                      div(stablehlo.sine(half_n_theta), stablehlo.sine(half)), degenerate)
        closed = stablehlo.and_(compare(n, c(_KINDS[kind][shifted]), "GT"),
                                compare(stablehlo.abs(y), c(1), "LT"))

        shortcut = stablehlo.or_(closed, stablehlo.or_(at_plus, at_minus))
        value = _recurrence(ctx, first, select(shortcut, c(0), n), lambda j, p, q: sub(mul(y2, q), p))
        return _cases(ctx, value, (compare(n, c(0), "EQ"), c(1)), (closed, closed_value), (at_minus, minus),
                      (at_plus, plus), (compare(n, c(0), "LT"), c(0)))

    return evaluate


for _kind in _KINDS:
    lower(*_overloads(f"special_chebyshev_polynomial_{_kind}"))(_polynomial(_chebyshev(_kind, shifted=False)))
    lower(*_overloads(f"special_shifted_chebyshev_polynomial_{_kind}"))(_polynomial(_chebyshev(_kind, shifted=True)))


# -- Hermite, Laguerre, Legendre ----------------------------------------------------------------------------

_HERMITE_LIMIT = {torch.float32: 128, torch.float64: 512}
"""torch's Hermite kernels give NaN above this degree."""


def _hermite(physicists: bool):
    def evaluate(ctx, x, n):
        c = lambda number: scalar(ctx, number, x)
        too_high = compare(n, c(_HERMITE_LIMIT.get(ctx.out_dtype, 1024)), "GT")
        if physicists:  # H_{j+1} = 2x H_j - 2j H_{j-1}
            x2 = add(x, x)
            step = lambda j, p, q: sub(mul(x2, q), mul(add(j, j), p))
        else:  # He_{j+1} = x He_j - j He_{j-1}
            x2 = x
            step = lambda j, p, q: sub(mul(x, q), mul(j, p))
        value = _recurrence(ctx, x2, select(too_high, c(0), n), step)
        return _cases(ctx, value, (too_high, c(float("nan"))), (compare(n, c(0), "EQ"), c(1)),
                      (compare(n, c(0), "LT"), c(0)))

    return evaluate


lower(*_overloads("special_hermite_polynomial_h"))(_polynomial(_hermite(physicists=True)))
lower(*_overloads("special_hermite_polynomial_he"))(_polynomial(_hermite(physicists=False)))


@lower(*_overloads("special_laguerre_polynomial_l"))
@_polynomial
def laguerre(ctx, x, n):
    """(j + 1) L_{j+1} = (2j + 1 - x) L_j - j L_{j-1}; 1 at x = 0."""
    c = lambda number: scalar(ctx, number, x)
    one_minus_x = sub(c(1), x)
    at_zero, one = compare(x, c(0), "EQ"), c(1)

    def step(j, p, q):
        return div(sub(mul(add(add(j, j), one_minus_x), q), mul(j, p)), add(j, one))

    value = _recurrence(ctx, one_minus_x, select(at_zero, c(0), n), step)
    return _cases(ctx, value, (stablehlo.or_(compare(n, c(0), "EQ"), at_zero), c(1)),
                  (compare(n, c(0), "LT"), c(0)))


@lower(*_overloads("special_legendre_polynomial_p"))
@_polynomial
def legendre(ctx, x, n):
    """(j + 1) P_{j+1} = (2j + 1) x P_j - j P_{j-1}; 1 at x = 1, (-1)^n at x = -1."""
    c = lambda number: scalar(ctx, number, x)
    at_end = compare(stablehlo.abs(x), c(1), "EQ")
    odd = compare(stablehlo.remainder(n, c(2)), c(0), "NE")
    one = c(1)
    end_value = select(stablehlo.and_(odd, compare(x, c(0), "LT")), c(-1), one)

    def step(j, p, q):
        return div(sub(mul(mul(add(add(j, j), one), x), q), mul(j, p)), add(j, one))

    value = _recurrence(ctx, x, select(at_end, c(0), n), step)
    return _cases(ctx, value, (compare(n, c(0), "EQ"), c(1)), (at_end, end_value),
                  (compare(n, c(0), "LT"), c(0)))
