"""Random ops on PJRT, checked statistically: shapes, dtypes, ranges, moments within 6 standard errors (a chance
failure is below 1e-8 per check), seeds (different seeds differ, one seed reproduces), dropout and randperm; and
the rng_seed argument through a saved and loaded bundle; dropout variants, rrelu, geometric, multinomial,
attention dropout, and fractional max pooling (random windows, or given samples matching eager)."""
from __future__ import annotations

import math

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from tests.support import FunctionModule, assert_matches_eager, make

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



@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("function", [aten.randperm, lambda n: torch.randperm(n, generator=None)],
                         ids=["op_packet", "generator_none"])
def test_randperm_as_the_core_op_tests_call_it(function, strict):
    """The op called with ``n`` alone (export makes it a constant); ``generator=None`` exports as the
    ``randperm.generator`` overload."""
    program = torch.export.export(FunctionModule(function), (20,), strict=strict)
    assert torch.equal(export_to_stablehlo(program)(20).sort().values, torch.arange(20))


def test_randperm_of_a_symbolic_size():
    """Symbolic sizes draw counter-based bits (``emit.random_bits``): a permutation at every size."""
    program = torch.export.export(FunctionModule(lambda x: torch.randperm(x.shape[0])), (torch.zeros(7),),
                                  dynamic_shapes=(({0: torch.export.Dim("n", min=2, max=50)},),))
    artifact = export_to_stablehlo(program)
    for n in (2, 7, 50):
        assert torch.equal(artifact(torch.zeros(n)).sort().values, torch.arange(n))

def test_saved_bundle_takes_the_seed(tmp_path):
    x = torch.zeros(256)
    artifact = convert(lambda x: torch.randn_like(x) + x, x)
    expected = artifact.manual_seed(3)(x)
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert loaded.signature.takes_rng_seed
    torch.testing.assert_close(loaded.manual_seed(3)(x), expected)
    assert not torch.equal(loaded(x), expected)


# -- dropout variants, rrelu, geometric, multinomial, attention dropout, fractional max pooling ------------------

F = torch.nn.functional


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_feature_dropout_zeroes_whole_channels(p):
    """dropout2d: each (sample, channel) plane is zeroed with probability p, the rest scaled by 1 / (1 - p)."""
    x = make((100, 100, 3, 2), low=1, high=2)
    y = convert(lambda x: F.dropout2d(x, p, training=True), x)(x)
    zeroed = (y == 0).flatten(2)
    assert (zeroed.all(2) | ~zeroed.any(2)).all()  # whole planes
    planes = zeroed.all(2).double().mean().item()
    assert abs(planes - p) < 6 * math.sqrt(p * (1 - p) / 10_000)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))


@pytest.mark.parametrize("feature", [False, True])
def test_alpha_dropout_keeps_mean_and_variance(feature):
    """Alpha dropout of standard normal input keeps mean 0 and variance 1; dropped units all take one value."""
    p = 0.3
    x = make((200, 100, 1), normal=True) if feature else make((N,), normal=True)
    dropout = F.feature_alpha_dropout if feature else F.alpha_dropout
    y = convert(lambda x: dropout(x, p, training=True), x)(x)
    a = 1 / math.sqrt((1.7580993408473766 ** 2 * p + 1) * (1 - p))
    dropped_value = -1.7580993408473766 * a * (1 - p)
    dropped = (y - dropped_value).abs() < 1e-5
    assert abs(dropped.double().mean().item() - p) < 6 * math.sqrt(p * (1 - p) / dropped.numel()) + 0.01
    torch.testing.assert_close(y[~dropped], x[~dropped] * a + 1.7580993408473766 * a * p)
    assert abs(y.mean().item()) < 0.06 and abs(y.var().item() - 1) < 0.1


def test_dropout_variants_in_eval_mode_are_identities():
    x = make((4, 3, 5))
    for dropout in (F.dropout2d, F.alpha_dropout, F.feature_alpha_dropout):
        artifact = convert(lambda x: dropout(x, 0.5, training=False) * 2, x)
        assert not artifact.signature.takes_rng_seed
        torch.testing.assert_close(artifact(x), x * 2)


def test_rrelu_training_slopes():
    """Negative inputs are scaled by a uniform slope in [lower, upper]; the rest pass unchanged."""
    lower, upper = 0.1, 0.3
    x = torch.cat([make((N,), low=-2, high=-1), make((100,), low=1, high=2)])
    y = convert(lambda x: F.rrelu(x, lower, upper, training=True), x)(x)
    slopes = y[:N] / x[:N]
    assert slopes.min() >= lower and slopes.max() <= upper
    width = upper - lower
    assert_moments(slopes, (lower + upper) / 2, width ** 2 / 12, width ** 4 / 80)
    torch.testing.assert_close(y[N:], x[N:])


def test_rrelu_eval_matches_eager():
    assert_matches_eager(lambda x: F.rrelu(x, 0.1, 0.3, training=False), make((4, 5)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_geometric(dtype):
    p = 0.3
    x = torch.zeros(N, dtype=dtype)
    y = convert(lambda x: x.clone().geometric_(p), x)(x)
    assert y.dtype == dtype and y.min() >= 1
    mean, variance = 1 / p, (1 - p) / p ** 2
    assert abs(y.double().mean().item() - mean) < 6 * math.sqrt(variance / N)


def test_multinomial_with_replacement_frequencies():
    weights = torch.tensor([[1.0, 0.0, 3.0, 4.0], [0.0, 5.0, 0.0, 5.0]])
    y = convert(lambda w: torch.multinomial(w, N, replacement=True), weights)(weights)
    assert y.shape == (2, N) and y.dtype == torch.int64
    for row, w in zip(y, weights):
        frequencies = torch.bincount(row, minlength=4).double() / N
        probabilities = (w / w.sum()).double()
        assert (frequencies[probabilities == 0] == 0).all()
        assert ((frequencies - probabilities).abs() <= 6 * (probabilities * (1 - probabilities) / N).sqrt()).all()


def test_multinomial_without_replacement():
    """Distinct categories, zero weights never drawn, the first draw with the weights' probabilities."""
    weights = torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0]).expand(2000, 5).contiguous()
    y = convert(lambda w: torch.multinomial(w, 4), weights)(weights)
    assert y.shape == (2000, 4)
    assert (y.sort(1).values == torch.tensor([0, 1, 3, 4])).all()
    first = torch.bincount(y[:, 0], minlength=5).double() / 2000
    probabilities = torch.tensor([0.1, 0.2, 0.0, 0.3, 0.4], dtype=torch.float64)
    assert ((first - probabilities).abs() <= 6 * (probabilities * (1 - probabilities) / 2000).sqrt()).all()


def test_attention_dropout():
    """With equal scores each output is the mean of the values' kept weights scaled by 1 / (1 - p): values of
    ones give outputs of mean 1 and variance p / ((1 - p) S)."""
    p, source = 0.4, 16
    q, k, v = torch.zeros(8, 4, 50, 8), torch.zeros(8, 4, source, 8), torch.ones(8, 4, source, 8)
    artifact = convert(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p), q, k, v)
    out = artifact(q, k, v)[..., 0]
    assert_moments(out, 1.0, p / ((1 - p) * source), 0.0 + 3 * (p / ((1 - p) * source)) ** 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n, kernel, output_size", [(2, 2, (3, 4)), (2, (3, 2), (1, 5)), (3, 2, (2, 3, 2))])
def test_fractional_max_pool_given_samples(n, kernel, output_size, dtype):
    """Deterministic given ``_random_samples``: values and indices match eager."""
    pool = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d
    x = make((2, 3, 7, 8) if n == 2 else (2, 3, 5, 6, 7), dtype)
    samples = make((2, 3, n), dtype, low=0, high=1, seed=1)
    assert_matches_eager(lambda x, s: pool(x, kernel, output_size=output_size, return_indices=True,
                                           _random_samples=s), x, samples)


def test_fractional_max_pool_unbatched():
    x, samples = make((3, 7, 8)), make((1, 3, 2), low=0, high=1, seed=1)
    assert_matches_eager(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=(3, 4), _random_samples=s),
                         x, samples)


def test_fractional_max_pool_draws_its_windows():
    """Without samples: random windows, but each output is the max of some window of the input."""
    x = make((2, 3, 9, 9))
    values, indices = convert(lambda x: F.fractional_max_pool2d(x, 2, output_size=(4, 4), return_indices=True),
                              x)(x)
    assert values.shape == (2, 3, 4, 4)
    torch.testing.assert_close(values, x.flatten(2).gather(2, indices.flatten(2)).view_as(values))
    windows = F.max_pool2d(x, 2, stride=1)  # every 2x2 window's max
    for plane_values, plane_windows in zip(values.flatten(0, 1), windows.flatten(0, 1)):
        assert set(plane_values.flatten().tolist()) <= set(plane_windows.flatten().tolist())
