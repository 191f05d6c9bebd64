"""Checks run before anything executes: count, dtype and shape of each input."""
from __future__ import annotations

from typing import Sequence

import torch

from torch_stablehlo.stablehlo_ir.specs import TensorSpec


class InputError(ValueError):
    """An input does not match the signature; the message names it and what was expected."""


def validate_inputs(specs: Sequence[TensorSpec], values: Sequence) -> None:
    if len(values) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InputError(f"expected {len(specs)} tensor input(s) ({names}), got {len(values)}")
    for spec, value in zip(specs, values):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"input '{spec.name}': expected a torch.Tensor of dtype {spec.dtype} "
                             f"and shape {_shape_text(spec.shape)}, got {type(value).__name__}")
        if value.dtype != spec.torch_dtype:
            raise InputError(f"input '{spec.name}': expected dtype {spec.dtype}, got "
                             f"{str(value.dtype).removeprefix('torch.')}")
        if value.dim() != len(spec.shape) or any(
                isinstance(want, int) and want != got for want, got in zip(spec.shape, value.shape)):
            raise InputError(f"input '{spec.name}': expected shape {_shape_text(spec.shape)}, "
                             f"got {list(value.shape)}")


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
