"""Schemes StableHLO's quantized types cannot express fail with an error naming the node (or weight) and the
scheme, before anything is lowered."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.quantize import UnsupportedQuantizationError

qd = torch.ops.quantized_decomposed


class Calls(torch.nn.Module):
    def __init__(self, fn, **buffers):
        super().__init__()
        self.fn = fn
        for name, value in buffers.items():
            self.register_buffer(name, value)

    def forward(self, x):
        return self.fn(self, x)


CASES = {
    "group-wise": (lambda m, x: qd.quantize_per_channel_group(x, m.scales, m.zero_points, -8, 7, torch.int8, 4),
                   dict(scales=torch.ones(4, 2), zero_points=torch.zeros(4, 2, dtype=torch.int32)),
                   r"node 'quantize_per_channel_group' .*group-wise \(sub-channel\) quantization with group size 4"),
    "per-token": (lambda m, x: qd.quantize_per_token(x, *qd.choose_qparams_per_token_asymmetric(x, torch.int8),
                                                     -128, 127, torch.int8),
                  {}, r"node 'choose_qparams_per_token_asymmetric' .*per-token quantization"),
    "float8 storage": (lambda m, x: qd.quantize_per_tensor(x, 0.1, 0, -448, 448, torch.float8_e4m3fn), {},
                       r"node 'quantize_per_tensor' .*float8_e4m3fn per-tensor: storage dtype "
                       r"torch.float8_e4m3fn is not an integer storage type"),
    "float zero points": (lambda m, x: qd.dequantize_per_channel(
        qd.quantize_per_channel(x, m.scales, m.zero_points, 1, -128, 127, torch.int8),
        m.scales, m.zero_points, 1, -128, 127, torch.int8),
        dict(scales=torch.full((8,), 0.1), zero_points=torch.full((8,), 0.5)),
        r"node 'quantize_per_channel' .*int8 per-channel: zero points must be integers in \[-128, 127\]"),
    "zero point out of range": (lambda m, x: qd.quantize_per_tensor(x, 0.1, 300, 0, 255, torch.uint8), {},
                                r"uint8 per-tensor: zero points must be integers in \[0, 255\], got \[300.0\]"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unsupported_scheme_names_node_and_scheme(case):
    fn, buffers, message = CASES[case]
    with pytest.raises(UnsupportedQuantizationError, match=message):
        export_to_stablehlo(Calls(fn, **buffers), (torch.randn(4, 8),))


def test_unknown_quantized_ops_form_is_an_error():
    with pytest.raises(ValueError, match=r"quantized_ops must be one of \('fused', 'unfused'\), got 'int8'"):
        export_to_stablehlo(torch.nn.Linear(2, 2), (torch.randn(1, 2),), quantized_ops="int8")
