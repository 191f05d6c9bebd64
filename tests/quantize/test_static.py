"""pt2e static quantization: per-tensor and per-channel int8 (XNNPACK), asymmetric uint8 activations (X86),
fused and unfused, against the converted model run by torch."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden.quantized_zoo import pt2e_quantize

from .support import (assert_real_quant_ops, assert_within_one_step, linear_conv_inputs, linear_conv_model,
                      one_step_bounds, quant_op_lines, quantizer, steps_off)

# quantizer -> the quant type its weights must have, and its activations'
SCHEMES = {
    "xnnpack_per_channel": (r"!quant.uniform<i8<-127:127>:f32:0, {", "!quant.uniform<i8:f32, "),
    "xnnpack_per_tensor": (r"!quant.uniform<i8<-127:127>:f32, ", "!quant.uniform<i8:f32, "),
    "x86_uint8": (r"!quant.uniform<i8:f32:0, {", "!quant.uniform<u8:f32, "),
}


@pytest.fixture(scope="module", params=list(SCHEMES))
def converted(request):
    """(scheme name, the converted model, its example inputs, its artifacts by form)."""
    args = linear_conv_inputs()
    model = pt2e_quantize(linear_conv_model(), args, quantizer(request.param))
    program = torch.export.export(model, args)
    artifacts = {form: export_to_stablehlo(program, quantized_ops=form) for form in ("fused", "unfused")}
    return request.param, model, args, artifacts


def test_stablehlo_has_quant_types_for_weights_and_activations(converted):
    name, _, _, artifacts = converted
    weight_type, activation_type = SCHEMES[name]
    for artifact in artifacts.values():
        text = artifact.stablehlo_text
        assert_real_quant_ops(text)
        assert weight_type in text and activation_type in text


def test_both_forms_match_torch_within_one_output_step(converted):
    _, model, args, artifacts = converted
    inputs = [args, linear_conv_inputs(seed=7)]  # the calibration batch and an unseen one
    for form, artifact in artifacts.items():
        for sample in inputs:
            with torch.no_grad():
                expected = model(*sample)
            assert_within_one_step(artifact(*sample), expected, one_step_bounds(model))


def test_fused_and_unfused_agree_within_one_output_step(converted):
    _, model, args, artifacts = converted
    assert_within_one_step(artifacts["fused"](*args), artifacts["unfused"](*args), one_step_bounds(model))


def test_fused_form_runs_products_on_quantized_operands(converted):
    _, _, _, artifacts = converted
    fused, unfused = artifacts["fused"].stablehlo_text, artifacts["unfused"].stablehlo_text
    assert len(quant_op_lines(fused, "dot_general")) == 2 and len(quant_op_lines(fused, "convolution")) == 1
    assert not quant_op_lines(unfused, "dot_general") and not quant_op_lines(unfused, "convolution")
    # the int32 accumulator carries the product of the scales, per output channel
    assert "x!quant.uniform<i32:f32" in fused


def test_int8_weights_stay_int8_and_float_originals_are_dropped(converted):
    _, model, _, artifacts = converted
    for artifact in artifacts.values():
        frozen = {name: w for name, w in artifact.weights.items() if name.startswith("_frozen_param")}
        assert len(frozen) == 3 and all(w.dtype == torch.int8 for w in frozen.values())
        assert "fc1.weight" not in artifact.weights and "conv.weight" not in artifact.weights
        assert torch.equal(frozen["_frozen_param0"], getattr(model, "_frozen_param0"))


def test_quantized_output_is_integer_storage():
    """A quantize whose value leaves the graph is returned as torch's int8/uint8 tensor."""
    qd = torch.ops.quantized_decomposed

    class Quantize(torch.nn.Module):
        def forward(self, x):
            signed = qd.quantize_per_tensor(x, 0.05, -3, -128, 127, torch.int8)
            unsigned = qd.quantize_per_tensor(x, 0.04, 130, 0, 255, torch.uint8)
            return signed, unsigned, qd.dequantize_per_tensor(unsigned, 0.04, 130, 0, 255, torch.uint8)

    x = torch.linspace(-9, 9, 301)  # beyond both ranges: both clamp
    actual, expected = export_to_stablehlo(Quantize(), (x,))(x), Quantize()(x)
    for got, want in zip(actual[:2], expected[:2]):
        assert got.dtype == want.dtype
        assert (got.int() - want.int()).abs().max() <= 1  # a tie may round the other way
        assert (got != want).float().mean() < 0.02
    assert steps_off(actual[2], expected[2], 0.04) <= 1


def test_batched_matmul_of_quantized_activations_fuses():
    """bmm between two dequantized activations (rhs symmetric), relu, quantize: one dot_general with a batch
    dim on quantized operands, whose int8 result also leaves the graph."""
    qd = torch.ops.quantized_decomposed

    class QuantizedBmm(torch.nn.Module):
        def forward(self, a, b):
            a = qd.dequantize_per_tensor(qd.quantize_per_tensor(a, 0.02, 3, -128, 127, torch.int8),
                                         0.02, 3, -128, 127, torch.int8)
            b = qd.dequantize_per_tensor(qd.quantize_per_tensor(b, 0.03, 0, -128, 127, torch.int8),
                                         0.03, 0, -128, 127, torch.int8)
            q = qd.quantize_per_tensor(torch.bmm(a, b).relu(), 0.05, -5, -128, 127, torch.int8)
            return qd.dequantize_per_tensor(q, 0.05, -5, -128, 127, torch.int8), q

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 4, generator=generator), torch.randn(2, 4, 5, generator=generator)
    artifact = export_to_stablehlo(QuantizedBmm(), (a, b))
    (dot,) = quant_op_lines(artifact.stablehlo_text, "dot_general")
    assert "batching_dims = [0] x [0]" in dot and "!quant.uniform<i32:f32, " in dot
    (dequantized, q), (want_dequantized, want_q) = artifact(a, b), QuantizedBmm()(a, b)
    assert steps_off(dequantized, want_dequantized, 0.05) <= 1
    assert q.dtype == torch.int8 and (q.int() - want_q.int()).abs().max() <= 1


def test_depthwise_and_dilated_convs_fuse():
    class Convs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.depthwise = torch.nn.Conv2d(4, 4, 3, groups=4, padding=1)
            self.dilated = torch.nn.Conv1d(4, 6, 3, dilation=2)

        def forward(self, x):
            return self.dilated(self.depthwise(x).flatten(2))

    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(0))
    model = pt2e_quantize(Convs().eval(), (x,), quantizer("xnnpack_per_channel"))
    artifact = export_to_stablehlo(model, (x,))
    convs = quant_op_lines(artifact.stablehlo_text, "convolution")
    assert len(convs) == 2 and "feature_group_count = 4" in convs[0]
    assert_within_one_step([artifact(x)], [model(x)], one_step_bounds(model))


def test_float_originals_dropped_when_an_input_is_named_like_a_builtin():
    """nn.Sequential's input is called ``input``; the program rebuilt without the unused float weights keeps
    its signature consistent."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = pt2e_quantize(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (x,))
    artifact = export_to_stablehlo(model, (x,))
    assert "0.weight" not in artifact.weights and artifact.signature.user_inputs[0].name == "input"
    assert_within_one_step([artifact(x)], [model(x)], one_step_bounds(model))
