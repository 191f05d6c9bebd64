"""Random ops on PJRT, checked statistically: shapes, dtypes, ranges, moments within 6 standard errors (a chance
failure is below 1e-8 per check), seeds (different seeds differ, one seed reproduces), dropout and randperm; and
the rng_seed argument through a saved and loaded bundle."""
from __future__ import annotations

import math

import pytest
import torch

from exporter import export_to_stablehlo, load_artifact
from tests.support import FunctionModule, make

aten = torch.ops.aten
N = 20_000  # samples per check


def convert(function, *args):
    return export_to_stablehlo(FunctionModule(function), args)


def assert_moments(sample: torch.Tensor, mean: float, variance: float, fourth_moment: float):
    """Sample mean and variance within 6 standard errors of the distribution's (float64 estimates)."""
    sample = sample.double().flatten()
    n = sample.numel()
    assert abs(sample.mean().item() - mean) < 6 * math.sqrt(variance / n)
    variance_error = math.sqrt((fourth_moment - variance ** 2) / n)
    assert abs(sample.var().item() - variance) < 6 * variance_error + 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rand_uniform(dtype):
    x = convert(lambda x: torch.rand(N, dtype=dtype) + x, torch.zeros((), dtype=dtype))(torch.zeros((), dtype=dtype))
    assert x.shape == (N,) and x.dtype == dtype
    assert x.min() >= 0 and x.max() < 1
    assert_moments(x, 0.5, 1 / 12, 1 / 80)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_randn_normal(dtype):
    x = convert(lambda x: torch.randn(2, N // 2, dtype=dtype) + x, torch.zeros((), dtype=dtype))(
        torch.zeros((), dtype=dtype))
    assert x.shape == (2, N // 2) and x.dtype == dtype and torch.isfinite(x).all()
    assert_moments(x, 0.0, 1.0, 3.0)


def test_like_and_parameterised():
    """rand_like, randn_like, uniform_(a, b), normal(mean, std), bernoulli(p), randint(low, high)."""
    x = torch.zeros(N)
    outputs = convert(lambda x: (torch.rand_like(x), torch.randn_like(x), x.clone().uniform_(-2, 4),
                                 torch.normal(x + 3, 2.0), torch.bernoulli(x + 0.3),
                                 torch.randint(-3, 5, (N,)), torch.randint_like(x, 7)), x)(x)
    rand_like, randn_like, uniform, normal, bernoulli, randint, randint_like = outputs
    assert_moments(rand_like, 0.5, 1 / 12, 1 / 80)
    assert_moments(randn_like, 0.0, 1.0, 3.0)
    assert uniform.min() >= -2 and uniform.max() < 4
    assert_moments(uniform, 1.0, 3.0, 6 ** 4 / 80)
    assert_moments(normal, 3.0, 4.0, 3 * 16)
    assert set(bernoulli.unique().tolist()) <= {0.0, 1.0}
    assert_moments(bernoulli, 0.3, 0.21, 0.3 * 0.7 * (0.7 ** 3 + 0.3 ** 3))
    assert randint.dtype == torch.int64 and set(randint.unique().tolist()) == set(range(-3, 5))
    assert randint_like.dtype == torch.float32 and set(randint_like.unique().tolist()) == set(map(float, range(7)))


def test_seeds_and_calls():
    """Each call advances the seed; manual_seed reproduces; two random nodes in a program differ."""
    artifact = convert(lambda x: (torch.rand(64) + x, torch.rand(64) + x), torch.zeros(()))
    zero = torch.zeros(())
    first, second = artifact.manual_seed(7)(zero), artifact(zero)
    assert not torch.equal(first[0], first[1])  # two nodes
    assert not torch.equal(first[0], second[0])  # two calls
    torch.testing.assert_close(artifact.manual_seed(7)(zero), first)
    assert not torch.equal(artifact.manual_seed(8)(zero)[0], first[0])


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_training(p):
    x = make((N,), low=1, high=2)
    artifact = convert(lambda x: torch.nn.functional.dropout(x, p, training=True), x)
    y = artifact(x)
    zeroed = (y == 0).double().mean().item()
    assert abs(zeroed - p) < 6 * math.sqrt(p * (1 - p) / N)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))


def test_randperm_is_a_permutation():
    artifact = convert(lambda x: torch.randperm(1000) + x, torch.zeros((), dtype=torch.int64))
    zero = torch.zeros((), dtype=torch.int64)
    first, second = artifact(zero), artifact(zero)
    assert first.dtype == torch.int64
    assert torch.equal(first.sort().values, torch.arange(1000))
    assert not torch.equal(first, second)


def test_saved_bundle_takes_the_seed(tmp_path):
    x = torch.zeros(256)
    artifact = convert(lambda x: torch.randn_like(x) + x, x)
    expected = artifact.manual_seed(3)(x)
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert loaded.signature.takes_rng_seed
    torch.testing.assert_close(loaded.manual_seed(3)(x), expected)
    assert not torch.equal(loaded(x), expected)
