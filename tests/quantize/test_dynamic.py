"""Scales known only at run time (pt2e dynamic quantization, choose_qparams) become integer math; static weight
schemes stay quant types, including torchao weight-only int8."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden.quantized_zoo import pt2e_quantize

from .support import linear_conv_inputs, linear_conv_model, quant_op_lines, quantizer

qd = torch.ops.quantized_decomposed


@pytest.mark.parametrize("kind", ["xnnpack_dynamic", "x86_dynamic"])
def test_dynamic_activations_are_integer_math_and_weights_quant_types(kind):
    args = linear_conv_inputs()
    model = pt2e_quantize(linear_conv_model(), args, quantizer(kind))
    assert any(n.target == qd.choose_qparams.tensor for n in model.graph.nodes)
    sample = linear_conv_inputs(seed=5)
    with torch.no_grad():
        expected = model(*sample)
    for form in ("fused", "unfused"):
        artifact = export_to_stablehlo(model, args, quantized_ops=form)
        text = artifact.stablehlo_text
        assert "custom_call" not in text
        assert "stablehlo.round_nearest_even" in text  # quantize with a run-time scale
        # per-channel int8 weights: a quant type, dequantized (unfused) or in a float x int8 product (fused)
        assert "x!quant.uniform<i8" in text and ":f32:0, {" in text
        if form == "fused":
            assert len(quant_op_lines(text, "dot_general")) == 2
        torch.testing.assert_close(artifact(*sample), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype, low, high", [(torch.int8, -128, 127), (torch.uint8, 0, 255)])
def test_choose_qparams_matches_torch(dtype, low, high):
    class Dynamic(torch.nn.Module):
        def forward(self, x):
            scale, zero_point = qd.choose_qparams.tensor(x, low, high, 1e-5, dtype)
            sym_scale, sym_zero_point = qd.choose_qparams_symmetric.tensor(x, low, high, 1e-5, dtype)
            q = qd.quantize_per_tensor.tensor(x, scale, zero_point, low, high, dtype)
            return scale, zero_point, sym_scale, sym_zero_point, q, \
                qd.dequantize_per_tensor.tensor(q, scale, zero_point, low, high, dtype)

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 3 + 1
    artifact = export_to_stablehlo(Dynamic(), (x,))
    for sample in (x, x.abs() + 0.5, -x.abs()):  # mixed signs, all positive, all negative
        scale, zero_point, sym_scale, sym_zero_point, q, dq = artifact(sample)
        want = Dynamic()(sample)
        # XLA divides by a constant as a multiply by its reciprocal: the float32 scale may be 1 ulp off
        torch.testing.assert_close(scale, want[0], rtol=2 ** -23, atol=0)
        torch.testing.assert_close(sym_scale, want[2], rtol=2 ** -23, atol=0)
        assert torch.equal(zero_point, want[1]) and torch.equal(sym_zero_point, want[3])
        assert q.dtype == dtype and (q.int() - want[4].int()).abs().max() <= 1
        assert float((dq - want[5]).abs().max()) <= float(want[0]) * (1 + 2 ** -20)


def test_torchao_weight_only_int8():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(3, 8)
    for form in ("fused", "unfused"):
        artifact = export_to_stablehlo(model, (x,), quantized_ops=form)
        int8 = [w for w in artifact.weights.values() if w.dtype == torch.int8]
        assert [tuple(w.shape) for w in int8] == [(16, 8), (4, 16)]
        assert not any(w.dtype == torch.float32 and w.dim() == 2 for w in artifact.weights.values())
        text = artifact.stablehlo_text
        assert "x!quant.uniform<i8:f32:0, {" in text and "custom_call" not in text
        if form == "fused":  # float activations x int8 weights: the hybrid (weight-only) dot_general
            assert len(quant_op_lines(text, "dot_general")) == 2
        torch.testing.assert_close(artifact(x), model(x))
    assert type(model[0].weight).__name__ == "Int8Tensor"  # the model itself is left as it was
