"""Scalars: tensor.item() (_local_scalar_dense), size queries (sym_size, sym_numel, sym_stride, ...), Python
arithmetic and comparisons on SymInts/SymFloats/SymBools, and range constraints (no code).

A scalar is a 0-d tensor of its Python type: int64 for SymInts, float64 for
SymFloats, i1 for SymBools. Graphs with data-dependent code (``.item()``) hold
these; torch.export has already checked their asserts and constraints.
"""
from __future__ import annotations

import operator

import torch
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.stablehlo_ir.dtypes import SCALAR_DTYPES

from ..constants import constant
from ..emit.elementwise import compare
from ..emit.padded import bound_scalar
from ..promotion import convert
from ..registry import lower
from ..shapes import dim_size, reshape
from ..values import dtype_of, rank

aten = torch.ops.aten


def _dtype(meta) -> torch.dtype:
    return SCALAR_DTYPES[type(meta)]


@lower(aten._local_scalar_dense.default)
def local_scalar_dense(ctx, x):
    """``x.item()`` as a 0-d int64, float64 or bool tensor (the Python number it stands for); a bounded int is a
    size tensors may have (``emit.padded.bound_scalar``)."""
    return bound_scalar(ctx, convert(reshape(ctx, x, []), _dtype(ctx.out_meta)), ctx.out_meta)


@lower(aten.sym_size.int)
def sym_size(ctx, x, dim):
    return dim_size(ctx, x, dim)


@lower(aten.sym_numel.default)
def sym_numel(ctx, x):
    return _product(ctx, [dim_size(ctx, x, d) for d in range(rank(x))])


def _product(ctx, sizes):
    total = ctx.size_value(1)
    for size in sizes:
        total = stablehlo.multiply(total, size)
    return total


@lower(aten.sym_stride.int)
def sym_stride(ctx, x, dim):
    """The contiguous stride: values are laid out row-major, whatever the eager tensor's strides were."""
    return _product(ctx, [dim_size(ctx, x, d) for d in range(dim % max(rank(x), 1) + 1, rank(x))])


@lower(aten.sym_storage_offset.default)
def sym_storage_offset(ctx, x):
    return ctx.size_value(0)


@lower(aten.sym_is_contiguous.default)
def sym_is_contiguous(ctx, x, memory_format=torch.contiguous_format):
    return constant(True, torch.bool)


@lower(aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default)
def constrain_range(ctx, size, *, min=None, max=None):
    """No code: a hint to torch.export's shape reasoning, checked when it traced the program."""
    return None


# -- Python operators on scalars ------------------------------------------------------------


def _operands(ctx, *operands):
    """The operands (0-d values or Python numbers) in one dtype: float64 if any is a float, bool if all are
    bools, else int64."""
    dtypes = {dtype_of(o) if not isinstance(o, (int, float, bool)) else SCALAR_DTYPES[type(o)] for o in operands}
    dtype = torch.float64 if torch.float64 in dtypes else torch.bool if dtypes == {torch.bool} else torch.int64
    return [constant(o, dtype) if isinstance(o, (int, float, bool)) else convert(o, dtype) for o in operands]


def _binary(op):
    def rule(ctx, a, b):
        return convert(op(*_operands(ctx, a, b)), _dtype(ctx.out_meta))

    return rule


def _floor_divide(a, b):
    """Python's ``//``: the truncated quotient, one less where the remainder's sign differs from b's."""
    quotient = stablehlo.divide(a, b)
    if dtype_of(a).is_floating_point:
        return stablehlo.floor(quotient)
    zero = constant(0, dtype_of(a))
    remainder = stablehlo.remainder(a, b)
    differs = stablehlo.and_(compare(remainder, zero, "NE"), compare(compare(remainder, zero, "LT"),
                                                                     compare(b, zero, "LT"), "NE"))
    return stablehlo.select(differs, stablehlo.subtract(quotient, constant(1, dtype_of(a))), quotient)


def _modulo(a, b):
    """Python's ``%``: a - b * (a // b), which takes b's sign."""
    return stablehlo.subtract(a, stablehlo.multiply(b, _floor_divide(a, b)))


for _op, _emit in {
    operator.add: stablehlo.add, operator.sub: stablehlo.subtract, operator.mul: stablehlo.multiply,
    operator.floordiv: _floor_divide, operator.mod: _modulo, torch.sym_max: stablehlo.maximum,
    torch.sym_min: stablehlo.minimum, operator.and_: stablehlo.and_, operator.or_: stablehlo.or_,
    operator.pow: stablehlo.power,
}.items():
    lower(_op)(_binary(_emit))

for _op, _direction in {operator.eq: "EQ", operator.ne: "NE", operator.lt: "LT", operator.le: "LE",
                        operator.gt: "GT", operator.ge: "GE"}.items():
    lower(_op)(_binary(lambda a, b, direction=_direction: compare(a, b, direction)))


@lower(operator.truediv)
def true_divide(ctx, a, b):
    return stablehlo.divide(*(convert(o, torch.float64) for o in _operands(ctx, a, b)))


@lower(operator.neg)
def negate(ctx, a):
    return stablehlo.negate(_operands(ctx, a)[0])


@lower(torch.sym_not, operator.not_)
def logical_not(ctx, a):
    return stablehlo.not_(convert(_operands(ctx, a)[0], torch.bool))


@lower(torch.sym_float)
def sym_float(ctx, a):
    return convert(_operands(ctx, a)[0], torch.float64)


@lower(torch._sym_sqrt)
def sym_sqrt(ctx, a):
    """``torch.sym_sqrt(n)`` (math.sqrt of a SymInt or SymFloat): a float64."""
    return stablehlo.sqrt(convert(_operands(ctx, a)[0], torch.float64))


@lower(torch.sym_sum)
def sym_sum(ctx, operands):
    """``torch.sym_sum([a, b, ...])``: their sum, in the result's scalar dtype (sums of input dims are emitted
    from their expression before any rule; this takes data-dependent ones and floats)."""
    values = _operands(ctx, *operands)
    total = values[0]
    for value in values[1:]:
        total = stablehlo.add(total, value)
    return convert(total, _dtype(ctx.out_meta))


@lower(torch.sym_ite)
def sym_ite(ctx, condition, if_true, if_false):
    """``torch.sym_ite(b, t, f)``: t where b holds, else f, in the result's scalar dtype."""
    chosen = stablehlo.select(convert(_operands(ctx, condition)[0], torch.bool), *_operands(ctx, if_true, if_false))
    return convert(chosen, _dtype(ctx.out_meta))
