"""Contractions: ``dot_general`` and ``convolution`` of operands as they are, the products' compute dtypes, and
the kernel and window arithmetic that convolutions, pooling and their gradients share.

A product whose right operand was just written by a ``dynamic_update_slice`` (attention over a KV cache updated
in place) reads the tensor as it was before the write, and the written rows apart (``written_rows``): XLA CPU
otherwise fuses the write into the product's operand, which copies the whole cache two or three times a call."""
from __future__ import annotations

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant
from ..mlir_types import DYNAMIC, element_type
from ..promotion import compute_dtype, convert
from ..shapes import iota, reshape
from ..values import dtype_of, producer, rank, static_shape
from .elementwise import compare


def dot_general(result_type, lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract):
    """``dot_general`` of the operands as they are: result dims are batch dims, then lhs free dims, then rhs
    free dims."""
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(lhs_batch), rhs_batching_dimensions=list(rhs_batch),
        lhs_contracting_dimensions=list(lhs_contract), rhs_contracting_dimensions=list(rhs_contract))
    return stablehlo.dot_general(result_type, lhs, rhs, numbers)


def contract(lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract, out_shape, dtype):
    """``dot_general`` of the operands in ``dtype``. float16/bfloat16 products accumulate into a float32
    result, like torch's CPU kernels; the caller rounds it."""
    result_type = ir.RankedTensorType.get(list(out_shape), element_type(compute_dtype(dtype)))
    lhs, rhs = convert(lhs, dtype), convert(rhs, dtype)
    written = written_rows(rhs)
    if written is not None and written[2] not in rhs_batch:
        return _past_the_write(result_type, lhs, written, lhs_batch, rhs_batch, lhs_contract, rhs_contract)
    return dot_general(result_type, lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract)


def written_rows(value: ir.Value):
    """``(before, update, dim, start)`` when static ``value`` is a ``dynamic_update_slice`` of ``before`` along
    one ``dim`` (whole along the others) from ``start`` (a 0-d integer value, which the op clamps into range);
    else None. Emits nothing."""
    op = producer(value)
    if op is None or op.name != "stablehlo.dynamic_update_slice" or DYNAMIC in static_shape(value):
        return None
    before, update, starts = op.operands[0], op.operands[1], list(op.operands)[2:]
    partial = [d for d, (a, b) in enumerate(zip(static_shape(before), static_shape(update))) if a != b]
    return (before, update, partial[0], starts[partial[0]]) if len(partial) == 1 else None


def _past_the_write(result_type, lhs, written, lhs_batch, rhs_batch, lhs_contract, rhs_contract):
    """The product with a right operand ``written_rows`` describes, from the operand before the write and the
    update. Along a free dim: the product with the old rows, its written rows replaced by the product with the
    update (exact). Along a contracted dim: the left operand's columns for the written rows zeroed against the
    old rows, plus those columns times the update."""
    before, update, dim, start = written
    shape, length = static_shape(before), static_shape(update)[dim]
    zero = constant(0, torch.int64)
    start = stablehlo.clamp(zero, convert(start, torch.int64), constant(shape[dim] - length, torch.int64))
    if dim in rhs_contract:
        column = lhs_contract[rhs_contract.index(dim)]
        lhs_shape = static_shape(lhs)
        sizes = list(lhs_shape)
        sizes[column] = length
        taken = stablehlo.dynamic_slice(lhs, [start if d == column else zero for d in range(len(sizes))], sizes)
        position = iota(None, lhs_shape, column)
        index_type = ir.RankedTensorType.get(lhs_shape, ir.RankedTensorType(position.type).element_type)
        end = stablehlo.add(start, constant(length, torch.int64))
        inside = stablehlo.and_(compare(position, stablehlo.broadcast_in_dim(index_type, start, []), "GE"),
                                compare(position, stablehlo.broadcast_in_dim(index_type, end, []), "LT"))
        kept = stablehlo.select(inside, constant(0, dtype_of(lhs), lhs_shape), lhs)
        return stablehlo.add(dot_general(result_type, kept, before, lhs_batch, rhs_batch, lhs_contract, rhs_contract),
                             dot_general(result_type, taken, update, lhs_batch, rhs_batch, lhs_contract,
                                         rhs_contract))
    free = [d for d in range(len(shape)) if d not in rhs_batch and d not in rhs_contract]
    position = len(lhs_batch) + (rank(lhs) - len(lhs_batch) - len(lhs_contract)) + free.index(dim)
    out = list(ir.RankedTensorType(result_type).shape)
    out[position] = length
    new_type = ir.RankedTensorType.get(out, ir.RankedTensorType(result_type).element_type)
    return stablehlo.dynamic_update_slice(
        dot_general(result_type, lhs, before, lhs_batch, rhs_batch, lhs_contract, rhs_contract),
        dot_general(new_type, lhs, update, lhs_batch, rhs_batch, lhs_contract, rhs_contract),
        [start if d == position else zero for d in range(len(out))])


def per_dim(value, n: int) -> list[int]:
    """An int or a list of ints (one value meaning all dims) as a list of ``n`` ints."""
    values = [value] if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


def symmetric_padding(padding, n: int) -> list[tuple[int, int]]:
    return [(p, p) for p in per_dim(padding, n)]


def convolve(result_type, x, weight, padding, groups: int, kernel_dims=(0, 1), **window) -> ir.Value:
    """``stablehlo.convolution`` of the operands as they are, NC... layouts; ``padding`` is (low, high) per
    spatial dim, ``kernel_dims`` the kernel's (output, input) feature dims, ``window`` the strides and
    dilations."""
    spatial = list(range(2, rank(weight)))
    numbers = stablehlo.ConvDimensionNumbers.get(
        input_batch_dimension=0, input_feature_dimension=1, input_spatial_dimensions=spatial,
        kernel_output_feature_dimension=kernel_dims[0], kernel_input_feature_dimension=kernel_dims[1],
        kernel_spatial_dimensions=spatial,
        output_batch_dimension=0, output_feature_dimension=1, output_spatial_dimensions=spatial)
    return stablehlo.convolution(result_type, x, weight, numbers, groups, 1,
                                 padding=np.asarray(padding, dtype=np.int64), **window)


def flipped_kernel(ctx, weight, groups: int):
    """A kernel (a, b/groups, k...) as (b, a/groups, k...): spatially reversed, the two feature dims swapped
    within each group; turns a convolution's kernel into its transpose's and back."""
    shape = static_shape(weight)
    n = len(shape) - 2
    grouped = reshape(ctx, stablehlo.reverse(weight, list(range(2, n + 2))), [groups, shape[0] // groups] + shape[1:])
    swapped = stablehlo.transpose(grouped, [0, 2, 1] + list(range(3, n + 3)))
    return reshape(ctx, swapped, [shape[1] * groups, shape[0] // groups] + shape[2:])


def bin_matrix(in_size: int, out_size: int) -> np.ndarray:
    """(out, in) weights averaging torch's adaptive bins [floor(i*in/out), ceil((i+1)*in/out))."""
    matrix = np.zeros((out_size, in_size), dtype=np.float32)
    for i in range(out_size):
        start, end = (i * in_size) // out_size, -(-((i + 1) * in_size) // out_size)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix
