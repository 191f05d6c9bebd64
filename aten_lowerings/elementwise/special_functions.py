"""torch.special's transcendental functions: polygamma and Hurwitz zeta following torch's own algorithm; modified
Bessel functions, incomplete gamma, ndtri, log_ndtr and erfcx from JAX's implementations
(``emit.jax_functions.call_jax``).

Operands are promoted as torch does and computed in float32 at least (torch's low-precision kernels compute
in float32 too); the result is rounded to the output dtype once.
"""
from __future__ import annotations

import math

import jax.scipy.special as jsp
import sympy
import torch
from jaxlib.mlir.dialects import chlo, stablehlo

from ..constants import full_like
from ..emit.elementwise import compare, elementwise, scalar, signbit_values
from ..emit.jax_functions import call_jax
from ..emit.loops import while_loop
from ..emit.reduce import reduce
from ..registry import lower

aten = torch.ops.aten


def _jax_elementwise(jax_function):
    """The rule running ``jax_function`` (elementwise) on the operands broadcast to the output."""
    return elementwise(lambda ctx, *values: call_jax(ctx, jax_function, values, [ctx.out_shape] * len(values))[0])


for _function, _targets in {
    jsp.i0: [aten.i0.default, aten.special_i0.default, aten.special_modified_bessel_i0.default],
    jsp.i0e: [aten.special_i0e.default],
    jsp.i1: [aten.special_i1.default, aten.special_modified_bessel_i1.default],
    jsp.i1e: [aten.special_i1e.default],
    jsp.gammainc: [aten.igamma.default, aten.special_gammainc.default],
    jsp.gammaincc: [aten.igammac.default, aten.special_gammaincc.default],
    jsp.ndtri: [aten.special_ndtri.default],
    jsp.log_ndtr: [aten.special_log_ndtr.default],
    jsp.erfcx: [aten.special_erfcx.default],
}.items():
    lower(*_targets)(_jax_elementwise(_function))


# -- polygamma and Hurwitz zeta, computed as torch's CPU kernels do ------------------------------------------
# Both are ill-conditioned for negative arguments (sums of large terms of both signs), where a different
# algorithm gives a different answer: we follow torch's (Cephes') steps, in the operand dtype.

_EPSILON = 1.11022302462515654042e-16  # torch uses double's machine epsilon as the stopping test in every dtype
_EULER_MACLAURIN = [math.factorial(2 * k) / float(sympy.bernoulli(2 * k)) for k in range(1, 13)]
"""(2k)! / B_2k: the denominators of the Euler-Maclaurin tail."""


@lower(aten.polygamma.default, aten.special_polygamma.default)
def polygamma(ctx, n: int, x):
    return elementwise(lambda ctx, x: _polygamma(ctx, n, x))(ctx, x)


def digamma(ctx, x):
    """CHLO's digamma, with torch's values at the poles: -inf at +0, +inf at -0, NaN at negative integers."""
    zero = scalar(ctx, 0.0, x)
    at_zero = stablehlo.select(signbit_values(ctx, x), scalar(ctx, float("inf"), x), scalar(ctx, float("-inf"), x))
    result = stablehlo.select(compare(x, zero, "EQ"), at_zero, chlo.digamma(x))
    negative_integer = stablehlo.and_(compare(x, zero, "LT"), compare(stablehlo.floor(x), x, "EQ"))
    return stablehlo.select(negative_integer, scalar(ctx, float("nan"), x), result)


lower(aten.digamma.default, aten.special_digamma.default, aten.special_psi.default)(elementwise(digamma))


def _polygamma(ctx, n: int, x):
    if n == 0:
        return digamma(ctx, x)
    if n == 1:
        return _trigamma(ctx, x)
    sign = 1.0 if n % 2 else -1.0
    return stablehlo.multiply(scalar(ctx, sign * math.factorial(n), x), hurwitz_zeta(ctx, scalar(ctx, n + 1, x), x))


def _trigamma(ctx, x):
    """Reflection below 1/2, six steps of the recurrence, then the asymptotic series."""
    c = lambda number: scalar(ctx, number, x)  # noqa: E731
    reflect = compare(x, c(0.5), "LT")
    sin_pi_x = stablehlo.sine(stablehlo.multiply(c(math.pi), x))
    result = stablehlo.select(reflect, stablehlo.negate(stablehlo.divide(
        c(math.pi * math.pi), stablehlo.multiply(sin_pi_x, sin_pi_x))), c(0.0))
    x = stablehlo.select(reflect, stablehlo.subtract(c(1.0), x), x)
    for _ in range(6):
        result = stablehlo.add(result, stablehlo.divide(c(1.0), stablehlo.multiply(x, x)))
        x = stablehlo.add(x, c(1.0))
    inverse_square = stablehlo.divide(c(1.0), stablehlo.multiply(x, x))
    series = c(1 / 42)
    for coefficient in (1 / 30, 1 / 6):
        series = stablehlo.subtract(c(coefficient), stablehlo.multiply(inverse_square, series))
    tail = stablehlo.add(stablehlo.add(c(1.0), stablehlo.divide(c(0.5), x)), stablehlo.multiply(inverse_square, series))
    result = stablehlo.add(result, stablehlo.divide(tail, x))
    return stablehlo.select(reflect, stablehlo.negate(result), result)


def hurwitz_zeta(ctx, s, q):
    """sum over k >= 0 of (q + k)^-s: terms added one by one while fewer than 9 or q + k <= 9 (each element
    stops early once a term is below epsilon of the sum), then twelve Euler-Maclaurin correction terms."""
    c = lambda number: scalar(ctx, number, q)  # noqa: E731
    total = stablehlo.power(q, stablehlo.negate(s))

    def running(step, a, b, total, done):
        return stablehlo.and_(stablehlo.not_(done), stablehlo.or_(
            compare(step, full_like(ctx, ctx.out_shape, 9, torch.int32), "LT"), compare(a, c(9.0), "LE")))

    def any_running(step, a, b, total, done):
        return reduce(ctx, running(step, a, b, total, done), range(len(ctx.out_shape)), False, stablehlo.or_)

    def add_term(step, a, b, total, done):
        active = running(step, a, b, total, done)
        a_next = stablehlo.add(a, c(1.0))
        b_next = stablehlo.power(a_next, stablehlo.negate(s))
        total_next = stablehlo.add(total, b_next)
        small = compare(stablehlo.abs(stablehlo.divide(b_next, total_next)), c(_EPSILON), "LT")
        keep = lambda new, old: stablehlo.select(active, new, old)  # noqa: E731
        one = full_like(ctx, ctx.out_shape, 1, torch.int32)
        return [keep(stablehlo.add(step, one), step), keep(a_next, a), keep(b_next, b), keep(total_next, total),
                keep(small, done)]

    zero_steps = full_like(ctx, ctx.out_shape, 0, torch.int32)
    _, a, b, total, done = while_loop([zero_steps, q, c(0.0), total, compare(q, q, "NE")], any_running, add_term)
    w = a
    tail = stablehlo.select(done, total, stablehlo.subtract(stablehlo.add(total, stablehlo.divide(
        stablehlo.multiply(b, w), stablehlo.subtract(s, c(1.0)))), stablehlo.multiply(c(0.5), b)))
    factor, k = c(1.0), 0.0
    for denominator in _EULER_MACLAURIN:
        factor = stablehlo.multiply(factor, stablehlo.add(s, c(k)))
        b = stablehlo.divide(b, w)
        term = stablehlo.divide(stablehlo.multiply(factor, b), c(denominator))
        updated = stablehlo.add(tail, term)
        tail = stablehlo.select(done, tail, updated)
        done = stablehlo.or_(done, compare(stablehlo.abs(stablehlo.divide(term, updated)), c(_EPSILON), "LT"))
        factor = stablehlo.multiply(factor, stablehlo.add(s, c(k + 1)))
        b = stablehlo.divide(b, w)
        k += 2
    return _zeta_domain(ctx, s, q, tail)


def _zeta_domain(ctx, s, q, result):
    """inf at s == 1 and at the poles q = 0, -1, ...; NaN for s < 1 and for q < 0 with a fractional s."""
    c = lambda number: scalar(ctx, number, q)  # noqa: E731
    integer = lambda v: compare(stablehlo.floor(v), v, "EQ")  # noqa: E731
    non_positive_q = compare(q, c(0.0), "LE")
    result = stablehlo.select(stablehlo.and_(non_positive_q, stablehlo.not_(integer(s))), c(float("nan")), result)
    result = stablehlo.select(stablehlo.and_(non_positive_q, integer(q)), c(float("inf")), result)
    result = stablehlo.select(compare(s, c(1.0), "LT"), c(float("nan")), result)
    return stablehlo.select(compare(s, c(1.0), "EQ"), c(float("inf")), result)


@lower(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
@elementwise
def zeta(ctx, s, q):
    return hurwitz_zeta(ctx, s, q)


@lower(aten.special_spherical_bessel_j0.default)
@elementwise
def spherical_bessel_j0(ctx, x):
    """sin(x)/x; near 0 its Taylor series (the quotient loses digits there)."""
    square = stablehlo.multiply(x, x)
    series = scalar(ctx, 1 / 362880, x)
    for coefficient in (-1 / 5040, 1 / 120, -1 / 6, 1.0):
        series = stablehlo.add(stablehlo.multiply(series, square), scalar(ctx, coefficient, x))
    small = compare(stablehlo.abs(x), scalar(ctx, 0.5, x), "LT")
    quotient = stablehlo.divide(stablehlo.sine(x), x)
    infinite = compare(stablehlo.abs(x), scalar(ctx, float("inf"), x), "EQ")
    return stablehlo.select(small, series, stablehlo.select(infinite, scalar(ctx, 0.0, x), quotient))
