"""Ops whose sizes are symbolic where their tables were once built at conversion time: ``nonzero_static`` of a
dynamic input to a dynamic size (PyTorch's ``test_mask_nonzero_static``), checked against ``ep.module()`` at
sizes above, below and equal to the element count."""
import torch
from torch.export import Dim

from torch_stablehlo.tools import conformance


class MaskedRows(torch.nn.Module):
    def forward(self, seq_embeddings, mask, exp):
        index = torch.nonzero_static(mask, size=exp.shape[0])
        return seq_embeddings[index.chunk(chunks=mask.dim(), dim=1)].squeeze() * 2


class Coordinates(torch.nn.Module):
    def forward(self, x, e):
        return torch.nonzero_static(x, size=e.shape[0], fill_value=-7)


def test_nonzero_static_of_symbolic_sizes():
    ep = torch.export.export(MaskedRows(), (torch.randn(5, 5), torch.ones(5, 5, dtype=torch.bool), torch.randn(25)),
                             dynamic_shapes=((Dim("batch"), None), (Dim("batch"), None), (Dim("e", max=100),)))
    conformance.check(ep, [((torch.randn(r, 5), torch.rand(r, 5) > 0.5, torch.randn(e)), {})
                           for r, e in ((5, 25), (4, 3))], twice=False)
    ep = torch.export.export(Coordinates(), (torch.randn(4, 3) > 0, torch.randn(5)),
                             dynamic_shapes=({0: Dim("r")}, {0: Dim("e")}))
    conformance.check(ep, [((torch.randn(r, 3) > 0, torch.randn(e)), {}) for r, e in ((4, 5), (2, 9))],
                      twice=False)
