"""Tensor specs shared by the signature (exporter) and input validation (runtime)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from torch_stablehlo.size_exprs import integer_expr

from .dtypes import ELEMENT_TYPES

Dim = Union[int, str]  # a static size, or the name of a symbolic dim ("s0", "2*s0")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


DTYPES_BY_NAME = {dtype_name(d): d for d in ELEMENT_TYPES}
"""Every dtype a spec may name (those with a StableHLO element type)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str            # torch dtype name, e.g. "float32"
    shape: tuple[Dim, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    @classmethod
    def from_meta(cls, name: str, meta: torch.Tensor) -> "TensorSpec":
        return cls(name, dtype_name(meta.dtype), tuple(_dim(d) for d in meta.shape))

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict) -> "TensorSpec":
        return cls(data["name"], data["dtype"], tuple(data["shape"]))


def _dim(size) -> Dim:
    if isinstance(size, int):
        return size
    pinned = size.node.maybe_as_int()
    return pinned if pinned is not None else str(integer_expr(size.node.expr))
