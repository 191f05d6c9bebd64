"""Shape refinement: a module with symbolic (``?``) dims specialised to the static shapes of one call.

The recipe is JAX's (``refine_polymorphic_shapes``) and StableHLO's: give ``@main`` the call's
static argument types, each wrapped in ``stablehlo.shape_refinement_operand_wrapper`` so the
body still verifies (what ``stablehlo-refine-arguments`` emits; done here because that pass
parses its types from a comma-separated option that quant types, with commas inside, break),
then ``stablehlo-refine-shapes`` propagates the static types through the body and into called
functions, and ``stablehlo-canonicalize-dynamism`` turns the ``dynamic_*`` ops, whose shape
operands are now constants, into their static forms. Composites become calls of their
decomposition first: ``stablehlo-refine-shapes`` refines callees but not decompositions (XLA
inlines them anyway). The result is checked to have no ``?`` left.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context
from .passes import run_pipeline
from .rewrites import ops_where

REFINE = ("builtin.module(func.func(stablehlo-legalize-composite-to-call),stablehlo-refine-shapes,"
          "func.func(stablehlo-canonicalize-dynamism),canonicalize)")
_WRAPPER = "stablehlo.shape_refinement_operand_wrapper"


class ShapeRefinementError(ValueError):
    """The module cannot be specialised to the given shapes (a size the program's arithmetic rejects)."""


def main_function(module: ir.Module):
    """The ``@main`` func.func of ``module``."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise ValueError("the module has no @main function")


def shapes_key(shapes: Sequence[Sequence[int]]) -> str:
    """A text naming a list of static shapes, for cache keys: ``2x3,4,`` (a 0-d shape is empty)."""
    return ",".join("x".join(str(int(d)) for d in shape) for shape in shapes)


def refine_shapes(mlir_text: str, shapes: Sequence[Sequence[int]]) -> str:
    """``mlir_text`` with ``@main``'s arguments of the static ``shapes`` (one per argument, in order) and every
    dynamic type inside refined from them; raises ShapeRefinementError if a dim stays dynamic or the
    shapes contradict the program."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(mlir_text)
        _set_argument_shapes(main_function(module), shapes)
        try:
            run_pipeline(module, REFINE)
        except ir.MLIRError as error:
            raise ShapeRefinementError(
                f"cannot specialise the module to input shapes {[list(s) for s in shapes]}: {error}") from None
        text = module.operation.get_asm(enable_debug_info=True)
        dynamic = _dynamic_values(module)
        if dynamic:
            raise ShapeRefinementError(
                f"after specialising to input shapes {[list(s) for s in shapes]}, {len(dynamic)} op(s) still have "
                f"dynamic shapes, e.g. {dynamic[0]}")
        return text


def _set_argument_shapes(main, shapes: Sequence[Sequence[int]]) -> None:
    block = main.regions[0].blocks[0]
    if len(shapes) != len(block.arguments):
        raise ShapeRefinementError(f"@main takes {len(block.arguments)} arguments, got {len(shapes)} shapes")
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint.at_block_begin(block):
        for index, (argument, shape) in enumerate(zip(block.arguments, shapes)):
            declared = ir.RankedTensorType(argument.type)
            shape = [int(d) for d in shape]
            if len(shape) != declared.rank or any(
                    not ir.ShapedType.is_dynamic_size(want) and want != got for want, got in zip(declared.shape, shape)):
                raise ShapeRefinementError(f"@main argument {index} has type {declared}, got shape {shape}")
            if list(declared.shape) == shape:
                continue
            argument.set_type(ir.RankedTensorType.get(shape, declared.element_type))
            shape_type = ir.RankedTensorType.get([len(shape)], i64)
            shape_value = stablehlo.constant(ir.DenseElementsAttr.get(np.asarray(shape, dtype="int64"), type=shape_type))
            wrapper = stablehlo.CustomCallOp([declared], [argument, shape_value], _WRAPPER)
            wrapper.attributes["indices_of_shape_operands"] = ir.DenseElementsAttr.get(
                np.asarray([1], dtype="int64"), type=ir.RankedTensorType.get([1], i64))
            argument.replace_all_uses_except(wrapper.result, wrapper.operation)
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    main.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], function_type.results))


def _dynamic_values(module: ir.Module) -> list[str]:
    return [op.name for op in ops_where(module, _has_dynamic_type)]


def _has_dynamic_type(op) -> bool:
    """Whether a result of ``op``, or an argument of one of its blocks, is a tensor with a ``?`` dim."""
    types = [r.type for r in op.results] + [a.type for region in op.regions for b in region.blocks
                                             for a in b.arguments]
    return any(t.typeid == ir.RankedTensorType.static_typeid and not ir.RankedTensorType(t).has_static_shape
               for t in types)
