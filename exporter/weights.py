"""Weights shared by several names (tied weights): found once, stored and placed once."""
from __future__ import annotations

import torch


def alias_map(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """Map each weight name to the first name holding the same tensor view (tied weights)."""
    first_by_view: dict[tuple, str] = {}
    result = {}
    for name, tensor in weights.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tuple(tensor.stride()), tensor.dtype)
        result[name] = first_by_view.setdefault(view, name)
    return result


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
