"""Symbolic scalar ops torch.export leaves in graphs (``torch.sym_sqrt``, ``torch.sym_sum``), and the ops that need
the user's own lowering: test-defined custom ops, custom ops that write their arguments (``auto_functionalized_v2``)
and collectives are refused with an error that says so and names ``torch_stablehlo.exporter.lowering``."""
import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.errors import UnsupportedOpsError

from ..support import make


class SymSqrt(torch.nn.Module):
    """torch's test_sym_sqrt."""

    def forward(self, x):
        return x / torch.sym_sqrt(x.shape[0])


class SymSumOfItems(torch.nn.Module):
    def forward(self, x, counts):
        a, b = counts[0].item(), counts[1].item()
        return x * torch.sym_sum([a, b, x.shape[0]])


@pytest.mark.parametrize("model, inputs, dynamic, others", [
    (SymSqrt(), (make((16, 4)),), {"x": {0: Dim("dim")}}, [(make((9, 4), seed=1),)]),
    (SymSumOfItems(), (make(3), torch.tensor([2, 5])), ({0: Dim("n")}, None),
     [(make(6, seed=1), torch.tensor([-4, 1]))]),
], ids=["sym_sqrt", "sym_sum"])
def test_symbolic_scalar_ops(model, inputs, dynamic, others):
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic)
    artifact = export_to_stablehlo(ep)
    for args in [inputs, *others]:
        torch.testing.assert_close(artifact(*args), ep.module()(*args))


@torch.library.custom_op("conformance_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("conformance_test::bump", mutates_args=("x",))
def bump(x: torch.Tensor) -> None:
    x.add_(1)


class CustomOps(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        bump(y)
        return scale(y)


class AllReduce(torch.nn.Module):
    def forward(self, x):
        return torch.ops._c10d_functional.all_reduce(x, "sum", "0")


def test_custom_ops_are_refused_saying_a_user_lowering_is_needed():
    with pytest.raises(UnsupportedOpsError) as raised:
        export_to_stablehlo(torch.export.export(CustomOps(), (make(3),)))
    message = str(raised.value)
    assert "conformance_test.scale.default" in message
    assert "a custom op (conformance_test): it needs a user lowering, torch_stablehlo.exporter.lowering(" in message
    assert "auto_functionalized_v2(conformance_test.bump.default)" in message
    assert "a custom op that writes its arguments (mutates_args): it needs a user lowering" in message


def test_collectives_are_refused_saying_a_user_lowering_is_needed():
    with pytest.raises(UnsupportedOpsError, match=r"_c10d_functional.all_reduce.default .*\n.*a collective "
                                                  r"\(torch.distributed\): it needs a user lowering"):
        export_to_stablehlo(torch.export.export(AllReduce(), (make(3),)))
