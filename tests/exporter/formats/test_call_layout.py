"""A call's inputs read without flattening the pytree where the call passes exactly the flat tensor inputs (what a
decode loop does at every token): the same tensors in the same order as ``tensor_inputs`` reads them, however the
call names them; anything else goes through ``tensor_inputs`` and its checks."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion.calls import tensor_inputs
from torch_stablehlo.exporter.errors import InputError
from tests.support import make


class Affine(torch.nn.Module):
    def forward(self, x, scale, shift):
        return x * scale + shift


@pytest.fixture(scope="module")
def artifact():
    return export_to_stablehlo(Affine(), (make((2, 3)),), {"scale": make((3,), seed=1), "shift": make((3,), seed=2)})


def test_flat_calls_read_the_inputs_as_tensor_inputs_does(artifact):
    x, scale, shift = make((2, 3), seed=3), make((3,), seed=4), make((3,), seed=5)
    expected = Affine()(x, scale, shift)
    for args, kwargs in [((x,), {"scale": scale, "shift": shift}), ((x,), {"shift": shift, "scale": scale})]:
        tensors = artifact._layout.given_tensors(args, kwargs)
        assert [t is u for t, u in zip(tensors, tensor_inputs(artifact.signature, args, kwargs))] == [True] * 3
        torch.testing.assert_close(artifact(*args, **kwargs), expected)
    torch.testing.assert_close(artifact(x=x, scale=scale, shift=shift), expected)  # x by name: the general path


@pytest.mark.parametrize("kwargs", [{"scale": make((3,))}, {"scale": make((3,)), "shift": make((3,)), "bias": 1},
                                    {"scale": make((3,)), "shift": [1.0, 2.0, 3.0]}])
def test_other_calls_meet_the_checks(artifact, kwargs):
    assert artifact._layout.given_tensors((make((2, 3)),), kwargs) is None
    with pytest.raises(InputError):
        artifact(make((2, 3)), **kwargs)
