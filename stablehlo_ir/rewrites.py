"""In-place module rewrites that XLA needs around ``stablehlo-legalize-quant-to-math`` and that jaxlib has no
pass for. Each runs inside the module's context on a module that is a copy (the artifact is never changed).
"""
from __future__ import annotations

import re

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

# !quant.uniform<u8:f32:1, {...}> / !quant.uniform<u8<0:250>:f32, 0.1:3>
_UNSIGNED_UNIFORM = re.compile(
    r"^!quant\.uniform<u(?P<bits>\d+)(?:<(?P<min>\d+):(?P<max>\d+)>)?:(?P<expressed>[^,]+), (?P<params>.*)>$")


def ops_where(module: ir.Module, keep) -> list:
    """The ops of ``module`` (nested ones too) for which ``keep(op)`` is true, in walk order."""
    found = []

    def visit(op):
        if keep(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


# -- unsigned storage ----------------------------------------------------------------------------------------

def _signed_uniform(type_text: str) -> str | None:
    """The signed-storage twin of an unsigned-storage uniform quant type (same values, storage shifted by
    2**(bits-1)), or None for any other type."""
    match = _UNSIGNED_UNIFORM.match(type_text)
    if match is None:
        return None
    bits = int(match["bits"])
    offset = 1 << (bits - 1)
    low = int(match["min"]) if match["min"] is not None else 0
    high = int(match["max"]) if match["max"] is not None else (1 << bits) - 1
    params = match["params"]
    braced = params.startswith("{")
    entries = params.strip("{}").split(",")

    def shifted(entry: str) -> str:
        scale, _, zero_point = entry.strip().partition(":")
        return f"{scale}:{int(zero_point or 0) - offset}"

    body = ",".join(shifted(e) for e in entries)
    return (f"!quant.uniform<i{bits}<{low - offset}:{high - offset}>:{match['expressed']}, "
            + (f"{{{body}}}" if braced else body) + ">")


def _signed_tensor_type(value_type: ir.Type) -> ir.Type | None:
    if value_type.typeid != ir.RankedTensorType.static_typeid:
        return None
    tensor = ir.RankedTensorType(value_type)
    signed = _signed_uniform(str(tensor.element_type))
    return None if signed is None else ir.RankedTensorType.get(tensor.shape, ir.Type.parse(signed))


def _flip_sign_bit(value: ir.Value) -> ir.Value:
    """``value xor 2**(bits-1)``: maps unsigned storage u to the signed storage u - 2**(bits-1) and back."""
    tensor = ir.RankedTensorType(value.type)
    element = ir.IntegerType(tensor.element_type)
    bit = 1 << (element.width - 1)
    mask = ir.IntegerAttr.get(element, bit if element.is_unsigned else -bit)
    splat = stablehlo.constant(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], element), mask))
    return stablehlo.xor(value, stablehlo.broadcast_in_dim(tensor, splat, []))


def sign_quant_storage(module: ir.Module) -> None:
    """Give unsigned-storage quant types signed storage (zero points and range shifted by 2**(bits-1)).

    ``stablehlo-legalize-quant-to-math`` treats ``u8`` storage as signed ``i8`` (it sign-extends and saturates
    at 127). The twin type denotes the same real values, so only the bit casts between storage integers and
    quant types change meaning; they get the sign-bit flip that maps one storage to the other.
    """
    with module.context, ir.Location.unknown(module.context):
        for op in ops_where(module, lambda op: op.name == "stablehlo.bitcast_convert"):
            source, result = op.operands[0], op.results[0]
            if _signed_tensor_type(result.type) is not None and _signed_tensor_type(source.type) is None:
                with ir.InsertionPoint(op):
                    op.operands[0] = _flip_sign_bit(source)
            elif _signed_tensor_type(source.type) is not None and _signed_tensor_type(result.type) is None:
                with ir.InsertionPoint.after(op):
                    flipped = _flip_sign_bit(result)
                result.replace_all_uses_except(flipped, flipped.owner.operation)
        for op in ops_where(module, lambda op: op.name == "stablehlo.constant"):
            if _signed_tensor_type(op.results[0].type) is not None:
                raise NotImplementedError(f"constant with unsigned quantized storage: {op}")
        every_op = ops_where(module, lambda op: True)
        values = [result for op in every_op for result in op.results]
        values += [argument for op in every_op for region in op.regions for block in region.blocks
                   for argument in block.arguments]
        for value in values:
            signed = _signed_tensor_type(value.type)
            if signed is not None:
                value.set_type(signed)
        for function in ops_where(module, lambda op: op.name == "func.func"):
            refresh_function_type(function)


def refresh_function_type(function) -> None:
    """``function``'s type from its entry block's arguments and what its return returns."""
    entry = function.regions[0].blocks[0]
    returned = [op for op in entry.operations if op.name == "func.return"][0]
    function.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in entry.arguments], [v.type for v in returned.operands]))


# -- broadcasts with explicit dims ---------------------------------------------------------------------------

def expand_explicit_broadcasts(module: ir.Module) -> None:
    """Give ``chlo.broadcast_*`` ops with ``broadcast_dimensions`` (emitted for per-axis quant types) operands
    of the result's shape, so that ``chlo-legalize-to-stablehlo``, which rejects non-prefix broadcast
    dimensions, sees plain elementwise ops."""
    found = ops_where(module, lambda op: op.name.startswith("chlo.broadcast_") and "broadcast_dimensions" in op.attributes)
    with module.context:
        for op in found:
            shape = ir.RankedTensorType(op.results[0].type).shape
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            with ir.InsertionPoint(op), op.location:
                for index, operand in enumerate(op.operands):
                    operand_type = ir.RankedTensorType(operand.type)
                    if list(operand_type.shape) != list(shape):
                        op.operands[index] = stablehlo.broadcast_in_dim(
                            ir.RankedTensorType.get(shape, operand_type.element_type), operand,
                            dims if operand_type.rank < len(shape) else list(range(len(shape))))
            del op.attributes["broadcast_dimensions"]
