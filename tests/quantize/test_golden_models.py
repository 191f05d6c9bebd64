"""The quantized zoo models (pt2e MLP, CNN, transformer block): real quant ops in the StableHLO, kept through
save and load, and fused and unfused forms within one output quantization step of the stored torch golden and
of each other. (``tests/golden`` runs the default, fused, form through ``golden.verify`` as well.)"""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.golden import store, zoo

from .support import assert_real_quant_ops, quant_op_lines, steps_off


@pytest.fixture(scope="module", params=zoo.names("quantized"))
def exported(request):
    name = request.param
    built, golden = zoo.get(name).build(), store.load_golden(name)
    program = torch.export.export(built.model, golden.args)
    artifacts = {form: export_to_stablehlo(program, quantized_ops=form) for form in ("fused", "unfused")}
    return name, built, golden, artifacts


def test_quantized_golden_models_exist():
    assert set(zoo.names("quantized")) == {"mlp_int8", "cnn_int8", "transformer_block_int8"}


def test_stablehlo_has_real_quant_ops(exported, tmp_path):
    name, _, golden, artifacts = exported
    for artifact in artifacts.values():
        assert_real_quant_ops(artifact.stablehlo_text)
    fused = artifacts["fused"].stablehlo_text
    assert quant_op_lines(fused, "dot_general")
    if name == "cnn_int8":
        assert quant_op_lines(fused, "convolution")
    loaded = load_artifact(artifacts["fused"].save(tmp_path / name))
    assert_real_quant_ops(loaded.stablehlo_text)
    assert any(w.dtype == torch.int8 for w in loaded.weights.values())


def test_within_one_output_step_of_the_golden_and_of_each_other(exported):
    _, built, golden, artifacts = exported
    step = built.abs_tolerance
    outputs = {form: artifact(*golden.args) for form, artifact in artifacts.items()}
    for form, output in outputs.items():
        assert steps_off(output, golden.outputs[0], step) <= 1, form
    assert steps_off(outputs["fused"], outputs["unfused"], step) <= 1
