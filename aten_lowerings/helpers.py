"""Shared plumbing for every op family: dtypes, constants, promotion, broadcasting, reshapes.

Shapes are handled the same way everywhere: a rule passes torch sizes (ints or
SymInts, usually taken from ``ctx.out_shape``); these helpers emit the static op
when every dim is known and the ``dynamic_*`` op with a shape value otherwise.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .context import LoweringContext
from .mlir_types import DYNAMIC, element_type, is_unsigned, mlir_shape, tensor_type
from .shape_values import size_expr

# --------------------------------------------------------------------------
# types


def value_type(value: ir.Value) -> ir.RankedTensorType:
    return ir.RankedTensorType(value.type)


def static_shape(value: ir.Value) -> list[int]:
    """Dims of a value's type; dynamic dims are ``mlir_types.DYNAMIC``."""
    return list(value_type(value).shape)


def rank(value: ir.Value) -> int:
    return value_type(value).rank


def enclosing_module() -> ir.Operation:
    """The ``builtin.module`` being built at the current insertion point (where rules add private functions)."""
    operation = ir.InsertionPoint.current.block.owner.operation
    while operation.name != "builtin.module":
        operation = operation.parent
    return operation


@lru_cache(maxsize=None)
def _dtype_by_type_string(type_string: str) -> torch.dtype:
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool,
                  torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
                  torch.uint32, torch.uint64, torch.complex64, torch.complex128):
        if str(element_type(dtype)) == type_string:
            return dtype
    raise TypeError(f"no torch dtype for MLIR element type {type_string}")


_FLOAT_TYPES = {ir.F32Type: torch.float32, ir.F16Type: torch.float16, ir.BF16Type: torch.bfloat16,
                ir.F64Type: torch.float64}


def dtype_of(value: ir.Value) -> torch.dtype:
    element = value_type(value).element_type
    dtype = _FLOAT_TYPES.get(type(element))  # the common case, without printing the type (~10 us)
    return dtype if dtype is not None else _dtype_by_type_string(str(element))


def with_dtype(value: ir.Value, dtype: torch.dtype) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(static_shape(value), element_type(dtype))


# --------------------------------------------------------------------------
# constants


def _scalar_attr(number, dtype: torch.dtype) -> ir.Attribute:
    mlir_type = element_type(dtype)
    if dtype.is_floating_point:
        return ir.FloatAttr.get(mlir_type, float(number))
    if dtype == torch.bool:
        return ir.IntegerAttr.get(mlir_type, int(bool(number)))
    return ir.IntegerAttr.get(mlir_type, int(number))


def constant(number, dtype: torch.dtype, shape: Sequence[int] = ()) -> ir.Value:
    """A splat constant of a Python number with a static shape (default: 0-d)."""
    if dtype.is_complex:  # MLIR has no complex scalar attribute to splat: build the (tiny) dense array
        array = np.full(list(shape), complex(number), dtype=np.complex128 if dtype == torch.complex128 else np.complex64)
        return array_constant(array, dtype)
    result_type = ir.RankedTensorType.get(list(shape), element_type(dtype))
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(result_type, _scalar_attr(number, dtype)))


def array_constant(array: np.ndarray, dtype: torch.dtype) -> ir.Value:
    """A dense constant from a numpy array (ints, floats, complex; used for small index tables)."""
    result_type = ir.RankedTensorType.get(list(array.shape), element_type(dtype))
    return stablehlo.constant(ir.DenseElementsAttr.get(np.ascontiguousarray(array), type=result_type))


def scalar_to_dtype(number, dtype: torch.dtype):
    """Python number cast the way torch casts a scalar operand (bool/int/float)."""
    if dtype == torch.bool:
        return bool(number)
    if not dtype.is_floating_point and not dtype.is_complex:
        return int(number)
    return float(number)


# --------------------------------------------------------------------------
# dtype promotion


@lru_cache(maxsize=None)
def _probe(dtype: torch.dtype, zero_dim: bool) -> torch.Tensor:
    return torch.empty(() if zero_dim else (0,), dtype=dtype)


def _promotion_operand(operand, meta):
    if isinstance(operand, ir.Value):
        zero_dim = meta.dim() == 0 if meta is not None else rank(operand) == 0
        return _probe(dtype_of(operand), zero_dim)
    return operand


def promoted_dtype(*operands, metas: Sequence | None = None) -> torch.dtype:
    """torch's result_type over MLIR values (tensors) and Python numbers (scalars)."""
    metas = metas or [None] * len(operands)
    probes = [_promotion_operand(op, meta) for op, meta in zip(operands, metas)]
    result = probes[0]
    if len(probes) == 1:
        return result.dtype if isinstance(result, torch.Tensor) else torch.tensor(result).dtype
    dtype = torch.result_type(probes[0], probes[1])
    for probe in probes[2:]:
        dtype = torch.promote_types(dtype, probe.dtype) if isinstance(probe, torch.Tensor) \
            else torch.result_type(torch.empty((0,), dtype=dtype), probe)
    return dtype


def convert(value: ir.Value, dtype: torch.dtype) -> ir.Value:
    if dtype == torch.complex32:  # carried as complex64 (mlir_types): round its parts to float16 values
        value = convert(value, torch.complex64)
        real, imag = (round_to(part, torch.float16) for part in (stablehlo.real(value), stablehlo.imag(value)))
        return stablehlo.complex(real, imag)
    if dtype_of(value) == dtype:
        return value
    return stablehlo.convert(with_dtype(value, dtype), value)


def round_to(value: ir.Value, dtype: torch.dtype) -> ir.Value:
    """``value`` rounded to ``dtype`` and back to its own type: where torch stores an intermediate result in a
    narrower dtype than it computes in."""
    return convert(convert(value, dtype), dtype_of(value))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16 (torch computes and accumulates those in float32 on CPU), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --------------------------------------------------------------------------
# shapes


def is_static(sizes) -> bool:
    return all(isinstance(s, int) or s.node.maybe_as_int() is not None for s in sizes)


def has_sizes(ctx: LoweringContext, value: ir.Value, sizes) -> bool:
    """Whether ``value``, whose type has the shape of torch ``sizes``, is known to have those sizes: they are
    static, or the value's symbolic sizes are recorded and equal them."""
    return is_static(sizes) or ctx.dims.sizes_of(value) == tuple(size_expr(s) for s in sizes)


def broadcast_in_dim(ctx: LoweringContext, value: ir.Value, sizes, dims: Sequence[int],
                     element: ir.Type | None = None) -> ir.Value:
    """``broadcast_in_dim`` to torch sizes (static or symbolic); ``dims`` maps operand dims to result dims.
    ``element`` is the result's element type where it differs from the operand's (a per-axis quant type's
    axis moves with its dim). A dynamic broadcast says which operand dims expand: the static size-1 ones (torch
    never broadcasts a symbolic size, export assumes it is not 1), so consumers that need to know (IREE) can
    lower it."""
    result_type = ir.RankedTensorType.get(mlir_shape(sizes), element or value_type(value).element_type)
    if value_type(value) == result_type and list(dims) == list(range(len(dims))) and has_sizes(ctx, value, sizes):
        return value
    if is_static(sizes):
        return stablehlo.broadcast_in_dim(result_type, value, list(dims))
    expanding = [i for i, (size, d) in enumerate(zip(static_shape(value), dims))
                 if size == 1 and size_expr(sizes[d]) != 1]  # sympy's != compares, torch's would guard
    kept = [i for i in range(len(dims)) if i not in expanding]
    return stablehlo.dynamic_broadcast_in_dim(result_type, value, ctx.shape_value(sizes), list(dims),
                                              known_expanding_dimensions=expanding or None,
                                              known_nonexpanding_dimensions=kept or None)


def broadcast_to(ctx: LoweringContext, value: ir.Value, sizes) -> ir.Value:
    """Numpy-style broadcast (trailing dims aligned) to torch sizes."""
    offset = len(sizes) - rank(value)
    return broadcast_in_dim(ctx, value, sizes, list(range(offset, len(sizes))))


def producer(value: ir.Value) -> ir.Operation | None:
    """The op whose result ``value`` is (None for a block argument)."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def reshape(ctx: LoweringContext, value: ir.Value, sizes) -> ir.Value:
    result_type = ir.RankedTensorType.get(mlir_shape(sizes), value_type(value).element_type)
    if value_type(value) == result_type:
        return value
    source = producer(value)
    if source is not None and source.name in ("stablehlo.reshape", "stablehlo.dynamic_reshape"):
        return reshape(ctx, source.operands[0], sizes)  # a reshape of a reshape: one reshape of the first's operand
    if is_static(sizes):
        return stablehlo.reshape(result_type, value)
    return stablehlo.dynamic_reshape(result_type, value, ctx.shape_value(sizes))


def dim_size(ctx: LoweringContext, value: ir.Value, dim: int) -> ir.Value:
    """0-d i64 size of one dim of a value (constant when static)."""
    size = static_shape(value)[dim]
    if size != DYNAMIC:
        return ctx.size_value(size)
    return ctx.dims.read(value, dim)


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def normalize_dims(dims, ndim: int) -> list[int]:
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(normalize_dim(d, ndim) for d in dims)


def iota(ctx: LoweringContext, sizes, dim: int, dtype: torch.dtype = torch.int64) -> ir.Value:
    """0, 1, 2, ... along ``dim`` of a tensor of torch sizes (static or symbolic)."""
    result_type = tensor_type(sizes, dtype)
    if is_static(sizes):
        return stablehlo.iota(result_type, dim)
    return stablehlo.dynamic_iota(result_type, ctx.shape_value(sizes), dim)


def compare(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """``stablehlo.compare`` of two same-typed values; ``direction`` is EQ, NE, LT, LE, GT or GE."""
    dtype = dtype_of(lhs)
    kind = "FLOAT" if dtype.is_floating_point else \
        "UNSIGNED" if dtype == torch.bool or is_unsigned(dtype) else "SIGNED"
    return stablehlo.compare(lhs, rhs, stablehlo.ComparisonDirectionAttr.get(direction),
                             compare_type=stablehlo.ComparisonTypeAttr.get(kind))


# --------------------------------------------------------------------------
# elementwise plumbing


def as_tensor(ctx: LoweringContext, operand, dtype: torch.dtype, sizes) -> ir.Value:
    """An elementwise operand as a value of ``dtype`` broadcast to ``sizes`` (numbers become splats)."""
    if isinstance(operand, ir.Value):
        return broadcast_to(ctx, convert(operand, dtype), sizes)
    return full_like(ctx, sizes, operand, dtype)


def elementwise_operands(ctx: LoweringContext, *operands, dtype: torch.dtype | None = None) -> list[ir.Value]:
    """Operands promoted (torch rules unless ``dtype`` is given) and broadcast to the node's output shape."""
    if dtype is None:
        dtype = promoted_dtype(*operands, metas=[ctx.arg_meta(i) if i < len(ctx.node.args) else None
                                                  for i in range(len(operands))])
    return [as_tensor(ctx, operand, dtype, ctx.out_shape) for operand in operands]


def full_like(ctx: LoweringContext, sizes, fill, dtype: torch.dtype) -> ir.Value:
    """A tensor of torch sizes filled with a Python number."""
    return broadcast_in_dim(ctx, constant(scalar_to_dtype(fill, dtype), dtype), sizes, [])


# --------------------------------------------------------------------------
# reductions


def reduce(ctx: LoweringContext, value: ir.Value, dims: Sequence[int], init, op) -> ir.Value:
    """``stablehlo.reduce`` of ``value`` over ``dims`` (removed from the result) with the binary ``op``
    (e.g. ``stablehlo.add``) starting from the Python number ``init``."""
    dims = sorted(dims)
    element = value_type(value).element_type
    shape = [d for i, d in enumerate(static_shape(value)) if i not in dims]
    op_ = stablehlo.ReduceOp([ir.RankedTensorType.get(shape, element)], [value],
                             [constant(init, dtype_of(value))], dims)
    scalar = ir.RankedTensorType.get([], element)
    block = op_.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.return_([op(*block.arguments)])
    return op_.result


def while_loop(initial: list, condition, body) -> list:
    """``stablehlo.while`` over same-typed values: ``condition(*values)`` a 0-d bool, ``body(*values)`` the next."""
    types = [v.type for v in initial]
    op = stablehlo.WhileOp(types, initial)
    for region, build in ((op.cond, lambda args: [condition(*args)]), (op.body, lambda args: body(*args))):
        block = region.blocks.append(*types)
        with ir.InsertionPoint(block):
            stablehlo.return_(build(list(block.arguments)))
    return list(op.results)
