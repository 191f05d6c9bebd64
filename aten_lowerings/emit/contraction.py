"""Contractions: ``dot_general`` and ``convolution`` of operands as they are, the products' compute dtypes, and
the kernel and window arithmetic that convolutions, pooling and their gradients share. (How XLA CPU best reads a
product's operand just written in place is a rewrite of the module it compiles: ``stablehlo_ir.cache_reads``.)"""
from __future__ import annotations

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..mlir_types import element_type
from ..promotion import compute_dtype, convert
from ..shapes import reshape
from ..values import rank, static_shape


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
    return dot_general(result_type, lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract)


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
