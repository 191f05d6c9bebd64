"""Resampling: nearest, nearest-exact, (bi/tri)linear and bicubic upsampling, grid_sampler_2d/3d, im2col/col2im.

Upsampling is separable, as in torch's CPU kernels: each spatial dim, innermost first, is resampled with
static source indices and weights computed here the way those kernels compute them (float32 arithmetic, or
float64 for float64 inputs), gathered with ``take`` and summed in the kernels' order. Symbolic spatial sizes
compute the nearest and linear taps in the module (bicubic and nearest-exact need static ones).
"""
from __future__ import annotations

import itertools
import math
from functools import partial

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import array_constant, constant, full_like
from ..emit.contraction import per_dim
from ..emit.elementwise import compare
from ..emit.slicing import slice_dim, strided_slice, take
from ..mlir_types import DYNAMIC, mlir_shape, tensor_type
from ..promotion import compute_dtype, convert, round_to
from ..registry import lower
from ..shapes import broadcast_in_dim, iota, reshape

aten = torch.ops.aten

_CUBIC_A = -0.75  # torch's bicubic convolution constant


def _static(sizes, what: str) -> list[int]:
    sizes = mlir_shape(sizes)
    if DYNAMIC in sizes:
        raise NotImplementedError(f"{what} with symbolic spatial sizes is not supported yet")
    return sizes


# -- source positions of each output index along one dim ---------------------------------------------------


def _scale(in_size: int, out_size: int, align_corners: bool, scale, real):
    """torch's ``area_pixel_compute_scale``: input pixels per output pixel."""
    if align_corners:
        return real(in_size - 1) / real(out_size - 1) if out_size > 1 else real(0)
    return real(1.0 / scale) if scale is not None and scale > 0 else real(in_size) / real(out_size)


def _source_index(in_size, out_size, align_corners, scale, real, cubic: bool) -> np.ndarray:
    """torch's ``area_pixel_compute_source_index`` for every output index (linear modes clamp at 0)."""
    ratio, dst = _scale(in_size, out_size, align_corners, scale, real), np.arange(out_size).astype(real)
    if align_corners:
        return ratio * dst
    source = ratio * (dst + real(0.5)) - real(0.5)
    return source if cubic else np.maximum(source, real(0))


def _floor_and_fraction(source: np.ndarray, in_size: int, real):
    """torch's ``guard_index_and_lambda``: the floored index (at most ``in_size - 1``) and the fraction past it."""
    index = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
    return index, np.clip(source - index.astype(real), real(0), real(1))


# Each taps function gives, for one dim, the (source indices, weights) of every tap; weights are None for
# the nearest modes, whose one tap is copied.

def _nearest_taps(in_size, out_size, align_corners, scale, real):
    """torch's ``nearest_idx``, special cases included."""
    dst = np.arange(out_size)
    if out_size == in_size:
        return [(dst, None)]
    if out_size == 2 * in_size:
        return [(dst >> 1, None)]
    source = np.floor(dst.astype(np.float32) * _scale(in_size, out_size, False, scale, np.float32))
    return [(np.minimum(source.astype(np.int64), in_size - 1), None)]


def _nearest_exact_taps(in_size, out_size, align_corners, scale, real):
    """torch's ``nearest_exact_idx``: the product is taken in double, then floored as a float."""
    ratio = np.float64(_scale(in_size, out_size, False, scale, np.float32))
    source = np.floor(((np.arange(out_size) + 0.5) * ratio).astype(np.float32))
    return [(np.minimum(source.astype(np.int64), in_size - 1), None)]


def _linear_taps(in_size, out_size, align_corners, scale, real):
    """torch's ``compute_source_index_and_lambda``."""
    if out_size == in_size:
        return [(np.arange(out_size), np.ones(out_size, real)), (np.arange(out_size), np.zeros(out_size, real))]
    index, fraction = _floor_and_fraction(_source_index(in_size, out_size, align_corners, scale, real, False),
                                          in_size, real)
    return [(index, real(1) - fraction), (index + (index < in_size - 1), fraction)]


def _cubic_weights(t: np.ndarray, real) -> list[np.ndarray]:
    """torch's ``get_cubic_upsample_coefficients`` for the fraction ``t``."""
    a, one = real(_CUBIC_A), real(1)
    near = lambda x: ((a + real(2)) * x - (a + real(3))) * x * x + one  # noqa: E731
    far = lambda x: ((a * x - real(5) * a) * x + real(8) * a) * x - real(4) * a  # noqa: E731
    return [far(t + one), near(t), near(one - t), far((one - t) + one)]


def _cubic_taps(in_size, out_size, align_corners, scale, real):
    """torch's bicubic taps: four neighbours clamped into the input."""
    index, fraction = _floor_and_fraction(_source_index(in_size, out_size, align_corners, scale, real, True),
                                          in_size, real)
    weights = _cubic_weights(fraction, real)
    return [(np.clip(index - 1 + j, 0, in_size - 1), weights[j]) for j in range(4)]


# The same taps for a dim of symbolic size, as values (int64 indices, weights in ``real``), computed in the module
# the way the functions above compute them; torch's special cases (out == in, nearest's out == 2 * in) selected.

def _dynamic_scale(ctx, in_size, out_size, align_corners: bool, scale, real: torch.dtype):
    """``_scale`` as a 0-d value of ``real``."""
    size_in, size_out = (convert(ctx.size_value(s), real) for s in (in_size, out_size))
    one = constant(1, real)
    if align_corners:
        ratio = stablehlo.divide(stablehlo.subtract(size_in, one), stablehlo.subtract(size_out, one))
        more_than_one = compare(ctx.size_value(out_size), ctx.size_value(1), "GT")
        return stablehlo.select(more_than_one, ratio, constant(0, real))
    return constant(1.0 / scale, real) if scale is not None and scale > 0 else stablehlo.divide(size_in, size_out)


def _dynamic_nearest_taps(ctx, in_size, out_size, align_corners, scale, real):
    n = [out_size]
    dst = iota(ctx, n, 0)
    ratio = broadcast_in_dim(ctx, _dynamic_scale(ctx, in_size, out_size, False, scale, torch.float32), n, [])
    source = convert(stablehlo.floor(stablehlo.multiply(convert(dst, torch.float32), ratio)), torch.int64)
    size_in, size_out = (broadcast_in_dim(ctx, ctx.size_value(s), n, []) for s in (in_size, out_size))
    index = stablehlo.minimum(source, stablehlo.subtract(size_in, full_like(ctx, n, 1, torch.int64)))
    double = compare(size_out, stablehlo.add(size_in, size_in), "EQ")
    index = stablehlo.select(double, stablehlo.shift_right_arithmetic(dst, full_like(ctx, n, 1, torch.int64)), index)
    return [(stablehlo.select(compare(size_out, size_in, "EQ"), dst, index), None)]


def _dynamic_linear_taps(ctx, in_size, out_size, align_corners, scale, real):
    n = [out_size]
    dst, splat = iota(ctx, n, 0), partial(full_like, ctx, n)
    ratio = broadcast_in_dim(ctx, _dynamic_scale(ctx, in_size, out_size, align_corners, scale, real), n, [])
    if align_corners:
        source = stablehlo.multiply(ratio, convert(dst, real))
    else:
        source = stablehlo.subtract(stablehlo.multiply(ratio, stablehlo.add(convert(dst, real), splat(0.5, real))),
                                    splat(0.5, real))
        source = stablehlo.maximum(source, splat(0, real))
    size_in, size_out = (broadcast_in_dim(ctx, ctx.size_value(s), n, []) for s in (in_size, out_size))
    last = stablehlo.subtract(size_in, splat(1, torch.int64))
    index = stablehlo.minimum(convert(stablehlo.floor(source), torch.int64), last)
    fraction = stablehlo.clamp(splat(0, real), stablehlo.subtract(source, convert(index, real)), splat(1, real))
    upper = stablehlo.add(index, convert(compare(index, last, "LT"), torch.int64))
    same = compare(size_out, size_in, "EQ")  # torch copies the input then
    return [(stablehlo.select(same, dst, index), stablehlo.select(same, splat(1, real), stablehlo.subtract(
                splat(1, real), fraction))),
            (stablehlo.select(same, dst, upper), stablehlo.select(same, splat(0, real), fraction))]


_DYNAMIC_TAPS = {_nearest_taps: _dynamic_nearest_taps, _linear_taps: _dynamic_linear_taps}


# -- upsampling ----------------------------------------------------------------------------------------------


def _named_args(ctx) -> dict:
    """The node's non-tensor arguments by schema name, positional or keyword."""
    names = [argument.name for argument in ctx.node.target._schema.arguments]
    return {**dict(zip(names, ctx.node.args)), **ctx.node.kwargs}


def _upsample(ctx, x, *_args, taps, n: int, rounded_weights: bool = False, **_kwargs):
    """Resample the last ``n`` dims one at a time, innermost first, with ``taps``; weighted taps are summed in
    float32 for float16/bfloat16, as torch does, with weights rounded to the input's dtype if
    ``rounded_weights`` (torch's bicubic kernel stores them so)."""
    args = _named_args(ctx)
    if ctx.node.target._overloadname == "vec":
        scales = args.get("scale_factors") or [None] * n
    else:
        scales = [args.get(name) for name in (["scales"] if n == 1 else ["scales_d", "scales_h", "scales_w"][-n:])]
    sizes = list(ctx.arg_meta(0).shape)
    ins, outs, align_corners = sizes[-n:], list(ctx.out_shape[-n:]), bool(args.get("align_corners"))
    if DYNAMIC in mlir_shape(ins + outs):  # the taps as values computed from the sizes
        if taps not in _DYNAMIC_TAPS:
            raise NotImplementedError(f"{ctx.node.target} with symbolic spatial sizes is not supported yet (the "
                                      "nearest and linear modes are)")
        real = torch.float64 if ctx.out_dtype == torch.float64 else torch.float32
        dim_taps = [_DYNAMIC_TAPS[taps](ctx, ins[i], outs[i], align_corners, scales[i], real) for i in range(n)]
    else:
        real, ins, outs = np.float64 if ctx.out_dtype == torch.float64 else np.float32, mlir_shape(ins), mlir_shape(outs)
        dim_taps = [[(array_constant(index, torch.int64), weight) for index, weight in
                     taps(ins[i], outs[i], align_corners, scales[i], real)] for i in range(n)]
    weighted = dim_taps[0][0][1] is not None
    if weighted and not ctx.out_dtype.is_floating_point:
        raise NotImplementedError("linear and cubic upsampling of integer tensors (torch's uint8 kernel rounds "
                                  "fixed-point weights) is not supported yet")
    dtype = compute_dtype(ctx.out_dtype) if weighted else ctx.out_dtype
    value = convert(x, dtype)
    for i in reversed(range(n)):
        dim = len(sizes) - n + i
        sizes[dim] = outs[i]
        result = None
        for index, weight in dim_taps[i]:
            term = take(ctx, value, dim, index, sizes)
            if weight is not None:
                weight = convert(weight, dtype) if isinstance(weight, ir.Value) else array_constant(weight, dtype)
                weight = round_to(weight, ctx.out_dtype) if rounded_weights else weight
                term = stablehlo.multiply(term, broadcast_in_dim(ctx, weight, sizes, [dim]))
            result = term if result is None else stablehlo.add(result, term)
        value = result
    return convert(value, ctx.out_dtype)


for _n in (1, 2, 3):
    for _name, _taps in ((f"upsample_nearest{_n}d", _nearest_taps),
                         (f"_upsample_nearest_exact{_n}d", _nearest_exact_taps),
                         (("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d")[_n - 1], _linear_taps)):
        lower(getattr(aten, _name).vec, getattr(aten, _name).default)(partial(_upsample, taps=_taps, n=_n))
lower(aten.upsample_bicubic2d.vec, aten.upsample_bicubic2d.default)(
    partial(_upsample, taps=_cubic_taps, n=2, rounded_weights=True))


# -- grid sampling -------------------------------------------------------------------------------------------


def _source_position(splat, coord, size: int, padding_mode: int, align_corners: bool):
    """A grid coordinate in [-1, 1] as a position along a dim of ``size``, as torch's CPU kernel computes it:
    unnormalised, then reflected (padding_mode 2) and clipped (1 and 2) into the input. ``splat(number)`` is a
    number shaped like ``coord``."""
    if align_corners:
        position = stablehlo.multiply(stablehlo.add(coord, splat(1)), splat((size - 1) / 2))
        low, twice_span = 0.0, 2.0 * (size - 1)
    else:
        position = stablehlo.subtract(stablehlo.multiply(stablehlo.add(coord, splat(1)), splat(size / 2)), splat(0.5))
        low, twice_span = -0.5, 2.0 * size
    if padding_mode == 2:
        if twice_span <= 0:
            return splat(0)
        distance = stablehlo.abs(stablehlo.subtract(position, splat(low)))
        flips = stablehlo.floor(stablehlo.divide(distance, splat(twice_span)))  # distance >= 0: floor is trunc
        extra = stablehlo.subtract(distance, stablehlo.multiply(flips, splat(twice_span)))
        position = stablehlo.add(stablehlo.minimum(extra, stablehlo.subtract(splat(twice_span), extra)), splat(low))
    if padding_mode in (1, 2):
        position = stablehlo.clamp(splat(0), position, splat(size - 1))
    return position


def _sampler(ctx, x, points, dtype, spatial: list[int]):
    """``sample(indices)``: the input at int64 positions (one tensor per spatial dim, in the input's order) of
    the ``points`` (N, *out) as (N, C, *out), zero outside; and ``spread``, which broadcasts a points tensor to
    that output shape."""
    batch, channels = ctx.arg_meta(0).shape[:2]
    out_sizes, n = ctx.out_shape, len(spatial)
    flat = reshape(ctx, convert(x, dtype), [batch * channels * math.prod(spatial)])
    channel_count = full_like(ctx, out_sizes, channels, torch.int64)
    planes = stablehlo.add(stablehlo.multiply(iota(ctx, out_sizes, 0), channel_count), iota(ctx, out_sizes, 1))
    plane_starts = stablehlo.multiply(planes, full_like(ctx, out_sizes, math.prod(spatial), torch.int64))
    spread = lambda v: broadcast_in_dim(ctx, v, out_sizes, [0, *range(2, 2 + n)])  # noqa: E731
    i = lambda number: full_like(ctx, points, number, torch.int64)  # noqa: E731

    def sample(indices):
        inside, offset = None, i(0)
        for d, (index, size) in enumerate(zip(indices, spatial)):
            within = stablehlo.and_(compare(index, i(-1), "GT"), compare(index, i(size), "LT"))
            inside = within if inside is None else stablehlo.and_(inside, within)
            clamped = stablehlo.clamp(i(0), index, i(size - 1))
            offset = stablehlo.add(offset, stablehlo.multiply(clamped, i(math.prod(spatial[d + 1:]))))
        index = stablehlo.add(plane_starts, spread(offset))
        return stablehlo.select(spread(inside), take(ctx, flat, 0, index, out_sizes),
                                full_like(ctx, out_sizes, 0, dtype))

    return sample, spread


def _grid_sample(ctx, x, grid, interpolation_mode, padding_mode, align_corners, n: int):
    """Bilinear/trilinear (mode 0) and nearest (mode 1) sampling of the last ``n`` dims with zeros (0), border
    (1) or reflection (2) padding; the grid's last dim holds (x, y[, z]), the input's dims in reverse."""
    if interpolation_mode == 2:
        raise NotImplementedError("bicubic grid sampling is not supported yet")
    spatial = _static(ctx.arg_meta(0).shape[2:], "grid sampling")
    dtype = compute_dtype(ctx.out_dtype)
    points = list(ctx.arg_meta(1).shape[:-1])
    splat = lambda number: full_like(ctx, points, number, dtype)  # noqa: E731
    grid = convert(grid, dtype)
    positions = [_source_position(splat, reshape(ctx, slice_dim(ctx, grid, n + 1, k, k + 1, points + [1]), points),
                                  spatial[n - 1 - k], padding_mode, align_corners) for k in range(n)][::-1]
    sample, spread = _sampler(ctx, x, points, dtype, spatial)
    as_index = partial(convert, dtype=torch.int64)
    if interpolation_mode == 1:
        return convert(sample([as_index(stablehlo.round_nearest_even(v)) for v in positions]), ctx.out_dtype)
    lows = [stablehlo.floor(v) for v in positions]
    highs = [stablehlo.subtract(v, low) for v, low in zip(positions, lows)]  # weights of the upper neighbours
    weights = [(stablehlo.subtract(splat(1), high), high) for high in highs]
    corners = [(as_index(low), stablehlo.add(as_index(low), full_like(ctx, points, 1, torch.int64))) for low in lows]
    result = None
    for upper in itertools.product((0, 1), repeat=n):  # torch's order: the last dim varies fastest
        weight = _product([weights[d][upper[d]] for d in reversed(range(n))])  # torch's order: x * y * z
        term = stablehlo.multiply(sample([corners[d][upper[d]] for d in range(n)]), spread(weight))
        result = term if result is None else stablehlo.add(result, term)
    return convert(result, ctx.out_dtype)


def _product(values):
    result = values[0]
    for value in values[1:]:
        result = stablehlo.multiply(result, value)
    return result


@lower(aten.grid_sampler_2d.default)
def grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(ctx, x, grid, interpolation_mode, padding_mode, align_corners, 2)


@lower(aten.grid_sampler_3d.default)
def grid_sampler_3d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(ctx, x, grid, interpolation_mode, padding_mode, align_corners, 3)


# -- im2col / col2im -----------------------------------------------------------------------------------------


def _patches(spatial, kernel_size, dilation, padding, stride):
    """Per spatial dim (kernel, dilation, padding, stride, patch count), and the kernel taps' offsets."""
    dims = [(k, d, p, s, (size + 2 * p - d * (k - 1) - 1) // s + 1)
            for size, k, d, p, s in zip(spatial, *(per_dim(v, 2) for v in (kernel_size, dilation, padding, stride)))]
    offsets = [(i * dims[0][1], j * dims[1][1]) for i in range(dims[0][0]) for j in range(dims[1][0])]
    return dims, offsets


@lower(aten.im2col.default)
def im2col(ctx, x, kernel_size, dilation, padding, stride):
    """Each kernel tap's strided window of the zero-padded input, the taps stacked after the channel dim."""
    sizes = list(ctx.arg_meta(0).shape)
    lead, spatial = sizes[:-2], _static(sizes[-2:], "im2col")
    dims, offsets = _patches(spatial, kernel_size, dilation, padding, stride)
    pads = [0] * len(lead) + [p for _, _, p, _, _ in dims]
    padded_type = tensor_type(lead + [size + 2 * p for size, (_, _, p, _, _) in zip(spatial, dims)], ctx.out_dtype)
    x = stablehlo.pad(x, constant(0, ctx.out_dtype), pads, pads, [0] * len(sizes), results=[padded_type])
    (_, _, _, sh, oh), (_, _, _, sw, ow) = dims
    windows = [reshape(ctx, strided_slice(ctx, x, [0] * len(lead) + [i, j],
                                          lead + [i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1],
                                          [1] * len(lead) + [sh, sw], lead + [oh, ow]), lead + [1, oh * ow])
               for i, j in offsets]
    return reshape(ctx, stablehlo.concatenate(windows, len(lead)), ctx.out_shape)


@lower(aten.col2im.default)
def col2im(ctx, x, output_size, kernel_size, dilation, padding, stride):
    """Each kernel tap's block placed with ``stablehlo.pad`` (interior padding spaces it by the stride, negative
    edge padding crops the padding away), the taps summed in torch's order."""
    out_sizes = list(ctx.out_shape)
    lead, spatial = out_sizes[:-2], _static(out_sizes[-2:], "col2im")
    dims, offsets = _patches(spatial, kernel_size, dilation, padding, stride)
    (_, _, ph, sh, oh), (_, _, pw, sw, ow) = dims
    blocks = reshape(ctx, x, lead + [len(offsets), oh, ow])
    zero, unpadded = constant(0, ctx.out_dtype), [0] * len(lead)
    result = None
    for tap, (i, j) in enumerate(offsets):
        block = reshape(ctx, slice_dim(ctx, blocks, len(lead), tap, tap + 1, lead + [1, oh, ow]), lead + [oh, ow])
        low = [i - ph, j - pw]
        high = [spatial[0] - low[0] - (oh - 1) * sh - 1, spatial[1] - low[1] - (ow - 1) * sw - 1]
        placed = stablehlo.pad(block, zero, unpadded + low, unpadded + high, unpadded + [sh - 1, sw - 1],
                               results=[ctx.out_type()])
        result = placed if result is None else stablehlo.add(result, placed)
    return result
