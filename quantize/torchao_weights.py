"""torchao weight-only int8 (``quantize_(model, Int8WeightOnlyConfig())``) in the form pt2e produces.

torchao keeps such weights as ``Int8Tensor`` subclass parameters, which torch.export lifts as subclass
inputs. ``plain_quantized_weights`` gives a copy of the model whose weights are the int8 data, scale and zero
point as plain parameters, dequantized in the forward with ``quantized_decomposed.dequantize_per_channel``
(per-tensor: ``dequantize_per_tensor.tensor``): the static scheme the rest of ``quantize`` converts.
"""
from __future__ import annotations

import copy

import torch
from torch.nn.utils import parametrize

from .schemes import UnsupportedQuantizationError, qd


class _Dequantize(torch.nn.Module):
    """Parametrization: int8 data, scale and zero point -> the float weight."""

    def __init__(self, axis: int | None, qmin: int, qmax: int, dtype: torch.dtype):
        super().__init__()
        self.axis, self.qmin, self.qmax, self.dtype = axis, qmin, qmax, dtype

    def forward(self, qdata, scale, zero_point):
        if self.axis is None:
            return qd.dequantize_per_tensor.tensor(qdata, scale, zero_point, self.qmin, self.qmax, torch.int8,
                                                   out_dtype=self.dtype)
        return qd.dequantize_per_channel(qdata, scale, zero_point, self.axis, self.qmin, self.qmax, torch.int8,
                                         out_dtype=self.dtype)

    def right_inverse(self, weight):
        return [weight.qdata, weight.scale.reshape(-1), weight.zero_point.reshape(-1).to(torch.int64)]


def _is_subclass(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and type(tensor) not in (torch.Tensor, torch.nn.Parameter) \
        and hasattr(tensor, "__tensor_flatten__")


def _parametrization(name: str, weight) -> _Dequantize:
    kind = type(weight).__name__
    if kind != "Int8Tensor" or getattr(weight, "act_quant_kwargs", None) is not None:
        scheme = f"torchao {kind}" + (" with dynamic activation quantization" if kind == "Int8Tensor" else "")
        raise UnsupportedQuantizationError(
            f"weight '{name}'", scheme, "not converted; torchao weight-only int8 (Int8WeightOnlyConfig) is, and "
            "pt2e dynamic quantization covers dynamic activations")
    shape, block = list(weight.qdata.shape), list(weight.block_size)
    per_axis = [d for d, (size, b) in enumerate(zip(shape, block)) if b != size]
    if block == shape:
        axis = None
    elif len(per_axis) == 1 and block[per_axis[0]] == 1:
        axis = per_axis[0]
    else:
        raise UnsupportedQuantizationError(
            f"weight '{name}'", f"torchao Int8Tensor with block size {block} for shape {shape}",
            "block-wise (sub-channel) quantization has no StableHLO quantized type")
    qmin, qmax = (-64, 63) if weight.reduce_range else (-128, 127)
    return _Dequantize(axis, qmin, qmax, weight.dtype)


def plain_quantized_weights(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself when it has no tensor-subclass parameters, else a copy with them made plain."""
    names = [name for name, p in model.named_parameters(remove_duplicate=False) if _is_subclass(p)]
    if not names:
        return model
    model = copy.deepcopy(model)
    for name in names:
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        dequantize = _parametrization(name, getattr(owner, attribute))
        parametrize.register_parametrization(owner, attribute, dequantize, unsafe=True)
    return model
