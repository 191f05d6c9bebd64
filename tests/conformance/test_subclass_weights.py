"""Tensor-subclass weights that flatten (``__tensor_flatten__``) and that the program's ops take whole (the
subclass's own dispatch runs them) are made plain, each inner tensor a weight of its own; a program that then
returns subclass tensors is refused naming the subclass (it was refused with a torchao quantization error)."""
import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

from torch_stablehlo.exporter import export_to_stablehlo

from ..support import make


class SubclassWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(TwoTensor(make(3, seed=1), make(3, seed=2)))


class PlainOut(SubclassWeight):
    def forward(self, x):
        summed = x * self.weight + 1
        return summed.a - summed.b


class SubclassOut(SubclassWeight):
    def forward(self, x):
        return x + self.weight


def test_subclass_weight_with_plain_outputs_is_made_plain():
    ep = torch.export.export(PlainOut(), (make(3),))
    artifact = export_to_stablehlo(ep)
    for seed in (0, 5):
        torch.testing.assert_close(artifact(make(3, seed=seed)), ep.module()(make(3, seed=seed)))


def test_subclass_outputs_are_refused_naming_the_subclass():
    with pytest.raises(NotImplementedError, match=r"'weight' \(torch.testing._internal.two_tensor.TwoTensor\) make "
                                                  r"the program return tensors of their subclass"):
        export_to_stablehlo(torch.export.export(SubclassOut(), (make(3),)))


class Inner(torch.nn.Module):
    def forward(self, x):
        return x.sum()


class PreservedCall(torch.nn.Module):
    """torch's test_export_aten_to_unflatten_subclass_pre_dispatch: a submodule whose call signature is kept
    (``preserve_module_call_signature``) takes the subclass weight."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.weight = torch.nn.Parameter(TwoTensor(make(3, seed=1), make(3, seed=2)))

    def forward(self, x):
        return (self.inner(self.weight.to(torch.float)) + x.sum()).a


def test_subclass_weight_taken_by_a_submodule_whose_call_signature_is_kept():
    ep = torch.export.export(PreservedCall(), (make(3),), strict=False, preserve_module_call_signature=("inner",))
    calls = [entry.signature for entry in ep.module_call_graph]
    torch.testing.assert_close(export_to_stablehlo(ep)(make(3, seed=4)), ep.module()(make(3, seed=4)))
    assert [entry.signature for entry in ep.module_call_graph] == calls  # the program's own is left as it was
