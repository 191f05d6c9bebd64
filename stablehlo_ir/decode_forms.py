"""Forms chosen once a call's sizes are known: rewrites of the refined module (``refine.refine_shapes``) that XLA
compiles, where a size that was symbolic at conversion is now a number (the portable module stays as converted).

- A ``scatter`` that writes one window and replaces what is there (``index_copy`` or ``index_put`` of one index, as
  a decoder writes one token into a static KV cache when its prompt dim was exported dynamic) becomes a
  ``dynamic_update_slice`` at that index: the form a static one-token program is converted to, which XLA updates
  in place (its scatter of one row inside a donated cache copies it whole). An index out of bounds, which torch
  refuses, then writes the window clamped into bounds, as the static program's does, where the scatter wrote
  nothing.
"""
from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .rewrites import ops_where


def rewrite_decode_forms(module: ir.Module) -> int:
    """Rewrite, in place, the ops of the refined ``module`` described above; how many were."""
    scatters = ops_where(module, lambda op: op.name == "stablehlo.scatter")
    with module.context:
        return sum(_one_window_scatter(op) for op in scatters)


def _one_window_scatter(op) -> bool:
    if len(op.operands) != 3 or not all(ir.RankedTensorType(v.type).has_static_shape
                                        for v in (*op.operands, op.results[0])):
        return False
    operand, indices, updates = op.operands
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    index_shape = ir.RankedTensorType(indices.type).shape
    vector_dim = numbers.index_vector_dim
    vector = index_shape[vector_dim] if vector_dim < len(index_shape) else 1
    if (math.prod(index_shape) != vector or numbers.input_batching_dims or not _replaces(op)
            or len(numbers.scattered_dims_to_operand_dims) != vector):
        return False
    operand_type = ir.RankedTensorType(operand.type)
    update_shape = ir.RankedTensorType(updates.type).shape
    window = iter(update_shape[d] for d in numbers.update_window_dims)
    window_shape = [1 if d in numbers.inserted_window_dims else next(window) for d in range(operand_type.rank)]
    with ir.InsertionPoint(op), op.location:
        index_type = ir.RankedTensorType(indices.type).element_type
        flat = stablehlo.reshape(ir.RankedTensorType.get([vector], index_type), indices)
        scalar = ir.RankedTensorType.get([], index_type)
        starts = [stablehlo.constant(ir.DenseElementsAttr.get(np.zeros((), np.int64 if index_type.width == 64
                                                                        else np.int32), type=scalar))
                  for _ in range(operand_type.rank)]
        for position, dim in enumerate(numbers.scattered_dims_to_operand_dims):
            element = stablehlo.slice(flat, [position], [position + 1], [1])
            starts[dim] = stablehlo.reshape(scalar, element)
        window_value = stablehlo.reshape(ir.RankedTensorType.get(window_shape, operand_type.element_type), updates)
        written = stablehlo.dynamic_update_slice(operand, window_value, starts)
    op.results[0].replace_all_uses_with(written)
    op.erase()
    return True


def _replaces(op) -> bool:
    """Whether the scatter's update computation returns the update (its second argument) as it is."""
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    return len(body) == 1 and body[0].name == "stablehlo.return" and len(body[0].operands) == 1 \
        and body[0].operands[0] == block.arguments[1]
