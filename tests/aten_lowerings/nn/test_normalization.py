"""Normalization against eager: layer/RMS/batch/group/instance norm, as exported and as core ATen ops."""
import copy

import pytest
import torch
from torch import nn

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FLOATS, assert_matches_eager, randn

aten = torch.ops.aten


def with_random_affine(module, dtype=torch.float32):
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return module.to(dtype)


def batch_stats_tolerance(dtype):
    """torch's CPU batch norm stores its batch statistics in float16/bfloat16, so a last-bit difference
    in the float32 sums (a different summation order) can move a channel's mean or rstd by one step;
    allow two steps of the dtype, relative to max(|value|, 1). Exact dtypes keep the defaults."""
    if dtype == torch.float32:
        return {}
    eps = torch.finfo(dtype).eps
    return dict(atol=2 * eps, rtol=2 * eps)


def assert_core_aten_matches_eager(module, *args):
    """Export, decompose to core ATen, convert; compare outputs and the buffers the step mutated (the
    artifact's state)."""
    eager = copy.deepcopy(module)
    program = torch.export.export(module, args).run_decompositions()
    artifact = export_to_stablehlo(program)
    actual = artifact(*args)
    with torch.no_grad():
        expected = eager(*args)
    torch.testing.assert_close(actual, expected)
    state = artifact.state
    for name, buffer in eager.named_buffers():
        torch.testing.assert_close(state.get(name, artifact.weights[name]), buffer, msg=f"buffer {name}")


# -- layer norm and RMS norm ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, normalized", [((2, 5, 8), (8,)), ((3, 4, 6), (4, 6)), ((8,), (8,))])
def test_layer_norm(shape, normalized, dtype):
    assert_matches_eager(with_random_affine(nn.LayerNorm(normalized), dtype), randn(*shape, dtype=dtype, mean=1, std=3))


def test_layer_norm_without_affine_and_mixed_dtypes():
    assert_matches_eager(nn.LayerNorm(8, elementwise_affine=False), randn(2, 3, 8, mean=1, std=3))
    assert_matches_eager(with_random_affine(nn.LayerNorm(8)), randn(2, 3, 8, dtype=torch.bfloat16, mean=1, std=3))


@pytest.mark.parametrize("dtype", FLOATS)
def test_native_layer_norm_outputs(dtype):
    weight, bias = torch.randn(4, 6).to(dtype), torch.randn(4, 6).to(dtype)
    assert_matches_eager(lambda x: aten.native_layer_norm.default(x, [4, 6], weight, bias, 1e-5),
                         randn(2, 3, 4, 6, dtype=dtype, mean=1, std=3))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm(eps, dtype):
    assert_matches_eager(with_random_affine(nn.RMSNorm(8, eps=eps), dtype), randn(2, 5, 8, dtype=dtype, mean=1, std=3))


def test_rms_norm_without_weight_over_two_dims():
    assert_matches_eager(nn.RMSNorm((3, 8), elementwise_affine=False), randn(2, 3, 8, mean=1, std=3))


# -- batch norm ------------------------------------------------------------------------------

def batch_norm(channels, dims, dtype=torch.float32, **options):
    module = with_random_affine(getattr(nn, f"BatchNorm{dims}d")(channels, **options))
    if module.track_running_stats:
        module.running_mean.normal_()
        module.running_var.uniform_(0.5, 2.0)
    return module.to(dtype)


BATCH_NORM_INPUTS = [(1, (4, 3)), (1, (4, 3, 5)), (2, (2, 3, 4, 5)), (3, (2, 3, 2, 3, 4))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims, shape", BATCH_NORM_INPUTS)
def test_batch_norm_eval(dims, shape, dtype):
    assert_matches_eager(batch_norm(3, dims, dtype), randn(*shape, dtype=dtype, mean=1, std=3))


@pytest.mark.parametrize("dims, shape", BATCH_NORM_INPUTS)
def test_batch_norm_eval_core_aten(dims, shape):
    assert_core_aten_matches_eager(batch_norm(3, dims).eval(), randn(*shape, mean=1, std=3))


@pytest.mark.parametrize("dims, shape", BATCH_NORM_INPUTS)
def test_batch_norm_training_core_aten_updates_running_stats(dims, shape):
    assert_core_aten_matches_eager(batch_norm(3, dims, momentum=0.3).train(), randn(*shape, mean=1, std=3))


def test_batch_norm_training_without_running_stats():
    module = batch_norm(3, 2, track_running_stats=False).train()
    assert_core_aten_matches_eager(module, randn(2, 3, 4, 5, mean=1, std=3))


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_training_as_exported(dtype):
    module = batch_norm(3, 2, dtype).train()
    x = randn(2, 3, 4, 5, dtype=dtype, mean=1, std=3)
    expected = copy.deepcopy(module)(x)
    torch.testing.assert_close(export_to_stablehlo(module, (x,))(x), expected, **batch_stats_tolerance(dtype))


@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm_outputs(training):
    weight, bias, mean, var = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    assert_matches_eager(
        lambda x: aten.native_batch_norm.default(x, weight, bias, mean.clone(), var.clone(), training, 0.1, 1e-5),
        randn(2, 3, 4, mean=1, std=3))


# -- group and instance norm ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("groups, shape", [(1, (2, 6, 4, 4)), (3, (2, 6, 4, 4)), (6, (2, 6, 5)), (2, (3, 4))])
def test_group_norm(groups, shape, dtype):
    assert_matches_eager(with_random_affine(nn.GroupNorm(groups, shape[1]), dtype),
                         randn(*shape, dtype=dtype, mean=1, std=3))


def test_group_norm_core_aten():
    assert_core_aten_matches_eager(with_random_affine(nn.GroupNorm(2, 4)), randn(2, 4, 3, 3, mean=1, std=3))


def test_native_group_norm_outputs():
    assert_matches_eager(lambda x: aten.native_group_norm.default(x, None, None, 2, 6, 20, 3, 1e-5),
                         randn(2, 6, 4, 5, mean=1, std=3))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims, shape", [(1, (2, 3, 7)), (2, (2, 3, 4, 5))])
def test_instance_norm(dims, shape, dtype):
    module = with_random_affine(getattr(nn, f"InstanceNorm{dims}d")(3, affine=True), dtype)
    assert_matches_eager(module, randn(*shape, dtype=dtype, mean=1, std=3), **batch_stats_tolerance(dtype))


def test_instance_norm_with_running_stats_in_eval():
    module = nn.InstanceNorm2d(3, track_running_stats=True)
    module.running_mean.normal_()
    module.running_var.uniform_(0.5, 2.0)
    assert_matches_eager(module, randn(2, 3, 4, 5, mean=1, std=3))


def test_instance_norm_core_aten():
    assert_core_aten_matches_eager(nn.InstanceNorm2d(3), randn(2, 3, 4, 5, mean=1, std=3))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, dim, g_shape", [
    ((4, 3, 5), 0, (4, 1, 1)),
    ((4, 3, 5), 2, (1, 1, 5)),   # wav2vec2's positional convolution: the norm over all but the kernel dim
    ((4, 3, 5), -1, (1,)),       # over every dim
])
def test_weight_norm(shape, dim, g_shape, dtype):
    """aten._weight_norm, lowered (torch.export keeps it: no re-trace)."""
    assert_matches_eager(lambda v, g: aten._weight_norm(v, g, dim), randn(*shape, dtype=dtype),
                         randn(*g_shape, dtype=dtype).abs() + 0.5)
