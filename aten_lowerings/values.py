"""MLIR values as rules see them: a value's type, static dims, rank and torch dtype, the op that produced it,
and the module and function being built at the current insertion point."""
from __future__ import annotations

import torch
from jaxlib.mlir import ir

from .mlir_types import element_type, torch_dtype


def value_type(value: ir.Value) -> ir.RankedTensorType:
    return ir.RankedTensorType(value.type)


def static_shape(value: ir.Value) -> list[int]:
    """Dims of a value's type; dynamic dims are ``mlir_types.DYNAMIC``."""
    return list(value_type(value).shape)


def rank(value: ir.Value) -> int:
    return value_type(value).rank


def dtype_of(value: ir.Value) -> torch.dtype:
    return torch_dtype(value_type(value).element_type)


def with_dtype(value: ir.Value, dtype: torch.dtype) -> ir.RankedTensorType:
    """``value``'s type with the element type of ``dtype``."""
    return ir.RankedTensorType.get(static_shape(value), element_type(dtype))


def producer(value: ir.Value) -> ir.Operation | None:
    """The op whose result ``value`` is (None for a block argument)."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def enclosing_module() -> ir.Operation:
    """The ``builtin.module`` being built at the current insertion point (where rules add private functions)."""
    return _enclosing("builtin.module")


def enclosing_function() -> ir.Operation:
    """The ``func.func`` being built at the current insertion point (``@main``, or a private function)."""
    return _enclosing("func.func")


def _enclosing(name: str) -> ir.Operation:
    operation = ir.InsertionPoint.current.block.owner.operation
    while operation.name != name:
        operation = operation.parent
    return operation
