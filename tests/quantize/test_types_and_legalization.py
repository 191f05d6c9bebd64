"""!quant.uniform types from schemes, the legalization PJRT needs (on a copy), asymmetric per-channel
schemes, and the list of ops with a quantized lowering."""
import numpy as np
import torch

from torch_stablehlo.aten_lowerings.registry import lowering_for
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.quantize import QuantScheme, quantized_lowerings
from torch_stablehlo.quantize.fusion import FUSIBLE
from torch_stablehlo.quantize.schemes import CHOOSE_QPARAMS, DEQUANTIZE, QUANTIZE
from torch_stablehlo.quantize.types import quant_element_type
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla

from .support import quant_op_lines

qd = torch.ops.quantized_decomposed


def test_quant_types_spell_range_axis_and_exact_scales():
    with make_context():
        per_axis = quant_element_type(QuantScheme(torch.uint8, 0, 255, (0.5, 1e-05), (3, 4), axis=1))
        assert str(per_axis) == "!quant.uniform<u8:f32:1, {5.000000e-01:3,1.000000e-05:4}>"
        for scale in (0.1 + 2 ** -40, 1e-05, 3.0):  # all 53 bits; repr without a '.'
            narrow = quant_element_type(QuantScheme(torch.int8, -127, 127, (scale,), (0,)))
            assert str(narrow).startswith("!quant.uniform<i8<-127:127>:f32, ")
            assert float(str(narrow).split(", ")[1].rstrip(">")) == scale


def test_prepare_for_xla_is_free_without_quant_types():
    text = export_to_stablehlo(torch.nn.Linear(2, 3), (torch.randn(1, 2),)).stablehlo_text
    assert prepare_for_xla(text) is text


def test_unsigned_per_axis_storage_legalizes_exactly():
    """u8 storage (which the upstream pass would read as signed) and per-axis scales (whose broadcasts the
    chlo legalization rejects), dequantized on PJRT."""
    quant = "!quant.uniform<u8:f32:1, {5.000000e-01:3,2.500000e-01:200}>"
    text = f"""func.func @main(%q: tensor<3x2xui8>) -> tensor<3x2xf32> {{
      %0 = stablehlo.bitcast_convert %q : (tensor<3x2xui8>) -> tensor<3x2x{quant}>
      %1 = stablehlo.uniform_dequantize %0 : (tensor<3x2x{quant}>) -> tensor<3x2xf32>
      return %1 : tensor<3x2xf32>
    }}"""
    legal = prepare_for_xla(text)
    assert "quant" not in legal and "chlo" not in legal
    q = np.array([[0, 255], [3, 200], [130, 17]], dtype=np.uint8)
    executable = pjrt.Executable(text)
    (actual,) = executable.execute(executable.put([q]))
    np.testing.assert_array_equal(actual, (q.astype(np.float32) - [3, 200]) * [0.5, 0.25])


def test_asymmetric_per_channel_weights_convert_and_stay_unfused():
    """Per-channel zero points != 0 (asymmetric weights): StableHLO products need symmetric rhs, so the fused
    form keeps dequantize -> float linear; both match torch."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-100, 100, (6, 8), dtype=torch.int8, generator=generator)
    scales, zero_points = torch.rand(6, generator=generator) / 50 + 0.01, torch.arange(-3, 3)

    class Asymmetric(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, value in dict(weight=weight, scales=scales, zero_points=zero_points).items():
                self.register_buffer(name, value)

        def forward(self, x):
            x = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.02, 5, -128, 127, torch.int8),
                                         0.02, 5, -128, 127, torch.int8)
            w = qd.dequantize_per_channel(self.weight, self.scales, self.zero_points, 0, -128, 127, torch.int8)
            return torch.nn.functional.linear(x, w)

    x = torch.randn(3, 8, generator=generator)
    for form in ("fused", "unfused"):
        artifact = export_to_stablehlo(Asymmetric(), (x,), quantized_ops=form)
        assert ":f32:0, {" in artifact.stablehlo_text and not quant_op_lines(artifact.stablehlo_text, "dot_general")
        torch.testing.assert_close(artifact(x), Asymmetric()(x), rtol=0, atol=1e-6)


def test_quantized_lowerings_lists_every_op_with_a_quantized_rule():
    listed = quantized_lowerings()
    for name in ("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.dequantize_per_channel."
                 "default", "quantized_decomposed.choose_qparams.tensor", "aten.linear.default",
                 "aten.conv2d.default", "aten.matmul.default"):
        assert name in listed
    assert "stablehlo.convolution" in listed["aten.conv2d.default"]
    quantization_ops = [*QUANTIZE, *DEQUANTIZE, *CHOOSE_QPARAMS]
    assert set(listed) == {str(op) for op in quantization_ops + list(FUSIBLE)}
    fused_ops = [fused for fused, _, _ in FUSIBLE.values()]
    assert all(lowering_for(op) is not None for op in quantization_ops + fused_ops)
