"""Activation lowerings against eager torch, as functions and as the nn modules real models use."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import (FLOATS, assert_lowers, assert_lowers_with_symbolic_batch, assert_matches_eager,
                           assert_table_lowers, export_with_symbolic_batch, make)

aten = torch.ops.aten

ACTIVATIONS = {
    "relu": (aten.relu.default, F.relu),
    "relu6": (aten.relu6.default, F.relu6),
    "hardtanh": (aten.hardtanh.default, F.hardtanh),
    "hardtanh_bounds": (aten.hardtanh.default, lambda x: F.hardtanh(x, -0.5, 2.0)),
    "gelu": (aten.gelu.default, F.gelu),
    "gelu_tanh": (aten.gelu.default, lambda x: F.gelu(x, approximate="tanh")),
    "silu": (aten.silu.default, F.silu),
    "leaky_relu": (aten.leaky_relu.default, F.leaky_relu),
    "leaky_relu_slope": (aten.leaky_relu.default, lambda x: F.leaky_relu(x, 0.2)),
    "elu": (aten.elu.default, F.elu),
    "elu_alpha": (aten.elu.default, lambda x: F.elu(x, alpha=0.5)),
    "celu": (aten.celu.default, lambda x: F.celu(x, alpha=2.0)),
    "selu": (aten.selu.default, F.selu),
    "softplus": (aten.softplus.default, F.softplus),
    "softplus_beta": (aten.softplus.default, lambda x: F.softplus(x, beta=2.0, threshold=4.0)),
    "hardswish": (aten.hardswish.default, F.hardswish),
    "hardsigmoid": (aten.hardsigmoid.default, F.hardsigmoid),
    "mish": (aten.mish.default, F.mish),
    "logsigmoid": (aten.log_sigmoid.default, F.logsigmoid),
    "threshold": (aten.threshold.default, lambda x: F.threshold(x, 0.5, -2.0)),
    "glu": (aten.glu.default, F.glu),
    "glu_dim0": (aten.glu.default, lambda x: F.glu(x, 0)),
}


@pytest.mark.parametrize("dtype, shape", [(dtype, (2, 3, 8)) for dtype in FLOATS] + [(torch.float32, (4, 6))],
                         ids=str)
def test_activations(dtype, shape):
    """Inputs span [-6, 6): both sides of every kink (hardswish's +-3, relu6's 6, softplus_beta's threshold)."""
    assert_table_lowers(ACTIVATIONS, make(shape, dtype, -6, 6))


def test_extreme_inputs_stay_finite():
    """Large |x| must not overflow through exp: softplus/mish go linear, logsigmoid stays stable."""
    x = torch.tensor([-200.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0, 200.0])
    names = ["softplus", "softplus_beta", "mish", "logsigmoid", "silu", "gelu", "gelu_tanh", "elu", "selu"]
    assert_table_lowers({name: ACTIVATIONS[name] for name in names}, x)


def test_nan_passes_through_relu_family():
    x = torch.tensor([math.nan, -1.0, 0.5, 7.0])
    assert_table_lowers({name: ACTIVATIONS[name] for name in ["relu", "relu6", "hardtanh"]}, x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_relu_and_hardtanh(dtype):
    ops = {"relu": ACTIVATIONS["relu"], "hardtanh": (aten.hardtanh.default, lambda x: F.hardtanh(x, -2, 3))}
    assert_table_lowers(ops, make((3, 4), dtype, -5, 5))


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_prelu(dtype, channels):
    model = nn.PReLU(channels).to(dtype)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-0.5, 0.5, channels))
    assert_lowers({aten.prelu.default}, model, make((2, 4, 3), dtype))


def test_prelu_kernel():
    assert_lowers({aten._prelu_kernel.default}, lambda x, w: aten._prelu_kernel(x, w),
                  make((2, 4, 3), torch.float32), make((4, 1), torch.float32, -1, 1, seed=3))


class InplaceActivations(nn.Module):
    def __init__(self):
        super().__init__()
        self.activations = nn.Sequential(
            nn.ReLU(inplace=True), nn.SiLU(inplace=True), nn.Hardswish(inplace=True),
            nn.LeakyReLU(0.1, inplace=True), nn.ELU(inplace=True), nn.ReLU6(inplace=True), nn.GELU(),
            nn.Hardtanh(inplace=True), nn.Mish(inplace=True))

    def forward(self, x):
        return self.activations(x * 3 - 1)


def test_modules_with_inplace_activations():
    """``inplace=True`` modules export in-place overloads (relu_, ...), which the exporter functionalises."""
    assert_matches_eager(InplaceActivations(), make((3, 8), torch.float32))


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "hardswish", "softplus_beta", "elu", "logsigmoid"])
def test_symbolic_batch_lowers_to_dynamic_ops(name):
    function = ACTIVATIONS[name][1]
    assert_lowers_with_symbolic_batch(function, make((4, 6), torch.float32))


def test_glu_of_a_symbolic_batch_runs_at_several_batch_sizes():
    artifact = export_to_stablehlo(export_with_symbolic_batch(F.glu, make((4, 6), torch.float32), max_batch=None))
    for batch in (3, 4, 9):
        x = make((batch, 6), torch.float32, seed=batch)
        torch.testing.assert_close(artifact(x), F.glu(x))
