"""Resampling against eager torch: interpolate (nearest, nearest-exact, linear, bilinear, trilinear, bicubic),
grid_sample (2-d and 3-d), fold/unfold."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FLOATS, FunctionModule, assert_lowers, assert_lowers_with_symbolic_batch, make

aten = torch.ops.aten

SPATIAL = {1: (2, 3, 7), 2: (2, 3, 5, 7), 3: (1, 2, 4, 5, 6)}
SIZES = [  # (n, interpolate options); scale factors are passed on to the op, sizes infer the scales
    (1, dict(scale_factor=2)), (1, dict(size=11)), (1, dict(scale_factor=0.6)),
    (2, dict(scale_factor=2)), (2, dict(scale_factor=(1.5, 0.75))), (2, dict(size=(9, 4))), (2, dict(size=(5, 7))),
    (2, dict(scale_factor=1.7, recompute_scale_factor=True)),
    (3, dict(scale_factor=2)), (3, dict(size=(3, 7, 9))),
]
NEAREST_OPS = {1: aten.upsample_nearest1d.vec, 2: aten.upsample_nearest2d.vec, 3: aten.upsample_nearest3d.vec}
EXACT_OPS = {1: aten._upsample_nearest_exact1d.vec, 2: aten._upsample_nearest_exact2d.vec,
             3: aten._upsample_nearest_exact3d.vec}
LINEAR_OPS = {1: aten.upsample_linear1d.vec, 2: aten.upsample_bilinear2d.vec, 3: aten.upsample_trilinear3d.vec}
LINEAR_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("n, options", SIZES)
def test_nearest(n, options, mode):
    ops = NEAREST_OPS if mode == "nearest" else EXACT_OPS
    assert_lowers([ops[n]], lambda x: F.interpolate(x, mode=mode, **options), make(SPATIAL[n], normal=True))


@pytest.mark.parametrize("dtype", FLOATS[1:] + [torch.uint8])
def test_nearest_dtypes(dtype):
    assert_lowers([aten.upsample_nearest2d.vec], lambda x: F.interpolate(x, scale_factor=(1.5, 2.5)),
                  make(SPATIAL[2], dtype, 0, 100))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("n, options", SIZES)
def test_linear(n, options, align_corners):
    assert_lowers([LINEAR_OPS[n]], lambda x: F.interpolate(x, mode=LINEAR_MODES[n], align_corners=align_corners,
                                                           **options), make(SPATIAL[n], normal=True))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("options", [dict(scale_factor=2), dict(size=(9, 4)), dict(scale_factor=(1.5, 0.6)),
                                     dict(size=(5, 7))])
def test_bicubic(options, align_corners):
    assert_lowers([aten.upsample_bicubic2d.vec], lambda x: F.interpolate(x, mode="bicubic",
                                                                           align_corners=align_corners, **options),
                  make(SPATIAL[2], normal=True))


@pytest.mark.parametrize("dtype", FLOATS[1:])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_weighted_low_precision(mode, dtype):
    assert_lowers([getattr(aten, f"upsample_{mode}2d").vec],
                  lambda x: F.interpolate(x, scale_factor=(1.5, 0.75), mode=mode), make(SPATIAL[2], dtype))


@pytest.mark.parametrize("op, args", [
    (aten.upsample_nearest1d.default, ([11], 1.7)),
    (aten.upsample_nearest2d.default, ([9, 4], None, 0.6)),
    (aten.upsample_nearest3d.default, ([3, 7, 9], 0.8, None, 1.6)),
    (aten._upsample_nearest_exact2d.default, ([9, 4], 1.9, 0.6)),
    (aten.upsample_linear1d.default, ([11], False, 1.7)),
    (aten.upsample_bilinear2d.default, ([9, 4], True, None, None)),
    (aten.upsample_bilinear2d.default, ([9, 4], False, 1.9, 0.6)),
    (aten.upsample_trilinear3d.default, ([3, 7, 9], False, 0.8, 1.5, 1.6)),
    (aten.upsample_bicubic2d.default, ([9, 4], False, 1.9, 0.6)),
])
def test_default_overloads_with_scales(op, args):
    n = len(args[0])
    assert_lowers([op], lambda x: op(x, *args), make(SPATIAL[n], normal=True))


# -- grid_sample -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample(mode, padding_mode, align_corners):
    grid = make((2, 4, 6, 2), low=-1.6, high=1.6, seed=1)  # some points outside [-1, 1]
    assert_lowers([aten.grid_sampler_2d.default],
                  lambda x, g: F.grid_sample(x, g, mode, padding_mode, align_corners), make((2, 3, 5, 7)), grid)


def test_grid_sample_far_outside_reflects_several_times():
    grid = make((1, 3, 8, 2), low=-7.0, high=7.0, seed=1)
    assert_lowers([aten.grid_sampler_2d.default], lambda x, g: F.grid_sample(x, g, padding_mode="reflection",
                                                                              align_corners=False),
                  make((1, 2, 4, 5)), grid)


def test_grid_sample_float64():
    grid = make((2, 4, 6, 2), torch.float64, low=-1.2, high=1.2, seed=1)
    assert_lowers([aten.grid_sampler_2d.default], lambda x, g: F.grid_sample(x, g, align_corners=False),
                  make((2, 3, 5, 7), torch.float64), grid)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    """Trilinear (mode "bilinear" on 5-d input) and nearest sampling of a volume."""
    grid = make((2, 3, 4, 5, 3), low=-1.6, high=1.6, seed=1)  # some points outside [-1, 1]
    assert_lowers([aten.grid_sampler_3d.default],
                  lambda x, g: F.grid_sample(x, g, mode, padding_mode, align_corners), make((2, 3, 4, 5, 6)), grid)


def test_grid_sample_3d_float64():
    grid = make((1, 2, 3, 4, 3), torch.float64, low=-1.2, high=1.2, seed=1)
    assert_lowers([aten.grid_sampler_3d.default], lambda x, g: F.grid_sample(x, g, align_corners=False),
                  make((1, 2, 3, 4, 5), torch.float64), grid)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grid_sample_3d_low_precision_is_as_close_as_eager(dtype):
    """torch's 3-d kernel rounds every step to the input's dtype; ours computes in float32 and rounds once, so
    it is held to the float64 result: no further from it than eager torch is, plus the dtype's tolerance."""
    x, grid = make((1, 2, 3, 4, 5), dtype), make((1, 2, 3, 4, 3), dtype, low=-1.2, high=1.2, seed=1)
    sample = lambda x, g: F.grid_sample(x, g, align_corners=False)  # noqa: E731
    got = export_to_stablehlo(FunctionModule(sample), (x, grid))(x, grid).double()
    exact, eager = sample(x.double(), grid.double()), sample(x, grid).double()
    rtol, atol = torch.testing._comparison.default_tolerances(torch.empty((), dtype=dtype))
    assert ((got - exact).abs() <= (eager - exact).abs() + atol + rtol * exact.abs()).all()


# -- fold / unfold -----------------------------------------------------------------------------------------------

FOLD_OPTIONS = [
    dict(kernel_size=2),
    dict(kernel_size=(2, 3), stride=(2, 1)),
    dict(kernel_size=3, padding=1, stride=2),
    dict(kernel_size=(3, 2), dilation=(2, 1), padding=(2, 0), stride=(1, 2)),
]


@pytest.mark.parametrize("dtype", FLOATS)  # im2col has no integer kernels
@pytest.mark.parametrize("options", FOLD_OPTIONS)
def test_unfold(options, dtype):
    assert_lowers([aten.im2col.default], lambda x: F.unfold(x, **options), make((2, 3, 6, 7), dtype, -10, 10))


def test_unfold_unbatched():
    assert_lowers([aten.im2col.default], lambda x: F.unfold(x, 3, padding=1), make((3, 6, 7)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("options", FOLD_OPTIONS)
def test_fold(options, dtype):
    cols = F.unfold(torch.zeros(2, 3, 6, 7), **options)  # a column tensor of the right shape
    assert_lowers([aten.col2im.default], lambda c: F.fold(c, (6, 7), **options), make(cols.shape, dtype))


def test_fold_unbatched():
    assert_lowers([aten.col2im.default], lambda c: F.fold(c, (5, 6), 3, padding=1), make((3 * 9, 30)))


@pytest.mark.parametrize("function", [
    lambda x: F.interpolate(x, scale_factor=2),
    lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"),
    lambda x: F.unfold(x, 2),
])
def test_symbolic_batch(function):
    assert_lowers_with_symbolic_batch(function, make((4, 3, 5, 6)), reads_size=True)
