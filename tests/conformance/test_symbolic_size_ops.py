"""Ops whose sizes are symbolic where their tables were once built at conversion time: upsampling (its taps;
PyTorch's ``test_solver_unsupported_sympy_function``) and ``nonzero_static`` of a dynamic input to a dynamic size
(``test_mask_nonzero_static``), checked against ``ep.module()`` at several sizes."""
import pytest
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


@pytest.mark.full_sweep_only  # compiles per size
def test_nonzero_static_of_symbolic_sizes():
    ep = torch.export.export(MaskedRows(), (torch.randn(5, 5), torch.ones(5, 5, dtype=torch.bool), torch.randn(25)),
                             dynamic_shapes=((Dim("batch"), None), (Dim("batch"), None), (Dim("e", max=100),)))
    conformance.check(ep, [((torch.randn(r, 5), torch.rand(r, 5) > 0.5, torch.randn(e)), {})
                           for r, e in ((5, 25), (4, 3))], twice=False)
    ep = torch.export.export(Coordinates(), (torch.randn(4, 3) > 0, torch.randn(5)),
                             dynamic_shapes=({0: Dim("r")}, {0: Dim("e")}))
    conformance.check(ep, [((torch.randn(r, 3) > 0, torch.randn(e)), {}) for r, e in ((4, 5), (2, 9))],
                      twice=False)


class Rescaled(torch.nn.Module):
    """torch's test_solver_unsupported_sympy_function: bilinear by scale factors of symbolic spatial sizes."""

    def forward(self, x, y):
        x = torch.nn.functional.interpolate(x, scale_factor=0.5, mode="bilinear")
        return torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear") + y


class Resized(torch.nn.Module):
    def forward(self, x, y):
        size = y.shape[-2:]
        return (torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=True),
                torch.nn.functional.interpolate(x, size=size, mode="bilinear"),
                torch.nn.functional.interpolate(x, size=size, mode="nearest"))


@pytest.mark.full_sweep_only  # compiles per size
def test_upsampling_of_symbolic_spatial_sizes():
    """The taps computed in the module; out == in and nearest's out == 2 * in are torch's special cases."""
    auto = Dim.AUTO
    ep = torch.export.export(Rescaled(), (torch.rand(1, 1, 32, 32), torch.rand(1, 1, 32, 32)),
                             dynamic_shapes=({2: auto, 3: auto}, {2: auto, 3: auto}))
    conformance.check(ep, [((torch.rand(1, 1, h, w), torch.rand(1, 1, h, w)), {}) for h, w in ((32, 32), (10, 12))],
                      twice=False)
    ep = torch.export.export(Resized(), (torch.rand(1, 2, 5, 7), torch.rand(9, 10)),
                             dynamic_shapes=({2: auto, 3: auto}, {0: auto, 1: auto}))
    conformance.check(ep, [((torch.rand(1, 2, h, w), torch.rand(a, b)), {})
                           for h, w, a, b in ((5, 7, 9, 10), (4, 4, 8, 8), (6, 3, 6, 3), (7, 9, 3, 2))], twice=False)
