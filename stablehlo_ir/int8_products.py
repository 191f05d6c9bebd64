"""Products on int8 weights rewritten into the forms XLA's CPU backend runs fast at decode shapes (a few rows).
The rewrite is applied to the module XLA compiles, a copy: the artifact keeps torch's form.

Why: on XLA CPU an int8 x int8 product with one row is many times slower than with two, and a float32 row times
an int8 weight converted to float32 is slow however it is written (README, "Speed and scale", has the figures,
measured with ``bench/quantized_decode_speed.py``). So:

- int8 x int8 with one row: the row is padded to two and the extra row of the result is dropped.
- uint8 x int8 (torchao's dynamic activations on CPUs with VNNI but no AMX, ``_int_scaled_matmul_cpu``: int8
  activations shifted by 128 into uint8, the product corrected by ``128 * column sums of the weight``), which XLA
  runs far slower than int8 x int8: the rows are shifted back and multiplied as int8 x int8, in the forms above.
  When the product's one user subtracts torchao's correction, that subtraction goes too (the weight is not read a
  second time for its sums); otherwise the correction is added to the product. Both are exact (int32 sums).
- a float32 lhs of at most ``DIGIT_ROWS`` rows times ``convert(int8 weight)`` (times a per-channel scale, as
  ``stablehlo-legalize-quant-to-math`` dequantizes a weight-only ``!quant.uniform`` weight): each row is split
  into three int8 digits, ``x = s1 q1 + s2 q2 + s3 q3`` (per row ``s1 = max|x| / 127``, ``s2 = s1 / 252``,
  ``s3 = s2 / 252``; what is left is at most ``s3 / 2``, ``max|x|`` times 6e-8, float32's own rounding), one
  int8 x int8 -> int32 product of the three digit rows (exact), then ``s1 a1 + s2 a2 + s3 a3`` in float32.

An int8 weight read through a 2-d ``transpose`` is read as it is stored, with the contracted dim swapped.
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

DIGIT_ROWS = 16   # float rows split into int8 digits; larger products stay float32 dots
_DIGITS = 3
_DIGIT_BASE = 252.0  # 2 x 126: each remainder over the next scale stays within +-126.5, so no digit clamps


_SHIFT = 128  # uint8 activations are int8 ones plus this


def has_int8_products(mlir_text: str) -> bool:
    """A cheap test for modules that may hold a product ``rewrite_int8_product`` rewrites."""
    return "xi8>" in mlir_text and "stablehlo.dot_general" in mlir_text


def has_uint8_activations(mlir_text: str) -> bool:
    """Whether the module multiplies uint8 rows by int8 weights (torchao's dynamic int8 form on a CPU with VNNI but
    no AMX; int8 x int8 elsewhere)."""
    return "xui8>" in mlir_text and has_int8_products(mlir_text)


def rewrite_int8_product(op) -> bool:
    """Rewrite, in place, a ``dot_general`` that is one of the int8 products described above (static shapes, no
    batch dims, one contracted dim); whether it was."""
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = op.operands
    result_type = ir.RankedTensorType(op.results[0].type)
    if numbers.lhs_batching_dimensions or len(numbers.lhs_contracting_dimensions) != 1 or not all(
            ir.RankedTensorType(v.type).has_static_shape for v in (lhs, rhs, op.results[0])):
        return False
    lhs_dim, = numbers.lhs_contracting_dimensions
    rhs_dim, = numbers.rhs_contracting_dimensions
    lhs_shape = ir.RankedTensorType(lhs.type).shape
    if 0 in lhs_shape:
        return False
    rows = int(np.prod(lhs_shape)) // lhs_shape[lhs_dim]
    if _is_uint8(lhs):
        return _is_int8(rhs) and _rewrite_uint8_product(op, rows, lhs_shape[lhs_dim])
    weight = _int8_weight(rhs, rhs_dim, _is_int8(lhs))
    if weight is None:
        return False
    with ir.InsertionPoint(op), op.location:
        if _is_int8(lhs) and rows == 1:
            replacement = _padded_row(lhs, lhs_shape[lhs_dim], *weight[:2], result_type)
        elif _is_f32(lhs) and rows <= DIGIT_ROWS and lhs_dim == len(lhs_shape) - 1:
            replacement = _digits_product(lhs, rows, lhs_shape[lhs_dim], *weight, result_type)
        else:
            return False
    op.results[0].replace_all_uses_with(replacement)
    op.erase()
    return True


def _rewrite_uint8_product(op, rows: int, depth: int) -> bool:
    lhs, rhs = op.operands
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    rhs_dim, = numbers.rhs_contracting_dimensions
    result_type = ir.RankedTensorType(op.results[0].type)
    corrected = _correction_user(op, rhs, rhs_dim)
    with ir.InsertionPoint(op), op.location:
        signed = _unshifted(lhs)
        if rows == 1:
            product = _padded_row(signed, depth, *_int8_weight(rhs, rhs_dim, True)[:2], result_type)
        else:
            product = stablehlo.dot_general(result_type, signed, rhs, op.attributes["dot_dimension_numbers"])
        if corrected is None:
            sums = _column_sums(rhs, rhs_dim)
            shifted = stablehlo.multiply(sums, _int_splat(_SHIFT, ir.RankedTensorType(sums.type).shape))
            free = ir.RankedTensorType(shifted.type).rank
            product = stablehlo.add(product, stablehlo.broadcast_in_dim(
                result_type, shifted, list(range(result_type.rank - free, result_type.rank))))
    if corrected is not None:
        corrected.results[0].replace_all_uses_with(product)
        corrected.erase()
    else:
        op.results[0].replace_all_uses_with(product)
    op.erase()
    return True


def _unshifted(lhs: ir.Value) -> ir.Value:
    """The int8 rows ``s`` with ``lhs == s + 128``: torchao's ``convert(convert(s, i32) + 128, ui8)`` read back, else
    computed (in int32: exact)."""
    producer = _producer(lhs)
    shifted = _producer(producer.operands[0]) if producer is not None and producer.name == "stablehlo.convert" else None
    if shifted is not None and shifted.name == "stablehlo.add":
        for wide, offset in (shifted.operands, list(reversed(list(shifted.operands)))):
            source = _producer(wide)
            if _int_splat_value(offset) == _SHIFT and source is not None and source.name == "stablehlo.convert" \
                    and _is_int8(source.operands[0]):
                return source.operands[0]
    shape = ir.RankedTensorType(lhs.type).shape
    wide = stablehlo.convert(_tensor(shape, ir.IntegerType.get_signless(32)), lhs)
    return stablehlo.convert(_tensor(shape, ir.IntegerType.get_signless(8)),
                             stablehlo.subtract(wide, _int_splat(_SHIFT, shape)))


def _correction_user(op, weight: ir.Value, dim: int):
    """The one user of ``op``'s result when it is ``result - 128 * sums of weight over dim`` (int32), else None."""
    uses = list(op.results[0].uses)
    if len(uses) != 1 or uses[0].operand_number != 0 or uses[0].owner.name != "stablehlo.subtract":
        return None
    user = uses[0].owner
    if user.results[0].type != op.results[0].type:
        return None
    correction = _producer(_through_shapes(user.operands[1]))
    if correction is None or correction.name != "stablehlo.multiply":
        return None
    for sums, factor in (correction.operands, list(reversed(list(correction.operands)))):
        reduce = _producer(_through_shapes(sums))
        if _int_splat_value(factor) == _SHIFT and reduce is not None and _sums_over(reduce, weight, dim):
            return user
    return None


def _sums_over(reduce, weight: ir.Value, dim: int) -> bool:
    """Whether ``reduce`` adds up ``convert(weight)`` to int32 over ``dim`` alone, from zero."""
    body = reduce.regions[0].blocks[0].operations
    converted = _producer(reduce.operands[0])
    return (reduce.name == "stablehlo.reduce" and len(reduce.operands) == 2
            and list(ir.DenseI64ArrayAttr(reduce.attributes["dimensions"])) == [dim]
            and body[0].name == "stablehlo.add" and _int_splat_value(reduce.operands[1]) == 0
            and converted is not None and converted.name == "stablehlo.convert" and converted.operands[0] == weight
            and ir.RankedTensorType(reduce.results[0].type).element_type == ir.IntegerType.get_signless(32))


def _column_sums(weight: ir.Value, dim: int) -> ir.Value:
    """``weight`` summed over ``dim`` in int32."""
    i32 = ir.IntegerType.get_signless(32)
    shape = ir.RankedTensorType(weight.type).shape
    scalar = _tensor([], i32)
    wide = stablehlo.convert(_tensor(shape, i32), weight)
    free = [d for i, d in enumerate(shape) if i != dim]
    operation = stablehlo.ReduceOp([_tensor(free, i32)], [wide], [_int_splat(0, [])], [dim])
    block = operation.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.return_([stablehlo.add(*block.arguments)])
    return operation.result


def _through_shapes(value: ir.Value) -> ir.Value:
    """``value`` before any reshapes and broadcasts that made it."""
    producer = _producer(value)
    while producer is not None and producer.name in ("stablehlo.reshape", "stablehlo.broadcast_in_dim"):
        value = producer.operands[0]
        producer = _producer(value)
    return value


def _int_splat_value(value: ir.Value) -> int | None:
    """The number every element of integer ``value`` is, when it is a constant (maybe broadcast), else None."""
    producer = _producer(_through_shapes(value))
    if producer is None or producer.name != "stablehlo.constant":
        return None
    attribute = producer.attributes["value"]
    if not isinstance(ir.RankedTensorType(attribute.type).element_type, ir.IntegerType):
        return None
    attribute = ir.DenseIntElementsAttr(attribute)
    return ir.IntegerAttr(attribute.get_splat_value()).value if attribute.is_splat else None


def _int8_weight(rhs: ir.Value, dim: int, int8_lhs: bool):
    """(int8 value, its contracted dim, per-channel scale or None) behind ``rhs``: rhs itself for an int8 lhs,
    else the operand of a ``convert`` from int8, optionally times a scale broadcast along a 2-d weight's other
    dim (a legalized ``!quant.uniform`` weight: the scale then multiplies the product instead); read through a
    2-d transpose. None otherwise."""
    scale = None
    if not int8_lhs:
        rhs, scale = _scaled(rhs, 1 - dim)
        producer = _producer(rhs)
        if producer is None or producer.name != "stablehlo.convert" or not _is_int8(producer.operands[0]):
            return None
        rhs = producer.operands[0]
    elif not _is_int8(rhs):
        return None
    producer = _producer(rhs)
    if producer is not None and producer.name == "stablehlo.transpose" and ir.RankedTensorType(rhs.type).rank == 2:
        return producer.operands[0], 1 - dim, scale
    return rhs, dim, scale


def _scaled(value: ir.Value, channel_dim: int) -> tuple[ir.Value, ir.Value | None]:
    """(x, scale) when 2-d ``value`` is ``x * broadcast_in_dim(scale, [channel_dim])``, else (value, None)."""
    producer = _producer(value)
    if producer is None or producer.name != "stablehlo.multiply" or ir.RankedTensorType(value.type).rank != 2:
        return value, None
    for x, other in (producer.operands, reversed(list(producer.operands))):
        broadcast = _producer(other)
        if broadcast is not None and broadcast.name == "stablehlo.broadcast_in_dim" and \
                list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"])) == [channel_dim]:
            return x, broadcast.operands[0]
    return value, None


def _producer(value: ir.Value):
    return value.owner if isinstance(value, ir.OpResult) else None


def _is_int8(value: ir.Value) -> bool:
    return ir.RankedTensorType(value.type).element_type == ir.IntegerType.get_signless(8)


def _is_uint8(value: ir.Value) -> bool:
    return ir.RankedTensorType(value.type).element_type == ir.IntegerType.get_unsigned(8)


def _is_f32(value: ir.Value) -> bool:
    return ir.RankedTensorType(value.type).element_type == ir.F32Type.get()


def _tensor(shape, element) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element)


def _product(rows_value: ir.Value, weight: ir.Value, weight_dim: int, element) -> ir.Value:
    """``rows_value`` [R, K] contracted with ``weight`` over its ``weight_dim``: [R, weight's other dims]."""
    free = [d for i, d in enumerate(ir.RankedTensorType(weight.type).shape) if i != weight_dim]
    rows = ir.RankedTensorType(rows_value.type).shape[0]
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[], rhs_batching_dimensions=[],
        lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[weight_dim])
    return stablehlo.dot_general(_tensor([rows, *free], element), rows_value, weight, numbers)


def _padded_row(lhs, depth: int, weight, weight_dim: int, result_type) -> ir.Value:
    row = stablehlo.reshape(_tensor([1, depth], ir.IntegerType.get_signless(8)), lhs)
    zero = stablehlo.constant(ir.DenseElementsAttr.get(np.zeros((), np.int8)))
    padded = stablehlo.pad(row, zero, [0, 0], [1, 0], [0, 0])
    product = _product(padded, weight, weight_dim, result_type.element_type)
    shape = ir.RankedTensorType(product.type).shape
    first = stablehlo.slice(product, [0] * len(shape), [1, *shape[1:]], [1] * len(shape))
    return stablehlo.reshape(result_type, first)


def _digits_product(lhs, rows: int, depth: int, weight, weight_dim: int, channel_scale, result_type) -> ir.Value:
    f32 = ir.F32Type.get()
    x = stablehlo.reshape(_tensor([rows, depth], f32), lhs)
    scale = _row_scale(x, rows)
    scales, digits = [], []
    for _ in range(_DIGITS):
        wide = stablehlo.broadcast_in_dim(_tensor([rows, depth], f32), scale, [0])
        digit = _clamped(stablehlo.round_nearest_even(stablehlo.divide(x, wide)))
        x = stablehlo.subtract(x, stablehlo.multiply(digit, wide))
        scales.append(scale)
        digits.append(stablehlo.convert(_tensor([rows, depth], ir.IntegerType.get_signless(8)), digit))
        scale = stablehlo.divide(scale, _splat(_DIGIT_BASE, [rows]))
    product = _product(stablehlo.concatenate(digits, 0), weight, weight_dim, ir.IntegerType.get_signless(32))
    shape = ir.RankedTensorType(product.type).shape
    product = stablehlo.convert(_tensor(shape, f32), product)
    total = None
    for index in reversed(range(_DIGITS)):  # smallest digit first
        part = stablehlo.slice(product, [index * rows, *[0] * (len(shape) - 1)],
                               [(index + 1) * rows, *shape[1:]], [1] * len(shape))
        part = stablehlo.multiply(part, stablehlo.broadcast_in_dim(part.type, scales[index], [0]))
        total = part if total is None else stablehlo.add(total, part)
    if channel_scale is not None:
        total = stablehlo.multiply(total, stablehlo.broadcast_in_dim(total.type, channel_scale, [1]))
    return stablehlo.reshape(result_type, total)


def _row_scale(x: ir.Value, rows: int) -> ir.Value:
    """max(|x|) / 127 per row (the smallest normal float32 for a row of zeros)."""
    f32 = ir.F32Type.get()
    scalar = _tensor([], f32)
    operation = stablehlo.ReduceOp([_tensor([rows], f32)], [stablehlo.abs(x)], [_splat(0.0, [])], [1])
    block = operation.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.return_([stablehlo.maximum(*block.arguments)])
    scale = stablehlo.divide(operation.result, _splat(127.0, [rows]))
    return stablehlo.maximum(scale, _splat(float(np.finfo(np.float32).tiny), [rows]))


def _clamped(digit: ir.Value) -> ir.Value:
    return stablehlo.clamp(_splat(-127.0, []), digit, _splat(127.0, []))


def _int_splat(number: int, shape) -> ir.Value:
    return stablehlo.constant(ir.DenseElementsAttr.get(np.full(shape, number, np.int32)))


def _splat(number: float, shape) -> ir.Value:
    return stablehlo.constant(ir.DenseElementsAttr.get(np.full(shape, number, np.float32)))
