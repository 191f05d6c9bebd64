"""Quantized zoo entries: the MLP, the small CNN and one transformer block, statically quantized with pt2e
(torchao's XNNPACK quantizer: int8 activations, per-channel symmetric int8 weights) and calibrated on seeded
batches. The model an entry builds is the pt2e-converted GraphModule, so its golden is that model run by torch.

Quantized outputs are compared in absolute terms: the artifact may differ from torch by one output
quantization step (the scale of the last dequantize) where a value lands within float rounding (or, fused,
within the bias's rounding to the int32 accumulator) of a half step and rounds the other way.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from torch_stablehlo.quantize.schemes import DEQUANTIZE

from .zoo import CNN, MLP, SEED, Built, example_generator, randomize_batchnorm, register, seeded_model

CALIBRATION_BATCHES = 8


class TransformerBlock(nn.Module):
    """Pre-norm block: causal self-attention (SDPA) and a GELU MLP, each with a residual connection."""

    def __init__(self, width: int = 32, heads: int = 4, hidden: int = 64):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        batch, length, width = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, width))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def output_steps(model: torch.fx.GraphModule) -> list[float | None]:
    """One quantization step per output of a pt2e-converted model: the scale of the dequantize that makes
    it (None for an output that is not dequantized per tensor)."""
    outputs = next(n for n in model.graph.nodes if n.op == "output").args[0]
    return [float(n.args[1]) if isinstance(n, torch.fx.Node) and n.target in DEQUANTIZE else None
            for n in outputs]


def pt2e_quantize(model: nn.Module, args: tuple, quantizer=None) -> torch.fx.GraphModule:
    """``model`` exported, prepared with ``quantizer`` (default: XNNPACK, per-channel int8 weights),
    calibrated on ``args`` and seeded batches like them, and converted."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    if quantizer is None:
        with warnings.catch_warnings():  # torchao deprecates it for ExecuTorch's copy; the quantizer is the same
            warnings.filterwarnings("ignore", message="XNNPACKQuantizer is deprecated")
            quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    # without the input-shape guards of the static export (batch == 4), so that the converted model can be
    # exported again with a dynamic batch (tests/quantize/test_dynamic_batch.py)
    prepared = prepare_pt2e(torch.export.export(model, tuple(args)).module(check_guards=False), quantizer)
    calibration = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        prepared(*args)
        for _ in range(CALIBRATION_BATCHES):
            prepared(*(torch.randn(a.shape, generator=calibration) for a in args))
    return convert_pt2e(prepared)


def _quantized_entry(model: nn.Module, example: torch.Tensor) -> Built:
    converted = pt2e_quantize(model, (example,))
    steps = output_steps(converted)
    if None in steps:
        raise ValueError("every output of a quantized zoo model must come from a per-tensor dequantize")
    return Built(converted, (example,), abs_tolerance=max(steps))


@register("mlp_int8", tags=("torch", "small", "quantized"),
          description="the mlp entry, pt2e static int8 (XNNPACK quantizer, per-channel weights)")
def _mlp_int8() -> Built:
    return _quantized_entry(seeded_model(MLP), torch.randn(4, 16, generator=example_generator()))


@register("cnn_int8", tags=("torch", "small", "conv", "quantized"),
          description="the cnn entry (BatchNorm folded into the convs), pt2e static int8")
def _cnn_int8() -> Built:
    def build():
        model = CNN()
        randomize_batchnorm(model)
        return model

    return _quantized_entry(seeded_model(build), torch.randn(2, 3, 32, 32, generator=example_generator()))


@register("transformer_block_int8", tags=("torch", "small", "attention", "sdpa", "quantized"),
          description="pre-norm transformer block (causal SDPA, GELU MLP), pt2e static int8 linears and adds")
def _transformer_block_int8() -> Built:
    return _quantized_entry(seeded_model(TransformerBlock), torch.randn(2, 8, 32, generator=example_generator()))
