"""Small float32 products of one row in the form XLA's CPU backend splits over its threads, applied to the
module XLA compiles on CPU (a copy: the artifact keeps torch's form).

A decoder step multiplies one row by each weight. XLA CPU hands a ``dot_general`` that contracts a weight's minor
dim (``x @ W.T``, ``W`` stored ``[out, in]`` as ``nn.Linear`` keeps it) to a library call, which runs the product
of a small weight on one thread; the same product through the weight's ``transpose`` becomes one of XLA's own
loops, split over the threads. Measured here, 2 threads, a chain of 600 products whose weights are read from
memory: 512 x 512 float32 75 us one way, 49 us the other; from about 3 MB (1536 x 512) the library call is as
fast or faster, so only smaller weights are rewritten. The row goes through an ``optimization_barrier``: XLA
would otherwise fuse the ops that make it into the loop, recomputing them for every output (attention's
epilogue before an output projection: 125 us instead of 50).
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

SMALL_WEIGHT_BYTES = 2 * 1024 ** 2  # rewritten up to this size; larger weights stay library calls


def has_float_products(mlir_text: str) -> bool:
    """A cheap test for modules that may hold a product ``rewrite_small_row_product`` rewrites."""
    return "xf32>" in mlir_text and "stablehlo.dot_general" in mlir_text


def rewrite_small_row_product(op) -> bool:
    """Rewrite, in place, a float32 ``dot_general`` of one row (static shapes, no batch dims) with a 2-d weight of
    at most ``SMALL_WEIGHT_BYTES`` whose minor dim is contracted, as the product with the weight's transpose;
    whether it was."""
    if not _small_row_product(op):
        return False
    _contract_major_dim(op)
    return True


def _small_row_product(op) -> bool:
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = (ir.RankedTensorType(v.type) for v in op.operands)
    if numbers.lhs_batching_dimensions or list(numbers.rhs_contracting_dimensions) != [1] or rhs.rank != 2:
        return False
    if not (lhs.has_static_shape and rhs.has_static_shape) or not all(
            t.element_type == ir.F32Type.get() for t in (lhs, rhs)):
        return False
    lhs_dim, = numbers.lhs_contracting_dimensions
    rows = int(np.prod(lhs.shape)) // max(lhs.shape[lhs_dim], 1)
    return rows == 1 and rhs.shape[0] * rhs.shape[1] * 4 <= SMALL_WEIGHT_BYTES


def _contract_major_dim(op) -> None:
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = op.operands
    with ir.InsertionPoint(op), op.location:
        transposed = stablehlo.transpose(rhs, ir.DenseI64ArrayAttr.get([1, 0]))
        lhs = stablehlo.optimization_barrier([lhs])
        swapped = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=[], rhs_batching_dimensions=[],
            lhs_contracting_dimensions=list(numbers.lhs_contracting_dimensions), rhs_contracting_dimensions=[0])
        product = stablehlo.dot_general(op.results[0].type, lhs, transposed, swapped)
    op.results[0].replace_all_uses_with(product)
    op.erase()
