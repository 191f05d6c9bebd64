"""Convolutions and pooling against eager: every conv overload, transposed conv, max/avg/adaptive pooling."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support import assert_lowers, assert_matches_eager, randn

aten = torch.ops.aten


# -- convolution ------------------------------------------------------------------------

CONV_CASES = [  # (dims, in_channels, out_channels, options)
    (1, 3, 4, dict(kernel_size=3)),
    (1, 4, 6, dict(kernel_size=2, stride=2, padding=1, dilation=2, groups=2, bias=False)),
    (2, 3, 4, dict(kernel_size=3)),
    (2, 3, 6, dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    (2, 4, 4, dict(kernel_size=3, padding=1, groups=4)),  # depthwise
    (2, 3, 4, dict(kernel_size=4, padding="same", dilation=2)),
    (2, 3, 4, dict(kernel_size=3, padding="valid", bias=False)),
    (3, 2, 4, dict(kernel_size=3, stride=2, padding=1)),
    (3, 2, 2, dict(kernel_size=2, padding="same")),
]


@pytest.mark.parametrize("dims, cin, cout, options", CONV_CASES)
def test_conv(dims, cin, cout, options):
    assert_matches_eager(getattr(nn, f"Conv{dims}d")(cin, cout, **options), torch.randn(2, cin, *[7] * dims))


UNREAD_TAIL_CASES = [  # (input size, options, the convolution's padding once the unread tail is dropped)
    (2, dict(kernel_size=3, stride=2, padding=1), "[[1, 0], [1, 0]]"),  # ResNet's last stage: one output row
    (4, dict(kernel_size=3, stride=2), "[[0, 0], [0, 0]]"),             # an input row no window reads
    (11, dict(kernel_size=3, stride=3, padding=1, dilation=2), "[[1, 0], [1, 0]]"),  # padding and an input row
    (7, dict(kernel_size=3, stride=2, padding=1), "[[1, 1], [1, 1]]"),  # every row read: as it was
]


@pytest.mark.parametrize("size, options, padding", UNREAD_TAIL_CASES)
def test_strided_conv_reads_no_trailing_rows(size, options, padding):
    """Trailing rows no window reads are dropped (high padding first, then input rows): the same result, and
    the form IREE compiles (tests/iree)."""
    conv = nn.Conv2d(3, 4, **options)
    artifact = assert_matches_eager(conv, torch.randn(2, 3, size, size))
    (line,) = [line for line in artifact.stablehlo_text.splitlines() if "stablehlo.convolution" in line]
    assert f"pad = {padding}" in line


def test_strided_conv_reads_no_trailing_rows_under_a_symbolic_batch():
    conv = nn.Conv2d(3, 4, kernel_size=3, stride=3, padding=1, dilation=2)
    assert_matches_eager(conv, torch.randn(2, 3, 11, 11), dynamic_shapes=({0: torch.export.Dim("batch", max=8)},))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv_low_precision(dtype):
    conv = nn.Conv2d(3, 4, 3, padding=1).to(dtype)
    assert_matches_eager(conv, randn(2, 3, 6, 6, dtype=dtype))


def test_conv_unbatched():
    assert_matches_eager(nn.Conv2d(3, 4, 3), torch.randn(3, 6, 6))


@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_core_op(transposed):
    out_channels = 2 if transposed else 4
    weight = torch.randn(3, out_channels, 3, 3) if transposed else torch.randn(out_channels, 3, 3, 3)
    out_padding = [1, 0] if transposed else [0, 0]
    assert_matches_eager(
        lambda x, w, b: aten.convolution.default(x, w, b, [2, 1], [1, 1], [1, 1], transposed, out_padding, 1),
        torch.randn(2, 3, 6, 6), weight, torch.randn(out_channels))


CONV_TRANSPOSE_CASES = [
    (1, 3, 4, dict(kernel_size=3)),
    (1, 4, 2, dict(kernel_size=3, stride=2, padding=1, output_padding=1, groups=2)),
    (2, 3, 4, dict(kernel_size=3, stride=2, output_padding=1)),
    (2, 4, 6, dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 0), dilation=(2, 1), groups=2, bias=False)),
    (2, 2, 3, dict(kernel_size=3, padding=3)),  # padding beyond the kernel: negative conv padding
    (2, 4, 4, dict(kernel_size=3, stride=2, padding=1, groups=4)),  # depthwise
    (3, 2, 2, dict(kernel_size=2, stride=2)),
]


@pytest.mark.parametrize("dims, cin, cout, options", CONV_TRANSPOSE_CASES)
def test_conv_transpose(dims, cin, cout, options):
    module = getattr(nn, f"ConvTranspose{dims}d")(cin, cout, **options)
    assert_matches_eager(module, torch.randn(2, cin, *[6] * dims))


# -- max pooling ------------------------------------------------------------------------------

MAX_POOL_CASES = [  # (dims, options)
    (1, dict(kernel_size=2)),
    (1, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, dict(kernel_size=2)),
    (2, dict(kernel_size=3, stride=2, padding=1)),
    (2, dict(kernel_size=(3, 2), stride=(2, 2), dilation=(2, 1), ceil_mode=True)),
    (2, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (3, dict(kernel_size=2, stride=1, padding=1)),
]


def pool_input(dims, size=7, dtype=torch.float32):
    return randn(2, 3, *[size] * dims, dtype=dtype)


@pytest.mark.parametrize("dims, options", MAX_POOL_CASES)
def test_max_pool(dims, options):
    assert_matches_eager(getattr(nn, f"MaxPool{dims}d")(**options), pool_input(dims))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_max_pool_low_precision(dtype):
    assert_matches_eager(nn.MaxPool2d(3, 2, 1), pool_input(2, dtype=dtype))


def test_max_pool_propagates_nan_and_handles_unbatched():
    x = torch.randn(3, 6, 6)
    x[0, 1, 1] = float("nan")
    assert_matches_eager(nn.MaxPool2d(2), x)


@pytest.mark.parametrize("dims, options", MAX_POOL_CASES)
def test_max_pool_with_indices(dims, options):
    x = torch.randint(0, 4, (2, 3, *[7] * dims)).float()  # many ties: the first maximum's index wins
    assert_matches_eager(getattr(nn, f"MaxPool{dims}d")(return_indices=True, **options), x)


def test_max_pool_with_indices_nan_and_all_negative_infinity():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, :2, :2] = float("-inf")
    assert_matches_eager(lambda t: F.max_pool2d(t, 2, return_indices=True), x)


# -- average pooling --------------------------------------------------------------------------

AVG_POOL_CASES = [  # (dims, options)
    (1, dict(kernel_size=2)),
    (1, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    (1, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, dict(kernel_size=2)),
    (2, dict(kernel_size=3, stride=2, padding=1)),
    (2, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    (2, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (2, dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), divisor_override=5)),
    (3, dict(kernel_size=2, stride=2, padding=1, ceil_mode=True)),
]


@pytest.mark.parametrize("dims, options", AVG_POOL_CASES)
def test_avg_pool(dims, options):
    assert_matches_eager(getattr(nn, f"AvgPool{dims}d")(**options), pool_input(dims))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_avg_pool_low_precision(dtype):
    assert_matches_eager(nn.AvgPool2d(3, 2, 1, count_include_pad=False), pool_input(2, dtype=dtype))


ADAPTIVE_CASES = [  # (dims, input size, output size)
    (1, 8, 4),
    (1, 7, 3),
    (2, 8, 1),        # global pooling
    (2, 8, (2, 4)),
    (2, 7, (3, 5)),   # uneven, overlapping bins
    (2, 5, 7),        # output larger than input
    (3, 6, (2, 3, 4)),
]


@pytest.mark.parametrize("dims, size, out", ADAPTIVE_CASES)
def test_adaptive_avg_pool(dims, size, out):
    assert_matches_eager(getattr(nn, f"AdaptiveAvgPool{dims}d")(out), pool_input(dims, size))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out", [2, 3])
def test_adaptive_avg_pool_low_precision(out, dtype):
    assert_matches_eager(nn.AdaptiveAvgPool2d(out), pool_input(2, 8, dtype=dtype))


def test_adaptive_avg_pool_core_op():
    assert_matches_eager(lambda x: aten._adaptive_avg_pool2d.default(x, [3, 2]), pool_input(2, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("output_size", [(2, 3), (3, 5), 4])
def test_adaptive_max_pool2d_with_indices(output_size, dtype):
    pool = lambda x: F.adaptive_max_pool2d(x, output_size, return_indices=True)
    assert_lowers({aten.adaptive_max_pool2d.default}, pool, randn(2, 3, 8, 10, dtype=dtype))


def test_adaptive_max_pool1d_and_3d():
    assert_matches_eager(lambda x: F.adaptive_max_pool1d(x, 3, return_indices=True), randn(2, 3, 7))
    assert_lowers({aten.adaptive_max_pool3d.default}, lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), True),
                  randn(1, 2, 5, 7, 4))
