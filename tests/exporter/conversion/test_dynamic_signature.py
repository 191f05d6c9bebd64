"""The signature of a dynamic program: symbolic dims under the user's Dim names with their ranges, derived dims,
kept through JSON and bundles; the size checks a call must pass; portable artifacts of dynamic chlo ops."""
import json

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.errors import DimensionError
from torch_stablehlo.exporter.conversion.inplace import InPlaceWrites
from torch_stablehlo.exporter.conversion.signature import signature_of
from torch_stablehlo.exporter.formats.manifest_schema import signature_from_json, signature_json
from torch_stablehlo.exporter.conversion.symbolic_dims import check_dims, parse_dim, rename_dim
from torch_stablehlo.stablehlo_ir.passes import portable_artifact
from torch_stablehlo.stablehlo_ir.refine import ShapeRefinementError, refine_shapes
from torch_stablehlo.stablehlo_ir.specs import TensorSpec
from tests.support import make


class Pair(torch.nn.Module):
    def forward(self, x, y):
        return x + y[: x.shape[0]].sum(1, keepdim=True)


def _pair_program():
    batch = Dim("batch", min=2, max=16)
    return torch.export.export(Pair(), (make((3, 4)), make((6, 2))), dynamic_shapes=({0: batch}, {0: 2 * batch}))


def test_user_dim_names_and_ranges_in_the_signature():
    program = _pair_program()
    signature = signature_of(program, InPlaceWrites.of_program(program).kinds)
    assert [s.tensor.shape for s in signature.user_inputs] == [("batch", 4), ("2*batch", 2)]
    assert signature.dims == {"batch": [2, 16], "2*batch": [4, 32]}
    assert signature.user_outputs[0].tensor.shape == ("batch", 4)
    assert "batch in [2, 16]" in str(signature)


def test_unnamed_dims_keep_torchs_symbols():
    program = torch.export.export(Pair(), (make((3, 4)), make((5, 2))), dynamic_shapes=({0: Dim.AUTO}, None))
    signature = signature_of(program, InPlaceWrites.of_program(program).kinds)
    (symbol,) = signature.dims
    assert symbol.startswith("s") and signature.user_inputs[0].tensor.shape == (symbol, 4)
    assert signature.dims[symbol][1] == 5  # y[:x.shape[0]] with y of 5 rows: torch bounds the AUTO dim


def test_dims_survive_json_and_bundles(tmp_path):
    artifact = export_to_stablehlo(_pair_program())
    again = signature_from_json(json.loads(json.dumps(signature_json(artifact.signature))))
    assert again.dims == artifact.signature.dims and again.inputs == artifact.signature.inputs
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert loaded.signature.dims == {"batch": [2, 16], "2*batch": [4, 32]}
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["signature"]["inputs"][-1]["tensor"]["shape"] == ["2*batch", 2]
    for batch in (2, 9, 16):
        x, y = make((batch, 4), seed=batch), make((2 * batch, 2))
        torch.testing.assert_close(loaded(x, y), Pair()(x, y))


# -- call-time checks on the signature alone ------------------------------------------------------------------

SPECS = [TensorSpec("x", "float32", ("batch", 4)), TensorSpec("y", "float32", ("2*batch", "seq + 1"))]
RANGES = {"batch": [2, 16], "2*batch": [4, 32], "seq": [1, 8], "seq + 1": [2, 9]}


def _check(x_batch, y_rows, y_cols):
    return check_dims(SPECS, [torch.empty(x_batch, 4), torch.empty(y_rows, y_cols)], RANGES)


def test_sizes_bind_every_symbol():
    assert _check(3, 6, 5) == {"batch": 3, "seq": 4}
    assert _check(16, 32, 9) == {"batch": 16, "seq": 8}


@pytest.mark.parametrize("sizes, message", [
    ((1, 2, 5), "input 'x' dim 0 is 1, outside the allowed range [2, 16] of its symbolic dim batch"),
    ((17, 34, 5), "input 'x' dim 0 is 17, outside the allowed range [2, 16] of its symbolic dim batch"),
    ((3, 8, 5), "input 'y' dim 0 is 8, but it must equal 2*batch = 6 (batch = 3 from input 'x' dim 0)"),
    ((3, 6, 10), "input 'y' dim 1 is 10, outside the allowed range [2, 9] of its symbolic dim seq + 1"),
])
def test_a_size_that_breaks_a_range_or_relation_is_named(sizes, message):
    with pytest.raises(DimensionError) as error:
        _check(*sizes)
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)


def test_a_root_bound_through_a_derived_dim_is_range_checked():
    specs = [TensorSpec("y", "float32", ("2*n",))]
    with pytest.raises(DimensionError, match=r"input 'y' dim 0 is 12 \(2\*n\), which gives n = 6, outside the "
                                             r"allowed range \[2, 5\] of n"):
        check_dims(specs, [torch.empty(12)], {"n": [2, 5]})
    with pytest.raises(DimensionError, match=r"it must be 2\*n for an integer n"):
        check_dims(specs, [torch.empty(7)], {"n": [2, 5]})


def test_parse_and_rename_dims():
    assert parse_dim("2*s27 + 1") == 2 * parse_dim("s27") + 1
    assert rename_dim("2*s27", {"s27": "batch"}) == "2*batch"
    assert rename_dim("s27 + 1", {"s27": "batch"}) == "batch + 1"
    assert rename_dim(4, {"s27": "batch"}) == 4


# -- modules -------------------------------------------------------------------------------------------------

def test_dynamic_gelu_serializes_as_pure_stablehlo_and_refines():
    batch = Dim("batch", min=2, max=64)
    artifact = export_to_stablehlo(torch.nn.GELU(), (make((4, 3)),), dynamic_shapes=({0: batch},))
    assert "chlo.erf" in artifact.stablehlo_text and "tensor<?x3xf32>" in artifact.stablehlo_text
    assert portable_artifact(artifact.stablehlo_text, "1.10.0")  # chlo on dynamic shapes: expanded, still portable
    refined = refine_shapes(artifact.stablehlo_text, [(5, 3)])
    assert "?" not in refined and "tensor<5x3xf32>" in refined
    with pytest.raises(ShapeRefinementError, match=r"@main argument 0 has type tensor<\?x3xf32>, got shape \[5, 4\]"):
        refine_shapes(artifact.stablehlo_text, [(5, 4)])


def test_attention_composite_refines_through_its_decomposition():
    batch = Dim("batch", min=2, max=8)
    q = make((2, 2, 5, 4))
    artifact = export_to_stablehlo(_Attention(), (q,), dynamic_shapes=({0: batch, 2: Dim("seq", min=2, max=9)},))
    assert "stablehlo.composite" in artifact.stablehlo_text
    refined = refine_shapes(artifact.stablehlo_text, [(3, 2, 7, 4)])
    assert "?" not in refined and "tensor<3x2x7x7xf32>" in refined


class _Attention(torch.nn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)
