"""Matrix products: mm, bmm, addmm, linear, matmul, as ``dot_general`` with batch dims."""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .helpers import broadcast_to, convert, elementwise_operands, promoted_dtype, rank, static_shape
from .mlir_types import element_type, mlir_shape
from .registry import lower

aten = torch.ops.aten


def dot_general(ctx, lhs, rhs, *, batch: int, contract_lhs: int, contract_rhs: int, out_sizes, dtype):
    """``dot_general`` with the leading ``batch`` dims as batch dims and one contracting dim each."""
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(range(batch)), rhs_batching_dimensions=list(range(batch)),
        lhs_contracting_dimensions=[contract_lhs], rhs_contracting_dimensions=[contract_rhs])
    result_type = ir.RankedTensorType.get(mlir_shape(out_sizes), element_type(dtype))
    return stablehlo.dot_general(result_type, convert(lhs, dtype), convert(rhs, dtype), numbers)


@lower(aten.mm.default)
def mm(ctx, a, b):
    return dot_general(ctx, a, b, batch=0, contract_lhs=1, contract_rhs=0,
                       out_sizes=ctx.out_shape, dtype=ctx.out_dtype)


@lower(aten.bmm.default)
def bmm(ctx, a, b):
    return dot_general(ctx, a, b, batch=1, contract_lhs=2, contract_rhs=1,
                       out_sizes=ctx.out_shape, dtype=ctx.out_dtype)


def _linear(ctx, x, weight, bias):
    """x @ weight.T (+ bias), contracting weight's dim 1 directly (no transpose op)."""
    out = dot_general(ctx, x, weight, batch=0, contract_lhs=rank(x) - 1, contract_rhs=1,
                      out_sizes=ctx.out_shape, dtype=ctx.out_dtype)
    if bias is None:
        return out
    return stablehlo.add(out, broadcast_to(ctx, convert(bias, ctx.out_dtype), ctx.out_shape))


@lower(aten.linear.default)
def linear(ctx, x, weight, bias=None):
    return _linear(ctx, x, weight, bias)


@lower(aten.addmm.default)
def addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    product = dot_general(ctx, a, b, batch=0, contract_lhs=1, contract_rhs=0,
                          out_sizes=ctx.out_shape, dtype=ctx.out_dtype)
    scaled_bias, scaled_product = elementwise_operands(ctx, bias, product, dtype=ctx.out_dtype)
    if alpha != 1:
        scaled_product = stablehlo.multiply(scaled_product, elementwise_operands(ctx, alpha, dtype=ctx.out_dtype)[0])
    if beta != 1:
        scaled_bias = stablehlo.multiply(scaled_bias, elementwise_operands(ctx, beta, dtype=ctx.out_dtype)[0])
    return stablehlo.add(scaled_bias, scaled_product)
