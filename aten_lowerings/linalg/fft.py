"""Discrete Fourier transforms (_fft_r2c, _fft_c2r, _fft_c2c), complex numbers (complex, polar,
view_as_real, view_as_complex, conj).

``stablehlo.fft`` transforms the trailing dims, so the transformed dims are
moved to the end (in torch's order: the last is the one halved by the real
transforms), transformed, and moved back. XLA's inverse transforms divide by
n; torch's ``normalization`` (0: none, 1: 1/sqrt(n), 2: 1/n) is applied on top
of an unnormalized transform.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.slicing import slice_dim
from ..mlir_types import tensor_type
from ..promotion import convert
from ..registry import lower
from ..shapes import broadcast_to, normalize_dim, reshape
from ..values import dtype_of, rank

aten = torch.ops.aten

_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _transform(ctx, x, dims, kind: str, lengths_of, normalization: int, inverse: bool):
    """``kind`` (FFT, IFFT, RFFT, IRFFT) over ``dims`` of ``x``; ``lengths_of(in_sizes, out_sizes)`` gives the
    transform lengths of the moved dims. Returns the node's output."""
    dims = [normalize_dim(d, rank(x)) for d in dims]
    if len(dims) > 3:
        raise NotImplementedError("stablehlo.fft transforms at most 3 dims at once")
    order = [d for d in range(rank(x)) if d not in dims] + dims
    out_sizes = [ctx.out_shape[d] for d in order]
    in_sizes = [ctx.arg_meta(0).shape[d] for d in order]
    if not all(isinstance(s, int) for s in in_sizes[-len(dims):] + out_sizes[-len(dims):]):
        raise NotImplementedError("FFT over symbolic sizes (the other dims may be symbolic)")
    lengths = lengths_of(in_sizes[-len(dims):], out_sizes[-len(dims):])
    moved = stablehlo.transpose(x, order)
    result = stablehlo.fft(moved, stablehlo.FftTypeAttr.get(kind), lengths,
                           results=[tensor_type(out_sizes, ctx.out_dtype)])
    result = _normalized(ctx, result, out_sizes, math.prod(lengths), normalization, inverse)
    return stablehlo.transpose(result, [order.index(d) for d in range(rank(x))])


def _normalized(ctx, value, sizes, n: int, normalization: int, inverse: bool):
    """Scale an XLA transform's result to torch's ``normalization`` (XLA's inverses have divided by n)."""
    factor = [1.0, 1 / math.sqrt(n), 1 / n][normalization] * (n if inverse else 1)
    if factor == 1:
        return value
    dtype = dtype_of(value)
    scale = full_like(ctx, sizes, factor, _PARTS.get(dtype, dtype))
    if dtype in _PARTS:
        scale = stablehlo.complex(scale, full_like(ctx, sizes, 0, _PARTS[dtype]))
    return stablehlo.multiply(value, scale)


@lower(aten._fft_r2c.default)
def fft_r2c(ctx, x, dim, normalization, onesided):
    """Real to complex; without ``onesided`` the full (Hermitian) spectrum, as a complex FFT."""
    if onesided:
        return _transform(ctx, x, dim, "RFFT", lambda ins, outs: ins, normalization, False)
    as_complex = stablehlo.complex(x, full_like(ctx, ctx.arg_meta(0).shape, 0, dtype_of(x)))
    return _transform(ctx, as_complex, dim, "FFT", lambda ins, outs: ins, normalization, False)


@lower(aten._fft_c2r.default)
def fft_c2r(ctx, x, dim, normalization, last_dim_size):
    """Complex (one-sided spectrum) to real of ``last_dim_size`` along the last of ``dim``."""
    return _transform(ctx, x, dim, "IRFFT", lambda ins, outs: outs, normalization, True)


@lower(aten._fft_c2c.default)
def fft_c2c(ctx, x, dim, normalization, forward):
    kind = "FFT" if forward else "IFFT"
    return _transform(ctx, x, dim, kind, lambda ins, outs: ins, normalization, not forward)


@lower(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(ctx, x):
    """(..., ) complex -> (..., 2) real: the real and imaginary parts stacked last."""
    sizes = [*ctx.arg_meta(0).shape, 1]
    parts = [reshape(ctx, part(x), sizes) for part in (stablehlo.real, stablehlo.imag)]
    return stablehlo.concatenate(parts, rank(x))


def _parts_dtype(ctx) -> torch.dtype:
    """The dtype of the parts of the node's complex output as carried: float32 for complex32 (mlir_types)."""
    return torch.float64 if ctx.out_dtype == torch.complex128 else torch.float32


@lower(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(ctx, x):
    """(..., 2) real -> (..., ) complex."""
    sizes = [*ctx.out_shape, 1]
    parts = [convert(slice_dim(ctx, x, rank(x) - 1, i, i + 1, sizes), _parts_dtype(ctx)) for i in (0, 1)]
    return stablehlo.complex(*(reshape(ctx, part, ctx.out_shape) for part in parts))


@lower(aten.complex.default)
def complex_(ctx, real, imag):
    """torch.complex(real, imag): operands broadcast to the result's shape."""
    return stablehlo.complex(*(broadcast_to(ctx, convert(part, _parts_dtype(ctx)), ctx.out_shape)
                               for part in (real, imag)))


@lower(aten.polar.default)
def polar(ctx, magnitude, angle):
    """torch.polar(abs, angle): abs * cos(angle) + i abs * sin(angle), operands broadcast to the result's shape."""
    magnitude, angle = (broadcast_to(ctx, convert(v, _parts_dtype(ctx)), ctx.out_shape) for v in (magnitude, angle))
    return convert(stablehlo.complex(stablehlo.multiply(magnitude, stablehlo.cosine(angle)),
                                     stablehlo.multiply(magnitude, stablehlo.sine(angle))), ctx.out_dtype)


@lower(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default, aten._conj_copy.default)
def conj(ctx, x):
    """The complex conjugate (export's ``_conj`` view is a copy here); real tensors are their own."""
    if dtype_of(x) not in _PARTS:
        return x
    return stablehlo.complex(stablehlo.real(x), stablehlo.negate(stablehlo.imag(x)))
