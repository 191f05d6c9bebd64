"""Backward ops against eager, each called directly as torch's autograd formulas call it: convolution (regular
and transposed, every output_mask), layer/group norm, average/adaptive/max pooling, embedding."""
import itertools

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils import _pytree as pytree

from tests.support import FLOATS, assert_lowers, assert_matches_eager, assert_named_in_locations, make
from torch_stablehlo.tools.opinfo_sweep import sample_inputs

aten = torch.ops.aten

# float16/bfloat16: torch's CPU kernels add these gradients' partial sums in the low-precision dtype one at a
# time, where we add in float32 and round once (closer to a float64 reference). Entries that cancel to near zero
# then differ by a rounding step of the partial sums, far above assert_close's atol of 1e-5: allow about two
# steps at the partial sums' size in these tests (at most about 4).
LOW_PRECISION_SUMS = {torch.float32: {}, torch.float16: dict(atol=8e-3, rtol=1e-3),
                      torch.bfloat16: dict(atol=6e-2, rtol=1.6e-2)}

MASKS = [list(mask) for mask in itertools.product([True, False], repeat=3) if any(mask)]


def _masked(outputs, mask):
    """The outputs ``mask`` asks for (export cannot return the None of a masked-off output, and eager sometimes
    computes one anyway)."""
    return tuple(o for o, wanted in zip(outputs, mask) if wanted)


# -- convolution ------------------------------------------------------------------------------------

# (dims, in_channels, out_channels, kernel, stride, padding, dilation, transposed, output_padding, groups)
CONV_CASES = [
    (1, 3, 4, [3], [1], [0], [1], False, [0], 1),
    (1, 4, 6, [2], [2], [1], [2], False, [0], 2),
    (2, 3, 4, [3, 3], [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    (2, 3, 6, [3, 2], [2, 1], [1, 2], [1, 2], False, [0, 0], 1),
    (2, 4, 6, [3, 3], [2, 2], [0, 0], [1, 1], False, [0, 0], 2),  # stride leaves the last input column unused
    (2, 4, 4, [3, 3], [1, 1], [1, 1], [1, 1], False, [0, 0], 4),  # depthwise
    (3, 2, 4, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1),
    (1, 4, 2, [3], [2], [1], [1], True, [1], 2),
    (2, 3, 4, [3, 3], [2, 2], [0, 0], [1, 1], True, [1, 1], 1),
    (2, 4, 6, [3, 2], [2, 3], [1, 0], [2, 1], True, [0, 2], 2),
    (2, 2, 3, [3, 3], [1, 1], [3, 3], [1, 1], True, [0, 0], 1),  # padding beyond the kernel
    (3, 2, 2, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], True, [0, 0, 0], 1),
]


def _conv_inputs(dims, cin, cout, kernel, stride, padding, dilation, transposed, output_padding, groups,
                 dtype=torch.float32):
    """Inputs in [-1, 1), which keeps the sums small."""
    x = make((2, cin, *[7] * dims), dtype, -1.0, 1.0, seed=1)
    w = make((cin, cout // groups, *kernel) if transposed else (cout, cin // groups, *kernel), dtype, -1.0, 1.0,
             seed=2)
    y = aten.convolution(x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    return make(y.shape, dtype, -1.0, 1.0, seed=3), x, w


def _conv_backward(cout, stride, padding, dilation, transposed, output_padding, groups, mask):
    return lambda g, x, w: _masked(aten.convolution_backward(g, x, w, [cout], stride, padding, dilation, transposed,
                                                             output_padding, groups, mask), mask)


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_backward(case):
    dims, cin, cout, kernel, *options = case
    assert_lowers({aten.convolution_backward.default}, _conv_backward(cout, *options, [True] * 3),
                  *_conv_inputs(*case))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("case", [CONV_CASES[4], CONV_CASES[9]])
def test_convolution_backward_mask(case, mask):
    dims, cin, cout, kernel, *options = case
    assert_lowers({aten.convolution_backward.default}, _conv_backward(cout, *options, mask), *_conv_inputs(*case))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [CONV_CASES[3], CONV_CASES[8]])
def test_convolution_backward_low_precision(case, dtype):
    dims, cin, cout, kernel, *options = case
    assert_lowers({aten.convolution_backward.default}, _conv_backward(cout, *options, [True] * 3),
                  *_conv_inputs(*case, dtype=dtype), **LOW_PRECISION_SUMS[dtype])


# -- layer and group norm ----------------------------------------------------------------------------

LAYER_NORM_CASES = [  # (input shape, normalized_shape, affine)
    ((2, 3, 8), [8], True),
    ((2, 3, 4, 5), [4, 5], True),
    ((4, 6), [6], False),
]


def _norm_parameters(shape, affine, dtype):
    if not affine:
        return None, None
    return make(shape, dtype, low=0.5, high=2.0, seed=4), make(shape, dtype, seed=5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, normalized, affine", LAYER_NORM_CASES)
def test_native_layer_norm_backward(shape, normalized, affine, dtype):
    x, g = make(shape, dtype, seed=1), make(shape, dtype, seed=2)
    weight, bias = _norm_parameters(normalized, affine, dtype)
    _, mean, rstd = aten.native_layer_norm(x, normalized, weight, bias, 1e-5)
    mask = [True, affine, affine]
    function = lambda g, x, mean, rstd, *parameters: _masked(  # noqa: E731
        aten.native_layer_norm_backward(g, x, normalized, mean, rstd, *(parameters or (None, None)), mask), mask)
    assert_lowers({aten.native_layer_norm_backward.default}, function, g, x, mean, rstd,
                  *(() if weight is None else (weight, bias)), **LOW_PRECISION_SUMS[dtype])


@pytest.mark.parametrize("mask", MASKS)
def test_native_layer_norm_backward_mask(mask):
    x, g = make((3, 4, 6), seed=1), make((3, 4, 6), seed=2)
    weight, bias = _norm_parameters([6], True, torch.float32)
    _, mean, rstd = aten.native_layer_norm(x, [6], weight, bias, 1e-5)
    assert_lowers({aten.native_layer_norm_backward.default},
                  lambda *args: _masked(aten.native_layer_norm_backward(*args[:2], [6], *args[2:], mask), mask),
                  g, x, mean, rstd, weight, bias)


GROUP_NORM_CASES = [  # (input shape, groups, affine)
    ((2, 6, 4, 4), 3, True),
    ((3, 4, 5), 2, True),
    ((4, 6), 2, True),
    ((2, 6, 2, 3, 2), 2, False),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, groups, affine", GROUP_NORM_CASES)
def test_native_group_norm_backward(shape, groups, affine, dtype):
    x, g = make(shape, dtype, seed=1), make(shape, dtype, seed=2)
    weight, _ = _norm_parameters([shape[1]], affine, dtype)
    n, c, hxw = shape[0], shape[1], x[0, 0].numel()
    _, mean, rstd = aten.native_group_norm(x, weight, None, n, c, hxw, groups, 1e-5)
    mask = [True, affine, affine]
    function = lambda g, x, mean, rstd, weight=None: _masked(  # noqa: E731
        aten.native_group_norm_backward(g, x, mean, rstd, weight, n, c, hxw, groups, mask), mask)
    assert_lowers({aten.native_group_norm_backward.default}, function, g, x, mean, rstd,
                  *(() if weight is None else (weight,)), **LOW_PRECISION_SUMS[dtype])


@pytest.mark.parametrize("mask", MASKS)
def test_native_group_norm_backward_mask(mask):
    x, g, weight = make((2, 4, 3, 3), seed=1), make((2, 4, 3, 3), seed=2), make([4], seed=3)
    _, mean, rstd = aten.native_group_norm(x, weight, None, 2, 4, 9, 2, 1e-5)
    assert_lowers({aten.native_group_norm_backward.default},
                  lambda *args: _masked(aten.native_group_norm_backward(*args, 2, 4, 9, 2, mask), mask),
                  g, x, mean, rstd, weight)


# -- pooling ------------------------------------------------------------------------------------------

AVG_POOL_CASES = [  # (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    ((2, 3, 6, 6), [2, 2], [], [0, 0], False, True, None),
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], False, True, None),
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], False, False, None),
    ((2, 3, 8, 7), [3, 2], [2, 3], [1, 1], True, True, None),
    ((2, 3, 8, 7), [3, 2], [2, 3], [1, 0], True, False, None),
    ((2, 3, 7, 7), [3, 3], [2, 1], [1, 1], False, True, 4),
    ((3, 8, 8), [3, 3], [3, 3], [1, 1], True, False, None),  # unbatched
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", AVG_POOL_CASES)
def test_avg_pool2d_backward(case, dtype):
    shape, *options = case
    x = make(shape, dtype, seed=1)
    g = make(aten.avg_pool2d(x, *options).shape, dtype, seed=2)
    assert_lowers({aten.avg_pool2d_backward.default}, lambda g, x: aten.avg_pool2d_backward(g, x, *options), g, x,
                  **LOW_PRECISION_SUMS[dtype])


ADAPTIVE_CASES = [  # (input shape, output size)
    ((2, 3, 8, 8), [4, 4]),
    ((2, 3, 7, 9), [3, 4]),
    ((2, 3, 5, 5), [5, 5]),
    ((3, 5, 6), [4, 1]),  # unbatched
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, size", ADAPTIVE_CASES)
def test_adaptive_avg_pool2d_backward(shape, size, dtype):
    x = make(shape, dtype, seed=1)
    g = make(aten._adaptive_avg_pool2d(x, size).shape, dtype, seed=2)
    assert_lowers({aten._adaptive_avg_pool2d_backward.default}, aten._adaptive_avg_pool2d_backward, g, x,
                  **LOW_PRECISION_SUMS[dtype])


MAX_POOL_CASES = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((2, 3, 7, 7), [3, 3], [1, 1], [1, 1], [1, 1], False),  # overlapping windows: gradients add up
    ((2, 3, 8, 7), [3, 2], [2, 1], [0, 1], [2, 1], True),
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((3, 6, 5), [2, 2], [1, 2], [1, 0], [1, 2], False),  # unbatched
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", MAX_POOL_CASES)
def test_max_pool2d_with_indices_backward(case, dtype):
    shape, *options = case
    x = make(shape, dtype, seed=1)
    out, indices = aten.max_pool2d_with_indices(x, *options)
    g = make(out.shape, dtype, seed=2)
    assert_lowers({aten.max_pool2d_with_indices_backward.default},
                  lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, *options, i), g, x, indices,
                  **LOW_PRECISION_SUMS[dtype])


# -- embedding ------------------------------------------------------------------------------------------

EMBEDDING_CASES = [  # (indices shape, num_weights, padding_idx, scale_grad_by_freq)
    ((4, 5), 10, -1, False),
    ((4, 5), 10, 3, False),
    ((20,), 6, -1, True),
    ((3, 7), 8, 2, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, num_weights, padding_idx, scale", EMBEDDING_CASES)
def test_embedding_dense_backward(shape, num_weights, padding_idx, scale, dtype):
    indices = make(shape, torch.int64, low=0, high=num_weights, seed=1)  # with repeats
    g = make((*shape, 4), dtype, seed=2)
    assert_lowers({aten.embedding_dense_backward.default},
                  lambda g, i: aten.embedding_dense_backward(g, i, num_weights, padding_idx, scale), g, indices,
                  **LOW_PRECISION_SUMS[dtype])


# -- OpInfo samples --------------------------------------------------------------------------------------

BACKWARD_OPS = {aten.convolution_backward.default, aten.native_layer_norm_backward.default,
                aten.native_group_norm_backward.default, aten.avg_pool2d_backward.default,
                aten._adaptive_avg_pool2d_backward.default, aten.max_pool2d_with_indices_backward.default,
                aten.embedding_dense_backward.default}

OPINFO_NAMES = ["nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
                "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "nn.functional.layer_norm",
                "native_layer_norm", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
                "nn.functional.max_pool2d", "nn.functional.embedding"]
# left out: the OpInfo "max_pool2d_with_indices_backward", whose vjp is zeros that never read the backward op (the
# export drops such unused ops); nn.functional.max_pool2d's vjp and test_max_pool2d_with_indices_backward run it
OPINFO_SAMPLES = [pytest.param(info, index, id=f"{info.name}-{index}")
                  for info in op_db if info.name in OPINFO_NAMES for index in range(2)]


def _vjp_graph(info, sample):
    """The ATen graph of the op's vector-Jacobian product at ``sample`` (as a traced training step has it), and
    its inputs: the sample's differentiable tensors, then one cotangent per floating-point output."""
    leaves, spec = pytree.tree_flatten(([sample.input, *sample.args], sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]

    def forward(*tensors):
        for position, tensor in zip(positions, tensors):
            leaves[position] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return [o for o in pytree.tree_leaves(info.op(*args, **kwargs))
                if isinstance(o, torch.Tensor) and o.is_floating_point()]

    tensors = [leaves[i].detach() for i in positions]
    cotangents = [make(o.shape, seed=i) for i, o in enumerate(forward(*tensors))]

    def vjp(*inputs):
        _, pullback = torch.func.vjp(forward, *inputs[:len(tensors)])
        return [g for g in pullback(list(inputs[len(tensors):])) if g is not None]

    graph = make_fx(vjp)(*tensors, *cotangents)
    graph.graph.eliminate_dead_code()  # the backward ops checked below are those whose results are used
    return graph, [*tensors, *cotangents]


@pytest.mark.parametrize("info, index", OPINFO_SAMPLES)
def test_opinfo_vjp(info, index):
    sample = list(sample_inputs(info, torch.float32, requires_grad=True))[index]
    graph, inputs = _vjp_graph(info, sample)
    ops = {node.target for node in graph.graph.nodes} & BACKWARD_OPS
    assert ops, "the vjp calls none of the backward ops"
    # 3-d transposed convolutions sum a few hundred products: float32 summation order alone moves results by a
    # few ulps, past rtol's 1.3e-6
    tolerances = dict(atol=1e-4, rtol=1e-5) if info.name == "nn.functional.conv_transpose3d" else {}
    assert_named_in_locations(ops, assert_matches_eager(graph, *inputs, **tolerances).stablehlo_text)
