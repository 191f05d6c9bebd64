"""Matrix products: mm, _int_mm, bmm, addmm, baddbmm, linear, matmul, dot, mv, einsum, as ``dot_general`` with batch
dims; grouped products of mixture-of-experts layers (``_grouped_mm``, transformers' ``grouped_mm_fallback``)."""
from __future__ import annotations

import string

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..emit.contraction import contract, dot_general
from ..emit.elementwise import compare, elementwise_operands
from ..emit.reduce import reduce
from ..mlir_types import DYNAMIC, mlir_shape
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, iota
from ..values import dtype_of, rank, static_shape

aten = torch.ops.aten


def _product(ctx, a, b, lhs_dim: int, rhs_dim: int, batch: int = 0):
    """The node's result: ``a`` and ``b`` contracted over one dim each, with the leading ``batch`` dims
    as batch dims, rounded once to the node's dtype."""
    dims = list(range(batch))
    out = contract(a, b, dims, dims, [lhs_dim], [rhs_dim], mlir_shape(ctx.out_shape), ctx.out_dtype)
    return convert(out, ctx.out_dtype)


@lower(aten.mm.default)
def mm(ctx, a, b):
    return _product(ctx, a, b, 1, 0)


@lower(aten._int_mm.default)
def int_mm(ctx, a, b):
    """int8 x int8, accumulated exactly in int32: ``dot_general`` on the int8 operands with an int32 result."""
    return dot_general(ctx.out_type(), a, b, [], [], [1], [0])


@lower(aten.bmm.default)
def bmm(ctx, a, b):
    return _product(ctx, a, b, 2, 1, batch=1)


@lower(aten.dot.default, aten.vdot.default)
def dot(ctx, a, b):
    return _product(ctx, a, b, 0, 0)


@lower(aten.mv.default)
def mv(ctx, matrix, vector):
    return _product(ctx, matrix, vector, 1, 0)


@lower(aten.matmul.default)
def matmul(ctx, a, b):
    """torch.matmul's rank cases.

    When either side is a vector, or the rhs is a matrix, the stacked dims all
    belong to one operand and come out in the right order without batch dims.
    Otherwise both sides are broadcast to the common batch dims (as torch's
    ``expand``) and contracted with them as batch dims.
    """
    a_rank, b_rank = rank(a), rank(b)
    if a_rank == 1 or b_rank <= 2:
        return _product(ctx, a, b, a_rank - 1, max(b_rank - 2, 0))
    batch = list(ctx.out_shape[:-2])
    a = broadcast_to(ctx, a, batch + list(ctx.arg_meta(0).shape[-2:]))
    b = broadcast_to(ctx, b, batch + list(ctx.arg_meta(1).shape[-2:]))
    return _product(ctx, a, b, len(batch) + 1, len(batch), batch=len(batch))


# -- product plus a scaled input -------------------------------------------------

def _add_product(ctx, bias, a, b, beta, alpha, batch: int, sum_batch: bool = False):
    """beta * bias + alpha * (a @ b) as addmm/baddbmm define it (beta == 0 ignores bias, NaNs included);
    ``sum_batch`` sums the products over the batch dims (addbmm).

    Low-precision floats are summed in float32 and rounded once, like torch's CPU kernels.
    """
    dtype = compute_dtype(ctx.out_dtype)
    dims = list(range(batch))
    batch_dims, summed = ([], dims) if sum_batch else (dims, [])
    product = contract(a, b, batch_dims, batch_dims, [*summed, batch + 1], [*summed, batch],
                       mlir_shape(ctx.out_shape), ctx.out_dtype)
    if alpha != 1:
        product = stablehlo.multiply(product, elementwise_operands(ctx, alpha, dtype=dtype)[0])
    if beta != 0:
        scaled_bias = elementwise_operands(ctx, bias, dtype=dtype)[0]
        if beta != 1:
            scaled_bias = stablehlo.multiply(scaled_bias, elementwise_operands(ctx, beta, dtype=dtype)[0])
        product = stablehlo.add(product, scaled_bias)
    return convert(product, ctx.out_dtype)


@lower(aten.addmm.default)
def addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _add_product(ctx, bias, a, b, beta, alpha, batch=0)


@lower(aten.baddbmm.default)
def baddbmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _add_product(ctx, bias, a, b, beta, alpha, batch=1)


@lower(aten.addbmm.default)
def addbmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _add_product(ctx, bias, a, b, beta, alpha, batch=1, sum_batch=True)


@lower(aten.linear.default)
def linear(ctx, x, weight, bias=None):
    """x @ weight.T (+ bias), contracting weight's dim 1 directly (no transpose op); rounded once."""
    out = contract(x, weight, [], [], [rank(x) - 1], [rank(weight) - 1], mlir_shape(ctx.out_shape), ctx.out_dtype)
    if bias is not None:
        out = stablehlo.add(out, broadcast_to(ctx, convert(bias, dtype_of(out)), ctx.out_shape))
    return convert(out, ctx.out_dtype)


# -- einsum -------------------------------------------------------------------------

def _einsum_labels(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand label strings and the output labels, with '...' spelled out as fresh upper-case labels."""
    spec = equation.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    operands = inputs.split(",")
    spare = [c for c in string.ascii_uppercase if c not in spec]
    ellipsis_rank = max((r - len(s) + 3 for s, r in zip(operands, ranks) if "..." in s), default=0)
    ellipsis = "".join(spare[:ellipsis_rank])
    operands = [s.replace("...", ellipsis[ellipsis_rank - (r - len(s) + 3):]) for s, r in zip(operands, ranks)]
    if not arrow:
        counts = "".join(operands)
        output = ellipsis + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in ellipsis))
    return operands, output.replace("...", ellipsis)


def _sum_out(ctx, value, labels: str, keep: set[str]):
    """Sum over the dims whose label is not in ``keep``; returns the value and its remaining labels."""
    drop = [i for i, c in enumerate(labels) if c not in keep]
    if not drop:
        return value, labels
    return reduce(ctx, value, drop, 0, stablehlo.add), "".join(c for c in labels if c in keep)


def _einsum_pair(lhs, lhs_labels: str, rhs, rhs_labels: str, needed: set[str], dtype):
    """Contract two operands: shared labels still needed become batch dims, other shared labels are summed."""
    batch = [c for c in lhs_labels if c in rhs_labels and c in needed]
    summed = [c for c in lhs_labels if c in rhs_labels and c not in needed]
    for c in batch + summed:
        lhs_size, rhs_size = static_shape(lhs)[lhs_labels.index(c)], static_shape(rhs)[rhs_labels.index(c)]
        if lhs_size != rhs_size and DYNAMIC not in (lhs_size, rhs_size):
            raise NotImplementedError(f"einsum with broadcast label '{c}' ({lhs_size} vs {rhs_size})")
    lhs_free = [c for c in lhs_labels if c not in rhs_labels]
    rhs_free = [c for c in rhs_labels if c not in lhs_labels]
    labels = "".join(batch + lhs_free + rhs_free)
    sizes = {c: d for value, ls in ((rhs, rhs_labels), (lhs, lhs_labels)) for c, d in zip(ls, static_shape(value))}
    result = contract(lhs, rhs, [lhs_labels.index(c) for c in batch], [rhs_labels.index(c) for c in batch],
                      [lhs_labels.index(c) for c in summed], [rhs_labels.index(c) for c in summed],
                      [sizes[c] for c in labels], dtype)
    return result, labels


@lower(aten.einsum.default)
def einsum(ctx, equation, operands, *, path=None):
    """Operands contracted left to right with ``dot_general``; one transpose at the end if the order differs."""
    labels, output = _einsum_labels(equation, [rank(v) for v in operands])
    if any(len(set(ls)) != len(ls) for ls in labels):
        raise NotImplementedError(f"einsum with a repeated label in one operand (a diagonal): {equation!r}")
    dtype = ctx.out_dtype

    def needed_after(index):
        return set(output).union(*labels[index + 1:])

    value, value_labels = _sum_out(ctx, convert(operands[0], dtype), labels[0], needed_after(0))
    for index in range(1, len(operands)):
        keep = needed_after(index)
        rhs, rhs_labels = _sum_out(ctx, convert(operands[index], dtype), labels[index], keep | set(value_labels))
        value, value_labels = _einsum_pair(value, value_labels, rhs, rhs_labels, keep, dtype)
    if value_labels != output:
        value = stablehlo.transpose(value, [value_labels.index(c) for c in output])
    return convert(value, dtype)


@lower(aten._trilinear.default)
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """Three operands unsqueezed at their ``expand`` dims to one rank, multiplied and summed over ``sumdim``
    (nn.functional.bilinear): an einsum with one label per common dim."""
    common = rank(i1) + len(expand1)
    labels = [string.ascii_lowercase[d] for d in range(common)]
    operands = ["".join(c for d, c in enumerate(labels) if d not in expand) for expand in (expand1, expand2, expand3)]
    output = "".join(c for d, c in enumerate(labels) if d not in sumdim)
    return einsum(ctx, f"{','.join(operands)}->{output}", [i1, i2, i3])


# -- grouped products (mixture of experts) -----------------------------------------------------------------------

def _grouped_product(ctx, x, weights, ends, out_dtype):
    """[rows, in] x [groups, in, out] -> [rows, out]: row r times the weights of its group, the group whose rows
    end (exclusive) at ``ends[g]`` and start where the previous group's end; rows past the last end are zeros.

    As ``jax.lax.ragged_dot`` lowers it where no grouped kernel exists: each group's rows selected into a
    [groups, rows, in] operand (zeros elsewhere), contracted with the weights over groups and inputs. The
    product costs groups x a dense one; its rows and groups may be symbolic (tokens routed at run time)."""
    rows, width = ctx.arg_meta(0).shape
    groups = ctx.arg_meta(1).shape[0]
    selected_sizes = [groups, rows, width]
    ends = convert(ends, torch.int64)
    starts = stablehlo.concatenate([constant(0, torch.int64, [1]), stablehlo.slice(ends, [0], [groups - 1], [1])]
                                   if groups > 1 else [constant(0, torch.int64, [1])], 0)
    row = iota(ctx, [groups, rows], 1)
    inside = stablehlo.and_(compare(broadcast_in_dim(ctx, starts, [groups, rows], [0]), row, "LE"),
                            compare(row, broadcast_in_dim(ctx, ends, [groups, rows], [0]), "LT"))
    selected = stablehlo.select(broadcast_in_dim(ctx, inside, selected_sizes, [0, 1]),
                                broadcast_in_dim(ctx, x, selected_sizes, [1, 2]),
                                full_like(ctx, selected_sizes, 0, dtype_of(x)))
    out = contract(selected, weights, [], [], [0, 2], [0, 1], mlir_shape(ctx.out_shape), dtype_of(x))
    return convert(out, out_dtype)


@lower(aten._grouped_mm.default)
def grouped_mm(ctx, x, weights, offs=None, bias=None, out_dtype=None):
    """A 2-d input's rows in groups ending at ``offs`` (cumulative), each times its group's matrix."""
    if offs is None or rank(x) != 2 or rank(weights) != 3:
        raise NotImplementedError("_grouped_mm of a 2-d input and 3-d weights with offs (the mixture-of-experts "
                                  "form) is lowered; other forms are not")
    if bias is not None:
        raise NotImplementedError("_grouped_mm with a bias")
    return _grouped_product(ctx, x, weights, offs, ctx.out_dtype)


@lower("transformers.grouped_mm_fallback.default")
def transformers_grouped_mm(ctx, x, weights, offs):
    """transformers' custom op for the experts' products (its default experts path in float32): ``_grouped_mm``'s
    arithmetic, rows past the last group zeros."""
    return _grouped_product(ctx, x, weights, offs, ctx.out_dtype)
