"""int inputs that torch.export keeps symbolic (``Dim.DYNAMIC``) are 0-d int64 arguments of ``@main``, given as
Python ints and checked against their symbol's range at call time, as ``ep.module()`` checks them. Converting
such a program once specialised the symbol in the program's own ShapeEnv: the artifact then refused every value,
the example included, and ``ep.module()`` stopped raising its guard error."""
import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import sym_and, sym_or

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.errors import DimensionError, InputError, LoweringError
from torch_stablehlo.exporter.conversion.read_only import untouched
from torch_stablehlo.exported_program import shape_env_of
from torch_stablehlo.tools import conformance

from ..support import make


class Scale(torch.nn.Module):
    def forward(self, n, y):
        return y * n + n


class Sized(torch.nn.Module):
    """The int input and a dim of the tensor input are one symbol."""

    def forward(self, n, y):
        torch._check(n == y.shape[0])
        return y.sum() * n


def _exported(model, args, dynamic_shapes):
    return torch.export.export(model, args, dynamic_shapes=dynamic_shapes)


def test_int_input_is_an_argument_checked_against_its_range():
    ep = _exported(Scale(), (3, make(4)), {"n": Dim.DYNAMIC(min=0, max=10), "y": None})
    artifact = export_to_stablehlo(ep)
    assert [s.scalar for s in artifact.signature.user_inputs] == ["int", None]
    for n in (3, 0, 7, 10):
        torch.testing.assert_close(artifact(n, make(4, seed=n)), ep.module()(n, make(4, seed=n)))
    with pytest.raises(DimensionError, match=r"input 'n' is 11, outside the allowed range \[0, 10\]"):
        artifact(11, make(4))
    with pytest.raises(InputError, match="expected a Python int"):
        artifact(2.5, make(4))
    with pytest.raises(Exception, match="Guard failed"):  # the program still checks its own guard
        ep.module()(11, make(4))


def test_int_input_sharing_a_dim_symbol():
    ep = _exported(Sized(), (3, make(3)), {"n": Dim.DYNAMIC, "y": {0: Dim.DYNAMIC}})
    artifact = export_to_stablehlo(ep)
    for n in (2, 5):
        torch.testing.assert_close(artifact(n, make(n)), ep.module()(n, make(n)))


def test_a_specialisation_during_conversion_is_undone_and_named():
    ep = _exported(Scale(), (3, make(4)), {"n": Dim.DYNAMIC(min=0, max=10), "y": None})
    n = next(node for node in ep.graph.nodes if node.op == "placeholder").meta["val"]
    with pytest.raises(LoweringError, match=r"specialised the symbolic size s\d+ to 3"):
        with untouched(shape_env_of(ep)):
            int(n)  # what float(SymInt) in a rule once did
    with pytest.raises(Exception, match="Guard failed"):
        ep.module()(11, make(4))
    torch.testing.assert_close(export_to_stablehlo(ep)(5, make(4)), ep.module()(5, make(4)))


class ForcedItems(torch.nn.Module):
    """torch's test_sym_or_sym_and: the checks leave ``u2`` one value, which the decomposition's retrace puts in."""

    def forward(self, xs):
        u0, u1, u2 = xs.tolist()
        torch._check(sym_or(u0 == 2, u0 == 4, u0 == 6))
        torch._check(sym_and(u1 >= 4, u1 <= 8, u2 == 5))
        return u0 + u1 + u2


def test_a_value_the_program_forces_is_no_specialisation():
    ep = torch.export.export(ForcedItems(), (torch.tensor([2, 6, 5]),), strict=False)
    conformance.check(ep, [((torch.tensor(xs),), {}) for xs in ([2, 6, 5], [6, 8, 5])])


class ViewTo(torch.nn.Module):
    def forward(self, x, size):
        return x.view(size)


def test_torch_size_input():
    """torch's test_size_input: a ``torch.Size`` is flattened as the tuple it is (it was refused as another
    structure)."""
    ep = torch.export.export(ViewTo(), (make(6), torch.Size([2, 3])))
    artifact = export_to_stablehlo(ep)
    torch.testing.assert_close(artifact(make(6), torch.Size([2, 3])), ep.module()(make(6), torch.Size([2, 3])))
    with pytest.raises(InputError, match="specialised to 2 at export; got 3"):
        artifact(make(6), torch.Size([3, 2]))


class AssertsItsInt(torch.nn.Module):
    def forward(self, x, y):
        assert x == 3  # Dim.AUTO: export specialises x to its example value
        return x * y


def test_an_int_input_export_specialised_takes_its_example_value():
    ep = torch.export.export(AssertsItsInt(), (3, torch.randn(4, 4)), dynamic_shapes=(Dim.AUTO, None))
    y = torch.randn(4, 4)
    torch.testing.assert_close(export_to_stablehlo(ep)(3, y), ep.module()(3, y))


class BranchOnInt(torch.nn.Module):
    """torch's test_cond_access_identical_symint_closure: a cond on an int input's equality (an ``eq`` of a
    SymInt, once lowered as if it were a tensor), its branches closing over the ints."""

    def forward(self, x, trigger, target):
        return torch.cond(trigger == 1, lambda: x + target, lambda: x * target, ())


@pytest.mark.full_sweep_only  # make test has the int inputs above; this cause's fix is older (the export run checks it)
def test_cond_on_an_int_inputs_equality():
    ep = _exported(BranchOnInt(), (make(2), 0, 2), (None, Dim.DYNAMIC, Dim.DYNAMIC))
    conformance.check(ep, [((make(2), trigger, target), {}) for trigger, target in ((0, 2), (1, 5))],
                      twice=False)
