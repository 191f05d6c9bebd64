"""``scan_layers``: a stack of identical blocks run as one torch ``scan`` over their stacked weights, PyTorch/XLA's
``scan_layers``. The exported program then holds the block once, in one ``stablehlo.while``, however deep the
model is: its size and XLA's compile time stay flat in depth (``bench/unrolled_vs_scanned.py``)."""
from __future__ import annotations

import torch
from torch import nn
from torch._higher_order_ops.scan import scan


def scan_layers(layers: nn.ModuleList, x, *args):
    """``for layer in layers: x = layer(x, *args)``, as one scan: step ``i`` runs the first layer's code with the
    ``i``-th layer's parameters and buffers (``torch.func.functional_call``), so the numerics are the loop's.

    The layers must have the same tensors (names, shapes and dtypes); ``x`` (a tensor or a pytree of them) is
    carried from layer to layer and keeps its shapes; ``args`` (masks, positions) go to every layer unchanged.
    Raises ValueError for an empty stack or layers that differ.
    """
    layers = list(layers)
    if not layers:
        raise ValueError("scan_layers needs at least one layer")
    tensors = [_tensors(layer) for layer in layers]
    for index, own in enumerate(tensors[1:], start=1):
        if _described(own) != _described(tensors[0]):
            raise ValueError(f"scan_layers needs identical layers: layer {index} ({type(layers[index]).__name__}) "
                             f"has tensors {_described(own)}, layer 0 {_described(tensors[0])}")
    stacked = {name: torch.stack([own[name] for own in tensors]) for name in tensors[0]}

    def step(carry, weights):
        return torch.func.functional_call(layers[0], weights, (carry, *args)), ()

    return scan(step, x, stacked)[0]


def _tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def _described(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [f"{name}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for name, t in tensors.items()]
