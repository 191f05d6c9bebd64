"""Slices whose bounds are read from data (a ``cond``'s int result, ``.item()``) are ``dynamic_slice``s once their
sizes are known: XLA has no ``real_dynamic_slice`` (such programs once converted and then failed to compile)."""
import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.tools import conformance

from ..support import make


class CondIndex(torch.nn.Module):
    """torch's test_cond_branches_return_constant_int."""

    def forward(self, x):
        idx = torch.cond(x.sum() > 3, lambda: 0, lambda: 1, tuple())
        return x[idx]


class Windows(torch.nn.Module):
    """Static, symbolic and strided windows from a start read from data."""

    def forward(self, x, y):
        idx = torch.cond(y.sum() > 3, lambda: 0, lambda: 1, tuple())
        return x[:, idx:idx + 2], x[idx:idx + x.shape[0] - 2], x[:, idx:idx + 3:2]


def test_index_from_a_cond():
    ep = torch.export.export(CondIndex(), (make((3, 3)),))
    artifact = export_to_stablehlo(ep)
    for x in (make((3, 3)), torch.ones(3, 3), torch.zeros(3, 3)):
        torch.testing.assert_close(artifact(x), ep.module()(x))


def test_windows_from_a_data_start_at_several_sizes():
    ep = torch.export.export(Windows(), (make((5, 4)), torch.ones(3)), dynamic_shapes=({0: Dim("a", min=4)}, None))
    artifact = export_to_stablehlo(ep)
    for rows, y in [(5, torch.ones(3)), (7, torch.zeros(3)), (4, torch.ones(3))]:
        x = make((rows, 4), seed=rows)
        torch.testing.assert_close(artifact(x, y), ep.module()(x, y))


class PrefixOfItem(torch.nn.Module):
    """torch's test_runtime_assert_with_size: a slice to ``.item()`` of a dynamic dim, bounded by that dim."""

    def forward(self, x, y):
        a = x.item()
        torch._check_is_size(a)
        torch._check(a <= y.size(0))
        return y[:a]


class SplitByTensor(torch.nn.Module):
    def forward(self, x, s):
        return torch.tensor_split(x, s, dim=0)


@pytest.mark.full_sweep_only  # compiles per call; make test has the windows test
def test_data_dependent_slices_of_a_dynamic_dim_are_held_padded():
    """Padded to the input dim's own (symbolic) size: the input from start 0, else its rows from the start on
    (a gather), their true sizes beside them."""
    ep = torch.export.export(PrefixOfItem(), (torch.tensor(5), torch.ones(10)), dynamic_shapes=(None, {0: Dim("t")}))
    conformance.check(ep, [((torch.tensor(a), make((n,), seed=n)), {}) for a, n in ((5, 10), (0, 4), (7, 7))],
                      twice=False)
    ep = torch.export.export(SplitByTensor(), (make((6, 2)), torch.tensor([2, 4])),
                             dynamic_shapes=({0: Dim("n", max=20)}, None))
    conformance.check(ep, [((make((n, 2), seed=n), torch.tensor(s)), {})
                           for n, s in ((6, [2, 4]), (9, [3, 9]))], twice=False)
