"""The golden quantized MLP (``mlp_int8``) exported with a dynamic batch: one artifact, run at the min, the max
and a size between, within one output quantization step of the pt2e-converted model run by torch.

Two things made this fail: the converted model carried the input-shape guards of pt2e's static export
(``golden/quantized_zoo.py`` now prepares the module without them), and shape refinement crashed on a quantized
``dot_general`` with a dynamic dim (``stablehlo_ir.passes.prepare_for_xla`` now legalizes the quant types first and
refines the integer module).
"""
import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden import zoo

from .support import steps_off

SIZES = [1, 5, 64]
# (q - zero_point) * scale in float32 may put a one-step difference a rounding error above one step
FLOAT_SLACK = 1e-4


@pytest.fixture(scope="module")
def mlp_int8():
    built = zoo.get("mlp_int8").build()
    program = torch.export.export(built.model, built.args, dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    return built, {form: export_to_stablehlo(program, quantized_ops=form) for form in ("fused", "unfused")}


@pytest.mark.parametrize("form", ["fused", "unfused"])
def test_dynamic_batch_within_one_step_at_three_sizes(mlp_int8, form):
    built, artifacts = mlp_int8
    artifact = artifacts[form]
    assert artifact.signature.dims == {"batch": [1, 64]}
    assert "!quant.uniform" in artifact.stablehlo_text
    generator = torch.Generator().manual_seed(3)
    for batch in SIZES:
        x = torch.randn(batch, 16, generator=generator)
        with torch.no_grad():
            expected = built.model(x)
        actual = artifact(x)
        assert actual.shape == (batch, 10)
        assert steps_off(actual, expected, built.abs_tolerance) <= 1 + FLOAT_SLACK, (form, batch)
