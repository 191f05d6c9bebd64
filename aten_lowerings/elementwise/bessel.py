"""Bessel functions J0, J1, Y0, Y1, K0, K1 (plain and exponentially scaled) and the Airy function Ai.

Everything is computed in float64 and rounded once to the output dtype, in three regimes:

* small arguments: the power series in t = x^2 / 4 of J_n, I_n and of the logarithmic part of Y_n and K_n;
* large arguments of the oscillating functions (J, Y, Ai at negative x): Hankel's asymptotic expansion
  H_nu(z) ~ sqrt(2 / (pi z)) e^{i w} (P + i Q), truncated near its smallest term (~ e^{-2z}) for z >= 12;
* K_nu(x) e^x for x > 2 (and Ai at x > 2, through K_1/3): the trapezoidal rule on the integral
  int_0^inf 2 e^{-s^2} cosh(2 nu asinh(s / sqrt(2x))) / sqrt(2x + s^2) ds, whose integrand is analytic in a
  strip of half-width sqrt(2x) around the real line, so that a step of 1/4 is exact to double precision.

The phase of an oscillating function is reduced in the operand's own dtype (x - pi/4 rounded to float32 for a
float32 x), as torch does, so that large float32 arguments give torch's answer rather than a more exact one.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import stablehlo

from ..emit.elementwise import compare, elementwise, scalar
from ..promotion import convert
from ..registry import lower

aten = torch.ops.aten
_F64 = torch.float64
_EULER = 0.57721566490153286061


class _V:
    """A float64 (or bool) tensor with arithmetic operators; numbers become splats of the output's shape."""

    def __init__(self, ctx, value):
        self.ctx, self.value = ctx, value

    def lift(self, other):
        return other.value if isinstance(other, _V) else scalar(self.ctx, other, self.value)

    def op(self, op, other=None, swap=False):
        if other is None:
            return _V(self.ctx, op(self.value))
        a, b = self.value, self.lift(other)
        return _V(self.ctx, op(b, a) if swap else op(a, b))

    __add__ = __radd__ = lambda self, o: self.op(stablehlo.add, o)
    __mul__ = __rmul__ = lambda self, o: self.op(stablehlo.multiply, o)
    __sub__ = lambda self, o: self.op(stablehlo.subtract, o)
    __rsub__ = lambda self, o: self.op(stablehlo.subtract, o, swap=True)
    __truediv__ = lambda self, o: self.op(stablehlo.divide, o)
    __rtruediv__ = lambda self, o: self.op(stablehlo.divide, o, swap=True)
    __neg__ = lambda self: self.op(stablehlo.negate)
    __lt__ = lambda self, o: self.op(lambda a, b: compare(a, b, "LT"), o)
    __le__ = lambda self, o: self.op(lambda a, b: compare(a, b, "LE"), o)
    __gt__ = lambda self, o: self.op(lambda a, b: compare(a, b, "GT"), o)
    __ge__ = lambda self, o: self.op(lambda a, b: compare(a, b, "GE"), o)
    __and__ = lambda self, o: self.op(stablehlo.and_, o)

    def equals(self, other):
        return self.op(lambda a, b: compare(a, b, "EQ"), other)


def _unary(op):
    return lambda v: v.op(op)


sqrt, log, exp, cos, sin, absolute = (_unary(op) for op in (stablehlo.sqrt, stablehlo.log, stablehlo.exponential,
                                                            stablehlo.cosine, stablehlo.sine, stablehlo.abs))


def where(condition, a, b):
    like = a if isinstance(a, _V) else b
    return _V(condition.ctx, stablehlo.select(condition.value, like.lift(a), like.lift(b)))


def _polynomial(coefficients, t):
    """sum of coefficients[k] t^k (Horner)."""
    result = t * coefficients[-1] + coefficients[-2]
    for coefficient in reversed(coefficients[:-2]):
        result = result * t + coefficient
    return result


# -- power series ------------------------------------------------------------------------------------------

_SERIES_TERMS = 34  # t <= 49 (x <= 14): the last term is below 1e-17


def _series_coefficients(n: int, sign: float):
    """Coefficients in t of A = sum sign^k t^k / (k! (k+n)!) (J_n or I_n over (x/2)^n) and of
    B = sum sign^k t^k (psi(k+1) + psi(k+n+1)) / (k! (k+n)!) (the non-logarithmic part of Y_n and K_n)."""
    psi = lambda m: -_EULER + sum(1.0 / j for j in range(1, m))  # noqa: E731  digamma at a positive integer
    a, b = [], []
    for k in range(_SERIES_TERMS):
        term = sign ** k / (math.factorial(k) * math.factorial(k + n))
        a.append(term)
        b.append(term * (psi(k + 1) + psi(k + n + 1)))
    return a, b


_SERIES = {(n, sign): _series_coefficients(n, sign) for n in (0, 1) for sign in (-1.0, 1.0)}


def _series(x, n: int, sign: float):
    """(x/2)^n A(x^2/4) and (x/2)^n B(x^2/4) (see ``_series_coefficients``)."""
    a, b = _SERIES[(n, sign)]
    t = x * x * 0.25
    if n:
        return _polynomial(a, t) * x * 0.5, _polynomial(b, t) * x * 0.5
    return _polynomial(a, t), _polynomial(b, t)


# -- Hankel's asymptotic expansion ------------------------------------------------------------------------

_HANKEL_TERMS = 30  # a_k / z^k is smallest near k = 2z: for z >= 12 the truncation error is below 1e-10


def _hankel_coefficients(nu: float):
    """P = sum (-1)^k a_2k z^-2k and Q z = sum (-1)^k a_2k+1 z^-2k, as polynomials in z^-2, with
    a_k = prod_{j <= k} (4 nu^2 - (2j - 1)^2) / (k! 8^k)."""
    a = [1.0]
    for k in range(1, _HANKEL_TERMS):
        a.append(a[-1] * (4 * nu * nu - (2 * k - 1) ** 2) / (8 * k))
    sign = lambda k: -1.0 if k % 4 >= 2 else 1.0  # noqa: E731  (-1)^(k // 2)
    return [sign(k) * a[k] for k in range(0, _HANKEL_TERMS, 2)], [sign(k) * a[k] for k in range(1, _HANKEL_TERMS, 2)]


_HANKEL = {nu: _hankel_coefficients(nu) for nu in (0.0, 1.0, 1 / 3)}


def _phase(ctx, x_in, steps):
    """``steps(|x|)`` computed in the operand's own dtype (torch reduces phases there), then as float64."""
    return _V(ctx, convert(steps(absolute(_V(ctx, x_in))).value, _F64))


def _hankel(nu: float, z, phase):
    """sqrt(pi z / 2) (J_nu(z), Y_nu(z)) for large z, given the phase w = z - nu pi / 2 - pi / 4."""
    p_coefficients, q_coefficients = _HANKEL[nu]
    inverse_square = 1.0 / (z * z)
    p, q = _polynomial(p_coefficients, inverse_square), _polynomial(q_coefficients, inverse_square) / z
    c, s = cos(phase), sin(phase)
    return p * c - q * s, p * s + q * c


# -- K_nu(x) e^x by quadrature ------------------------------------------------------------------------------

_STEP, _NODES = 0.25, 26  # nodes s = 0, 1/4, ..., 25/4: e^{-s^2} is below 1e-17 past the last one


def _k_scaled(x, nu: float):
    """K_nu(x) e^x for x >= 2 (the trapezoidal rule on the integral in the module's docstring)."""
    total = None
    for node in range(_NODES):
        s = node * _STEP
        weight = _STEP * 2 * math.exp(-s * s) * (0.5 if node == 0 else 1.0)
        if nu == 0 or node == 0:
            term = weight / sqrt(x * 2.0 + s * s)
        elif nu == 1:  # cosh(2 asinh(w)) = 1 + 2 w^2
            term = (1.0 + s * s / x) * weight / sqrt(x * 2.0 + s * s)
        else:
            w = s / sqrt(x * 2.0)
            power = exp(log(w + sqrt(w * w + 1.0)) * (2 * nu))  # e^{2 nu asinh(w)}
            term = (power + 1.0 / power) * (weight / 2) / sqrt(x * 2.0 + s * s)
        total = term if total is None else total + term
    return total


# -- the functions ----------------------------------------------------------------------------------------

_SPLIT = 14.0  # series below, Hankel's expansion above, for J and Y


def _jy(ctx, x_in, n: int, which: str):
    """J_n(x) (``which`` "j") or Y_n(x) ("y") from the operand ``x_in`` (in its compute dtype)."""
    x = _V(ctx, convert(x_in, _F64))
    magnitude = absolute(x)
    small = magnitude < _SPLIT
    xs = where(small, x, _SPLIT)
    a, b = _series(xs, n, -1.0)
    large = where(small, _SPLIT, magnitude)
    j, y = _hankel(float(n), large, _phase(ctx, x_in, lambda v: v - (2 * n + 1) * math.pi / 4))
    amplitude = sqrt(2.0 / math.pi / large)
    if which == "j":
        j = j * amplitude
        return where(small, a, where(x < 0.0, -j, j) if n else j)
    logarithm = log(xs * 0.5)
    y_small = (logarithm * a - b * 0.5) * (2 / math.pi)
    if n:
        y_small = y_small - 2 / math.pi / xs
    result = where(small, y_small, y * amplitude)
    return _domain(x, result, -math.inf)


def _domain(x, value, at_zero: float):
    """NaN for x < 0 and ``at_zero`` at 0 (Y and K)."""
    return where(x < 0.0, math.nan, where(x.equals(0.0), at_zero, value))


def _k(ctx, x_in, n: int, scaled: bool):
    """K_n(x), or K_n(x) e^x if ``scaled``."""
    x = _V(ctx, convert(x_in, _F64))
    small = x <= 2.0
    xs = where(small, x, 2.0)
    a, b = _series(xs, n, 1.0)
    k_small = log(xs * 0.5) * a - b * 0.5
    k_small = k_small + 1.0 / xs if n else -k_small
    xl = where(small, 2.0, x)
    k_large = _k_scaled(xl, float(n))
    result = where(small, k_small * exp(xs), k_large) if scaled else where(small, k_small, k_large * exp(-xl))
    return _domain(x, result, math.inf)


_AIRY_TERMS = 28  # |x| <= 7: the last term is below 1e-20
_AIRY_LOW, _AIRY_HIGH = -7.0, 2.0  # series between; Hankel's expansion below, the K_1/3 quadrature above
_AI0, _AI1 = 0.355028053887817239260, 0.258819403792806798405  # Ai(0) and -Ai'(0)
_AIRY_F = [1 / math.prod((3 * j - 1) * 3 * j for j in range(1, k + 1)) for k in range(_AIRY_TERMS)]
_AIRY_G = [1 / math.prod(3 * j * (3 * j + 1) for j in range(1, k + 1)) for k in range(_AIRY_TERMS)]


def _airy(ctx, x_in):
    """Ai(x) = Ai(0) f(x) + Ai'(0) g(x), f and g Maclaurin series in x^3; for x > 2 sqrt(x/3) K_1/3(zeta) / pi,
    for x < -7 x^-1/4 / sqrt(pi) (P sin(zeta + pi/4) + Q cos(zeta + pi/4)), zeta = 2/3 |x|^3/2."""
    x = _V(ctx, convert(x_in, _F64))
    middle = (x >= _AIRY_LOW) & (x <= _AIRY_HIGH)
    xm = where(middle, x, 0.0)
    cube = xm * xm * xm
    series = _polynomial(_AIRY_F, cube) * _AI0 - _polynomial(_AIRY_G, cube) * xm * _AI1
    xp = where(x > _AIRY_HIGH, x, _AIRY_HIGH)
    zeta = xp * sqrt(xp) * (2 / 3)
    positive = sqrt(xp / 3.0) * exp(-zeta) * _k_scaled(zeta, 1 / 3) / math.pi
    xn = where(x >= _AIRY_LOW, -_AIRY_LOW, -x)  # NaN goes this way
    zeta = xn * sqrt(xn) * (2 / 3)
    # zeta + pi/4 in torch's steps (inf, so NaN, where zeta overflows the dtype); the 3 behind a barrier keeps
    # XLA from turning the division into an inexact product by 1/3
    three = _V(ctx, stablehlo.optimization_barrier([scalar(ctx, 3.0, x_in)]))
    phase = _phase(ctx, x_in, lambda v: v * 2.0 * sqrt(v) / three + math.pi / 4)
    _, oscillation = _hankel(1 / 3, zeta, phase)
    negative = oscillation / sqrt(sqrt(xn)) / math.sqrt(math.pi)
    return where(x > _AIRY_HIGH, positive, where(middle, series, negative))


for _n, _j, _y in ((0, aten.special_bessel_j0, aten.special_bessel_y0), (1, aten.special_bessel_j1,
                                                                           aten.special_bessel_y1)):
    lower(_j.default)(elementwise(lambda ctx, x, n=_n: _jy(ctx, x, n, "j").value))
    lower(_y.default)(elementwise(lambda ctx, x, n=_n: _jy(ctx, x, n, "y").value))
for _n, _plain, _scaled in ((0, aten.special_modified_bessel_k0, aten.special_scaled_modified_bessel_k0),
                            (1, aten.special_modified_bessel_k1, aten.special_scaled_modified_bessel_k1)):
    lower(_plain.default)(elementwise(lambda ctx, x, n=_n: _k(ctx, x, n, False).value))
    lower(_scaled.default)(elementwise(lambda ctx, x, n=_n: _k(ctx, x, n, True).value))
lower(aten.special_airy_ai.default)(elementwise(lambda ctx, x: _airy(ctx, x).value))
