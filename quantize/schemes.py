"""Quantization schemes of torch's ``quantized_decomposed`` ops, read from FX nodes, and the check that
StableHLO's ``!quant.uniform`` types can express them."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the quantized_decomposed ops)

qd = torch.ops.quantized_decomposed

# (de)quantize overloads with a per-tensor or per-axis scheme; ``.tensor`` ones take 1-element tensors
QUANTIZE = (qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor, qd.quantize_per_channel.default)
DEQUANTIZE = (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor, qd.dequantize_per_channel.default)
# scales computed at run time (dynamic quantization)
CHOOSE_QPARAMS = (qd.choose_qparams.tensor, qd.choose_qparams_symmetric.tensor)
PER_CHANNEL = (qd.quantize_per_channel.default, qd.dequantize_per_channel.default)

# storage dtypes a !quant.uniform type can have, with their StableHLO spelling
STORAGE_TYPES = {torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32"}

SCHEME = "quant_scheme"  # FX node.meta key: the static QuantScheme of a (de)quantize node


class UnsupportedQuantizationError(ValueError):
    """A quantization scheme StableHLO cannot express; names where it is (a node, a weight) and the scheme."""

    def __init__(self, where: str, scheme: str, reason: str):
        self.where, self.scheme = where, scheme
        super().__init__(f"{where}: {scheme}: {reason}. StableHLO quantized types are per-tensor or per-axis "
                         f"with integer storage ({', '.join(str(d).removeprefix('torch.') for d in STORAGE_TYPES)})"
                         f" and integer zero points in the storage range")


@dataclass(frozen=True)
class QuantScheme:
    """``q = clamp(round(x / scale) + zero_point, qmin, qmax)`` stored as ``storage``; one scale and zero
    point (``axis`` None) or one per index of ``axis``."""
    storage: torch.dtype
    qmin: int
    qmax: int
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int | None = None

    @property
    def symmetric(self) -> bool:
        return not any(self.zero_points)

    def with_axis(self, axis: int | None) -> "QuantScheme":
        return replace(self, axis=axis)

    # torch's semantics, with the quantized_decomposed ops
    def quantize(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.axis is None:
            return qd.quantize_per_tensor(tensor, self.scales[0], self.zero_points[0], self.qmin, self.qmax,
                                          self.storage)
        return qd.quantize_per_channel(tensor, torch.tensor(self.scales), torch.tensor(self.zero_points),
                                       self.axis, self.qmin, self.qmax, self.storage)

    def dequantize(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.axis is None:
            return qd.dequantize_per_tensor(tensor, self.scales[0], self.zero_points[0], self.qmin, self.qmax,
                                            self.storage)
        return qd.dequantize_per_channel(tensor, torch.tensor(self.scales), torch.tensor(self.zero_points),
                                         self.axis, self.qmin, self.qmax, self.storage)


def _where(node: torch.fx.Node) -> str:
    return f"node '{node.name}' ({node.target})"


def static_scheme(node: torch.fx.Node) -> "QuantScheme | None":
    """The scheme ``quantize.preparation.lowering_graph`` found for a (de)quantize node; None when it is dynamic."""
    return node.meta.get(SCHEME)


def is_quantization_op(target) -> bool:
    """Any op of torch's quantized_decomposed library or torchao's affine quantization primitives."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = target.__name__
    return target.namespace == "quantized_decomposed" or (
        target.namespace == "torchao" and ("quantize" in name or "qparams" in name))


def is_affine_math(target) -> bool:
    """torchao's affine quantization primitives (``choose_qparams_affine``, ``quantize_affine``,
    ``dequantize_affine``, any block size): torch's own decomposition into ATen math, which the conversion runs
    (float and integer ops, no quant types)."""
    return target.namespace == "torchao" and target._can_decompose()


def check_supported(node: torch.fx.Node) -> None:
    """Raise for quantization ops whose granularity StableHLO cannot express (groups, tokens, blocks) and that
    do not decompose into ATen math."""
    if node.target in QUANTIZE + DEQUANTIZE + CHOOSE_QPARAMS or is_affine_math(node.target):
        return
    name = node.target.__name__
    arguments = {**dict(zip((a.name for a in node.target._schema.arguments), node.args)), **node.kwargs}
    reason = "this granularity has no StableHLO quantized type"
    if "group" in name:
        scheme = f"group-wise (sub-channel) quantization with group size {arguments.get('group_size')}"
    elif "token" in name:
        scheme = "per-token quantization (a scale per row, computed at run time)"
    elif "block_size" in arguments:
        scheme = f"block-wise quantization with block size {list(arguments['block_size'])}"
    else:
        scheme, reason = f"'{name}'", "this quantization op has no StableHLO conversion"
    raise UnsupportedQuantizationError(_where(node), scheme, reason)


def scheme_of(node: torch.fx.Node, static_value: Callable[[object], object]) -> QuantScheme | None:
    """The static scheme of a (de)quantize node, or None when its scale or zero point is computed at run time.

    ``static_value(arg)`` is the value of an argument known at export (a number, a weight's tensor) or None.
    Raises ``UnsupportedQuantizationError`` for schemes no ``!quant.uniform`` type can hold.
    """
    per_channel = node.target in PER_CHANNEL
    if per_channel:
        _, scales, zero_points, axis, qmin, qmax, dtype = node.args[:7]
    else:
        _, scales, zero_points, qmin, qmax, dtype = node.args[:6]
        axis = None
    label = f"{str(dtype).removeprefix('torch.')} {'per-channel' if per_channel else 'per-tensor'}"

    def unsupported(reason: str) -> UnsupportedQuantizationError:
        return UnsupportedQuantizationError(_where(node), label, reason)

    if dtype not in STORAGE_TYPES:
        raise unsupported(f"storage dtype {dtype} is not an integer storage type")
    info = torch.iinfo(dtype)
    if not info.min <= qmin < qmax <= info.max:
        raise unsupported(f"range [{qmin}, {qmax}] does not fit {dtype}")
    scales, zero_points = static_value(scales), static_value(zero_points)
    if scales is None or (zero_points is None and node.args[2] is not None):
        return None
    scales = _floats(scales)
    zero_points = [0] * len(scales) if zero_points is None else _floats(zero_points)
    if any(not math.isfinite(s) or s <= 0 for s in scales):
        raise unsupported(f"scales must be positive and finite, got {scales[:8]}")
    if any(z != int(z) or not qmin <= z <= qmax for z in zero_points):
        raise unsupported(f"zero points must be integers in [{qmin}, {qmax}], got {zero_points[:8]}")
    if per_channel:
        shape = node.args[0].meta["val"].shape
        if not len(scales) == len(zero_points) == shape[axis]:
            raise unsupported(f"{len(scales)} scales and {len(zero_points)} zero points for {shape[axis]} "
                              f"channels on axis {axis}")
        axis %= len(shape)
    elif len(scales) != 1:
        raise unsupported(f"{len(scales)} scales for a per-tensor scheme")
    return QuantScheme(dtype, int(qmin), int(qmax), tuple(scales), tuple(int(z) for z in zero_points), axis)


def _floats(value) -> list[float]:
    return [float(v) for v in torch.as_tensor(value, dtype=torch.float64).reshape(-1)]
