"""The decode step's one-column writes (the KV cache at the cursor, the next token) as ``dynamic_update_slice``.

The walk lowers ``index_copy`` to ``stablehlo.scatter``. XLA turns a one-index scatter into a
``dynamic_update_slice`` guarded by a ``select`` on the index being in range (scatter skips out-of-range writes),
and that guard keeps it from updating the loop's cache in place: every step copied each cache tensor several
times. A plain ``dynamic_update_slice`` is updated in place. It clamps an out-of-range start where scatter would
skip, so the two agree only on in-range columns: in a generate program every column written is below
``max_cache_len`` (``GenerateArtifact`` refuses prompts longer than ``max_cache_len - max_new_tokens``).
"""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo


def one_column_writes_as_update_slices(function) -> int:
    """Replace each scatter in ``function`` that writes one slice at one index, replacing what is there, with a
    ``dynamic_update_slice``; returns how many were replaced."""
    scatters = []

    def visit(op):
        if op.name == "stablehlo.scatter" and _one_slice_dim(op.opview) is not None:
            scatters.append(op.opview)
        return ir.WalkResult.ADVANCE

    function.operation.walk(visit)
    for scatter in scatters:
        _replace(scatter, _one_slice_dim(scatter))
    return len(scatters)


def _one_slice_dim(scatter) -> int | None:
    """The operand dim a scatter writes one slice along (its update window covering every other dim, one index,
    the update replacing the old value), else None."""
    if len(scatter.inputs) != 1:
        return None
    numbers = stablehlo.ScatterDimensionNumbers(scatter.scatter_dimension_numbers)
    operand = ir.RankedTensorType(scatter.inputs[0].type)
    indices = ir.RankedTensorType(scatter.scatter_indices.type)
    update = ir.RankedTensorType(scatter.updates[0].type)
    dims = list(numbers.scattered_dims_to_operand_dims)
    if (len(dims) != 1 or list(numbers.inserted_window_dims) != dims or numbers.input_batching_dims
            or indices.shape not in ([1], [1, 1]) or numbers.index_vector_dim != 1 or update.rank != operand.rank
            or list(numbers.update_window_dims) != [d for d in range(operand.rank) if d != dims[0]]
            or update.shape[dims[0]] != 1 or not _replaces(scatter)):
        return None
    return dims[0]


def _replaces(scatter) -> bool:
    """Whether the scatter's combiner returns the update (its second argument) unchanged."""
    block = scatter.update_computation.blocks[0]
    terminator = list(block.operations)[-1]
    return len(list(block.operations)) == 1 and terminator.operands[0] == block.arguments[1]


def _replace(scatter, dim: int) -> None:
    operand, update = scatter.inputs[0], scatter.updates[0]
    with ir.InsertionPoint(scatter), scatter.location:
        index_type = ir.RankedTensorType(scatter.scatter_indices.type).element_type
        index = stablehlo.reshape(ir.RankedTensorType.get([], index_type), scatter.scatter_indices)
        zero = stablehlo.constant(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], index_type),
                                                                 ir.IntegerAttr.get(index_type, 0)))
        starts = [index if d == dim else zero for d in range(ir.RankedTensorType(operand.type).rank)]
        written = stablehlo.dynamic_update_slice(operand, update, starts)
    scatter.results[0].replace_all_uses_with(written)
    scatter.operation.erase()
