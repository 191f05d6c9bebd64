"""Random ops of symbolic size (a dynamic dim, a data-dependent size held padded): counter-based bits
(``emit.random_bits``) whose draws are checked statistically (moments within 6 standard errors), by shape at
several sizes, and by what a seed reproduces; multinomial with dynamic weights and sample counts (PyTorch's
``test_multinomial_dynamic``) and randn of a bounded ``.item()`` size (``test_export_with_inline_constraints``)."""
import math

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.tools import conformance


class DynamicNoise(torch.nn.Module):
    def forward(self, x):
        return torch.randn(x.shape[0], 3) + x[:, None] * 0, torch.rand_like(x)


@pytest.mark.full_sweep_only  # make test samples this with test_random's randperm of a symbolic size
def test_random_tensors_of_a_dynamic_size():
    artifact = export_to_stablehlo(torch.export.export(DynamicNoise(), (torch.zeros(5),),
                                                       dynamic_shapes={"x": (Dim("n"),)}))
    for n in (1, 7):
        normal, uniform = artifact(torch.zeros(n))
        assert normal.shape == (n, 3) and uniform.shape == (n,)
    n = 4000
    normal, uniform = artifact.manual_seed(3)(torch.zeros(n))
    assert abs(normal.double().mean().item()) < 6 / math.sqrt(3 * n)
    assert abs(normal.double().var().item() - 1) < 6 * math.sqrt(2 / (3 * n))
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.double().mean().item() - 0.5) < 6 * math.sqrt(
        1 / 12 / n)
    assert len(normal.unique()) == 3 * n  # the streams of the elements do not repeat
    torch.testing.assert_close(artifact.manual_seed(3)(torch.zeros(n)), (normal, uniform))
    assert not torch.equal(artifact.manual_seed(4)(torch.zeros(n))[1], uniform)


class Multinomial(torch.nn.Module):
    def forward(self, x, y):
        return torch.multinomial(x, y.shape[0])


@pytest.mark.full_sweep_only  # make test samples this with test_random's randperm of a symbolic size
def test_multinomial_of_dynamic_sizes():
    weights = torch.tensor([[0.0, 10, 3, 0], [1, 0, 0, 2]])
    ep = torch.export.export(Multinomial(), (weights, torch.ones(2)),
                             dynamic_shapes=((Dim.DYNAMIC, Dim.DYNAMIC), (Dim.DYNAMIC,)))
    conformance.check(ep, [((weights, torch.ones(2)), {})], twice=False)  # shapes and dtypes: it draws
    samples = export_to_stablehlo(ep)(weights, torch.ones(2))
    assert samples[0].sort().values.tolist() == [1, 2] and samples[1].sort().values.tolist() == [0, 3]
    wide = torch.rand(3, 9) + 0.1
    drawn = export_to_stablehlo(ep)(wide, torch.ones(9))  # without replacement: every category once
    assert torch.equal(drawn.sort(dim=1).values, torch.arange(9).expand(3, 9))


class NoiseOfItemSize(torch.nn.Module):
    def forward(self, x):
        a = x.item()
        torch._check(a >= 4)
        torch._check(a <= 7)
        return torch.cat((torch.randn((a, 4)).transpose(0, 1), torch.zeros(6, a)), 0)


@pytest.mark.full_sweep_only  # make test samples this with test_random's randperm of a symbolic size
def test_random_tensor_of_a_bounded_item_size():
    ep = torch.export.export(NoiseOfItemSize(), (torch.tensor([6]),))
    artifact = conformance.convert_read_only(ep, twice=False)
    for a in (4, 7):
        out = artifact(torch.tensor([a]))
        assert out.shape == (10, a) and torch.equal(out[4:], torch.zeros(6, a)) and len(out[:4].unique()) == 4 * a
