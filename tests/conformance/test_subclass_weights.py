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
