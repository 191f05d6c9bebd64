"""Sizes torch computes through floats (``round(s / 2.0)``) are integer arithmetic in the module and in a dim's
text, exact at every size; inputs whose type has no pytree serialization name (a module, an unregistered dataclass,
a registered constant) convert, and saving a bundle of them is refused naming the type."""
import dataclasses
import math

import pytest
import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import Dim
from torch.utils._sympy.functions import CeilToInt, FloatTrueDiv, FloorToInt, RoundToInt, ToFloat, TruncToInt

from torch_stablehlo.exporter.errors import ExportError
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.size_exprs import integer_expr
from torch_stablehlo.tools import conformance


@pytest.mark.parametrize("rounding, python", [(RoundToInt, round), (FloorToInt, math.floor), (CeilToInt, math.ceil)])
@pytest.mark.parametrize("divisor", [2, 3, 4])
def test_rounded_quotients_are_exact_integer_arithmetic(rounding, python, divisor):
    s = sympy.Symbol("s", integer=True, positive=True)
    expr = integer_expr(rounding(FloatTrueDiv(ToFloat(s), sympy.Float(divisor))))
    assert not expr.has(rounding, FloatTrueDiv)
    assert [int(expr.subs(s, n)) for n in range(1, 40)] == [python(n / divisor) for n in range(1, 40)]


@pytest.mark.parametrize("factor", [0.5, 0.25, 0.1, 2.0, 3.0])
def test_truncated_products_by_a_float_are_exact_integer_arithmetic(factor):
    """interpolate's sizes: ``trunc(s * 0.5)`` is ``s // 2`` (a float no smaller than 1 / c divides by c)."""
    s = sympy.Symbol("s", integer=True, nonnegative=True)
    expr = integer_expr(TruncToInt(sympy.Float(factor) * ToFloat(s)))
    assert not expr.has(TruncToInt)
    assert [int(expr.subs(s, n)) for n in range(200)] == [math.trunc(n * factor) for n in range(200)]


def test_a_product_by_a_float_below_its_reciprocal_is_left_as_it_is():
    s = sympy.Symbol("s", integer=True, nonnegative=True)
    assert integer_expr(TruncToInt(sympy.Float(1 / 3) * ToFloat(s))).has(TruncToInt)


class RoundedSlice(torch.nn.Module):
    def forward(self, x):
        return x[:round(x.shape[0] / 2.0)] * 2


def test_a_slice_to_a_rounded_size_matches_at_every_size():
    ep = torch.export.export(RoundedSlice(), (torch.randn(8),), dynamic_shapes={"x": {0: Dim("n", min=5, max=10)}})
    conformance.check(ep, [((torch.randn(n),), {}) for n in (5, 6, 7, 10)], twice=False)


class TakesModule(torch.nn.Module):
    def forward(self, x, m):
        return m(x) + x


@dataclasses.dataclass
class Unnamed:
    t: torch.Tensor
    scale: int


pytree.register_dataclass(Unnamed)


class TakesDataclass(torch.nn.Module):
    def forward(self, d):
        return d.t * d.scale


@dataclasses.dataclass(frozen=True)
class Settings:
    offset: int


pytree.register_constant(Settings)


class TakesConstant(torch.nn.Module):
    def forward(self, x, settings):
        return x + settings.offset


def test_inputs_without_a_serialization_name_convert_and_bundles_refuse_naming_the_type(tmp_path):
    """A module input flattens to its weights (as ep.module() flattens it), a dataclass and a registered constant
    by their live pytree; only a bundle's manifest must record the pytree as text, so saving one is refused."""
    linear = torch.nn.Linear(3, 3)
    cases = [(TakesModule(), (torch.randn(2, 3), linear), r"torch\.nn\.modules\.linear\.Linear \(an nn\.Module"),
             (TakesDataclass(), (Unnamed(torch.randn(2), 3),), r"test_sizes_and_input_types\.Unnamed, a type with no"),
             (TakesConstant(), (torch.randn(2), Settings(4)), r"test_sizes_and_input_types\.Settings, a type with no")]
    for model, inputs, named in cases:
        ep = torch.export.export(model, inputs, strict=False)
        artifact = export_to_stablehlo(ep)
        conformance.run_against_module(ep, artifact, [(inputs, {})])
        with pytest.raises(ExportError, match=named):
            artifact.save(tmp_path / "bundle")
        assert not (tmp_path / "bundle").exists()
    ep = torch.export.export(TakesModule(), (torch.randn(2, 3), linear), strict=False)
    other = torch.nn.Linear(3, 3)  # another module of the type: its own weights are the inputs
    conformance.run_against_module(ep, export_to_stablehlo(ep), [((torch.randn(2, 3), other), {})])


class GridOfSize(torch.nn.Module):
    """torch's test_size_input: a torch.Size input, whose ints the program holds constant."""

    def forward(self, theta, size):
        return torch.nn.functional.affine_grid(theta, size, align_corners=False)


@pytest.mark.full_sweep_only  # make test samples the read-only check with test_scalar_inputs' forced value
def test_a_torch_size_input():
    """The decomposition's retrace gives the Size's ints new symbols and the program's guards pin them to the
    constants: no specialisation of the program's own symbols, so the conversion goes on."""
    ep = torch.export.export(GridOfSize(), (torch.ones((1, 2, 3)), torch.Size((1, 3, 4, 5))))
    theta = torch.tensor([[[0.9, 0.1, 0.2], [-0.3, 1.1, 0.0]]])
    conformance.check(ep, [((theta, torch.Size((1, 3, 4, 5))), {})], twice=False)
