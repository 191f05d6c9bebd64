"""Sizes read from tensor data (``.item()``) that torch knows a bound for (``torch._check``) are held padded to
the bound with their true size beside them, as ``nonzero``'s are: constructors and views of such a size, returned
at their true size. Without a bound the error names the symbol and says how to bound it."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.errors import DimensionError, LoweringError
from torch_stablehlo import load_artifact
from torch_stablehlo.tools import conformance


class Bounded(torch.nn.Module):
    """ExportDB's constrain_as_size_example, and an expand and a view of the size."""

    def forward(self, x, y):
        a = x.item()
        torch._check(a >= 0)
        torch._check(a <= 5)
        return torch.zeros((a, 5)), torch.full((2, a), 3.0) + y.sum(), torch.ones(a).expand(3, a), torch.arange(a * 4).view(a, 4)


class Unbounded(torch.nn.Module):
    def forward(self, x):
        a = x.item()
        torch._check(a >= 0)
        return torch.zeros(a)


def test_bounded_item_sizes_are_padded_with_their_true_size():
    ep = torch.export.export(Bounded(), (torch.tensor(4), torch.ones(2)))
    artifact = export_to_stablehlo(ep)
    for value in (4, 0, 5, 2):
        inputs = (torch.tensor(value), torch.arange(2.0))
        torch.testing.assert_close(artifact(*inputs), ep.module()(*inputs))
    with pytest.raises(DimensionError, match=r"data-dependent size u\d+ = 7 along dim 0, outside \[0, 5\]"):
        artifact(torch.tensor(7), torch.arange(2.0))  # eager's check fails too


class AtLeastFour(torch.nn.Module):
    """torch's test_export_constraints_error: a lower bound the size must keep."""

    def forward(self, x):
        n = x.item()
        torch._check(n >= 4)
        torch._check(n <= 5)
        return torch.full((n, 1), 1)


def test_a_size_below_its_checked_range_is_refused_as_eager_refuses_it():
    ep = torch.export.export(AtLeastFour(), (torch.tensor([5]),))
    artifact = export_to_stablehlo(ep)
    torch.testing.assert_close(artifact(torch.tensor([4])), ep.module()(torch.tensor([4])))
    with pytest.raises(RuntimeError, match=r"u\d+ >= 4"):
        ep.module()(torch.tensor([3]))
    with pytest.raises(DimensionError, match=r"data-dependent size u\d+ = 3 along dim 0, outside \[4, 5\]"):
        artifact(torch.tensor([3]))


class UnboundedNoise(torch.nn.Module):
    def forward(self, x):
        return torch.randn(x.item())


def test_unbounded_item_sizes_are_given_by_the_call(tmp_path):
    """No padded size can hold them: @main takes each as an argument's size and returns the value it computes;
    the artifact runs it until they agree, loaded from its bundle too. What only the artifact's call can do is
    refused elsewhere, naming the size."""
    ep = torch.export.export(Unbounded(), (torch.tensor(4),))
    artifact = export_to_stablehlo(ep)
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert loaded.signature.call_sizes == artifact.signature.call_sizes
    for value in (4, 0, 9):
        expected = ep.module()(torch.tensor(value))
        torch.testing.assert_close(artifact(torch.tensor(value)), expected)
        torch.testing.assert_close(loaded(torch.tensor(value)), expected)
    with pytest.raises(NotImplementedError, match=r"cannot hand to JAX a program whose call gives sizes read from "
                                                  r"tensor data \(u\d+: with no bound"):
        artifact.to_jax()
    with pytest.raises(NotImplementedError, match=r"the sizes u\d+ are read from tensor data .* draws random"):
        export_to_stablehlo(torch.export.export(UnboundedNoise(), (torch.tensor(4),)))


class KthOfItem(torch.nn.Module):
    def forward(self, x, y):
        return x.kthvalue(min(y.item(), 128), dim=0, keepdim=True).values


def test_kthvalue_of_a_data_dependent_k():
    ep = torch.export.export(KthOfItem(), (torch.arange(64), torch.tensor([32])))
    conformance.check(ep, [((torch.randperm(64), torch.tensor([k])), {}) for k in (32, 5, 64)], twice=False)


class MaskedRows(torch.nn.Module):
    def forward(self, x, mask):
        return x[mask] * 2, x[x > 0].shape[0]


def test_boolean_mask_indexing_is_padded_with_its_true_size():
    ep = torch.export.export(MaskedRows(), (torch.randn(4, 3, 2), torch.rand(4, 3) > 0.5))
    conformance.check(ep, [((torch.randn(4, 3, 2), torch.rand(4, 3) > p), {}) for p in (0.5, 0.0, 1.0)],
                      twice=False)


class SumOfItemSize(torch.nn.Module):
    """torch's test_constrain_size_with_various_cases (its bounded module)."""

    def forward(self, x, y):
        n = x.item()
        torch._check_is_size(n)
        torch._check(n <= 6)
        return y.sum() + torch.ones(n, 5).sum()


class Reductions(torch.nn.Module):
    def forward(self, x):
        m, rows = x[x > 0], x.nonzero()
        return m.amax(), m.amin(), m.prod(), (m > 1).any(), (m > 0).all(), rows.sum(0), rows.max(), m.sum()


@pytest.mark.full_sweep_only  # make test has test_data_dependent's reductions
def test_reductions_over_padded_tensors_fill_the_padding_with_their_identity():
    ep = torch.export.export(SumOfItemSize(), (torch.tensor(5), torch.randn(4, 5)))
    conformance.check(ep, [((torch.tensor(n), torch.randn(4, 5)), {}) for n in (5, 0, 6)], twice=False)
    ep = torch.export.export(Reductions(), (torch.randn(3, 4),))
    conformance.check(ep, [((torch.randn(3, 4),), {}), ((torch.randn(3, 4).abs() + 0.5,), {})], twice=False)


class CondOfPadded(torch.nn.Module):
    """torch's test_unbacked_to_cond and test_unbacked_to_cond_passthrough in one."""

    def forward(self, a):
        az = a.nonzero()
        total = torch.cond(az.size(0) > 3, lambda x: (x + 1).sum(), lambda x: (x + 3).sum(), (az,))
        rows = torch.cond(az.size(0) > 3, lambda x: x + 1, lambda x: x + 3, (az,))
        return total * 2, rows * 2


@pytest.mark.full_sweep_only  # make test samples padded tensors with the reductions test
def test_cond_takes_and_returns_padded_tensors():
    ep = torch.export.export(CondOfPadded(), (torch.randn(7),), strict=True)
    conformance.check(ep, [((a,), {}) for a in (torch.randn(7), torch.tensor([0., 0, 1, 0, 2, 0, 0]), torch.ones(7))],
                      twice=False)
