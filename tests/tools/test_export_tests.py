"""The measurement over PyTorch's export tests (``tools/export_tests.py``) on programs its own runs meet: one
exported under a FakeTensorMode (measured on values drawn at random) and one whose example inputs break a check
the program makes (ok only where the artifact refuses them as ``ep.module()`` does)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_stablehlo.tools.export_tests import measure

from ..conformance.test_unbacked import AtLeastFour


class AddWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return self.weight * x + 1


def test_fake_inputs_are_measured_on_values_drawn_at_random():
    with FakeTensorMode():
        x = torch.randn(4, 4)
    ep = torch.export.export(AddWeight(), (x,))
    assert measure(ep, "fake_inputs").status == "ok"


def test_inputs_ep_module_refuses_must_be_refused_by_the_artifact_too():
    ep = torch.export.export(AtLeastFour(), (torch.tensor([3]),))  # export does not check the example's value
    with pytest.raises(RuntimeError, match=r"u\d+ >= 4"):
        ep.module()(torch.tensor([3]))
    assert measure(ep, "constraints_error").status == "ok"
