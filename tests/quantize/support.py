"""Shared by the quantization tests: quantizers by name, small models, and checks on the emitted StableHLO."""
from __future__ import annotations

import re
import warnings

import torch
from torch import nn

from torch_stablehlo.golden.quantized_zoo import output_steps

QUANT_TYPE = re.compile(r"!quant\.uniform<")


def quantizer(kind: str):
    """torchao's pt2e quantizers: XNNPACK (int8, symmetric weights) and X86 Inductor (uint8 activations)."""
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    if kind.startswith("xnnpack"):
        config = get_symmetric_quantization_config(is_per_channel="per_tensor" not in kind,
                                                   is_dynamic="dynamic" in kind)
        with warnings.catch_warnings():  # deprecated in favour of ExecuTorch's copy of the same quantizer
            warnings.filterwarnings("ignore", message="XNNPACKQuantizer is deprecated")
            return XNNPACKQuantizer().set_global(config)
    return x86.X86InductorQuantizer().set_global(
        x86.get_default_x86_inductor_quantization_config(is_dynamic="dynamic" in kind))


class LinearConv(nn.Module):
    """linear -> relu -> linear on one input, a strided, padded conv -> relu on the other."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 6)
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x, image):
        return self.fc2(self.fc1(x).relu()), self.conv(image).relu()


def linear_conv_model() -> LinearConv:
    torch.manual_seed(0)
    return LinearConv().eval()


def linear_conv_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=generator), torch.randn(2, 3, 9, 9, generator=generator)


def quant_op_lines(text: str, op: str) -> list[str]:
    """Lines of ``text`` where ``stablehlo.<op>`` takes or returns a ``!quant.uniform`` type."""
    pattern = re.compile(rf"stablehlo\.{op}\b")
    return [line for line in text.splitlines() if pattern.search(line) and QUANT_TYPE.search(line)]


def assert_real_quant_ops(text: str) -> None:
    """uniform_quantize/uniform_dequantize on !quant.uniform types, and nothing standing in for them."""
    assert quant_op_lines(text, "uniform_quantize") and quant_op_lines(text, "uniform_dequantize")
    assert "custom_call" not in text


def steps_off(actual: torch.Tensor, expected: torch.Tensor, step: float) -> float:
    """Largest difference in quantization steps."""
    return float((actual.double() - expected.double()).abs().max()) / step


def one_step_bounds(model: torch.fx.GraphModule) -> list[float]:
    """What "within one quantization step" allows for each output of a converted model: the output's step when
    it is dequantized; for a float output of a product (X86 leaves those unquantized, e.g. linear [-> relu]),
    one step of the product's quantized input through its dequantized weight (the largest L1 norm of a row)."""
    outputs = next(n for n in model.graph.nodes if n.op == "output").args[0]
    bounds = []
    for node, step in zip(outputs, output_steps(model)):
        if step is None:
            product = node.args[0] if node.target == torch.ops.aten.relu.default else node
            step_in = float(product.args[0].args[1])
            weight = product.args[1]
            tensors = [getattr(model, a.target) if isinstance(a, torch.fx.Node) else a for a in weight.args]
            step = step_in * float(weight.target(*tensors).abs().flatten(1).sum(1).max())
        bounds.append(step)
    return bounds


def assert_within_one_step(actual, expected, bounds: list[float]) -> None:
    for got, want, bound in zip(actual, expected, bounds):
        assert float((got.double() - want.double()).abs().max()) <= bound * (1 + 1e-6)
