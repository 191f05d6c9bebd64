"""Sizes read from tensor data with no bound (``.item()``, ``.tolist()``), given by the call (``Signature.call_sizes``):
PyTorch's export tests that make tensors of such sizes and reduce, pad, view, expand and multiply them, checked
against ``ep.module()`` at the example and at other values (negative pads included)."""
import pytest
import torch

from torch_stablehlo.tools import conformance


class Reduced(torch.nn.Module):
    """test_automatic_constrain_size."""

    def forward(self, x, y):
        n = x.item()
        return y.sum() + torch.ones(n, 5).sum()


class Padded(torch.nn.Module):
    """test_unbacked_pad: three sizes and four pads (two of them negative) from tolist."""

    def forward(self, xs, pad):
        u0, u1, u2 = xs.tolist()
        pl0, pr0, pl1, pr1 = pad.tolist()
        return torch.nn.functional.pad(torch.ones(u0, u1, u2), (pl0, pr0, pl1, pr1))


class Expanded(torch.nn.Module):
    """test_unbacked_3d_matmul: an expand to a size over such a size."""

    def forward(self, x, repeat):
        t1 = x.unsqueeze(1).expand(x.size(0), repeat.item() // 2, x.size(-1))
        return torch.matmul(t1, torch.ones(3))


class Viewed(torch.nn.Module):
    """test_unbacked_noncontig_lin: a tensor as a size, viewed and fed to a linear layer."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(torch.ones(x).view(1, -1, 8) * 0.5)


@pytest.mark.full_sweep_only  # 8 calls, each compiled twice (17 s); make test has test_unbacked's sample
def test_sizes_read_from_data_with_no_bound():
    cases = [
        (Reduced(), [(torch.tensor(1), torch.ones(4, 5)), (torch.tensor(7), torch.randn(4, 5))]),
        (Padded(), [(torch.tensor([3, 3, 3]), torch.tensor([2, -2, 1, 0])),
                    (torch.tensor([2, 4, 5]), torch.tensor([1, 0, -1, 2]))]),
        (Expanded(), [(torch.randn(4, 3), torch.scalar_tensor(2, dtype=torch.int)),
                      (torch.randn(4, 3), torch.scalar_tensor(7, dtype=torch.int))]),
        (Viewed(), [(torch.tensor([32]),), (torch.tensor([16]),)]),
    ]
    for model, calls in cases:
        ep = torch.export.export(model, calls[0])
        conformance.check(ep, [(c, {}) for c in calls], twice=False)
