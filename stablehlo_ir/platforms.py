"""A module lowered for several platforms, as ``jax.export`` makes one: ``@main``'s first argument is the platform
index (a 0-d i32: the position, among the module's platforms, of the one it runs on; marked
``jax.global_constant = "_platform_index"`` as JAX marks it), and ``stablehlo.case`` ops on it choose each
platform's code where the lowerings differ.

XlaCallModule and ``jax.export``'s ``Exported.call`` pass that index themselves. ``for_platform`` fixes it to one
platform's constant, as XlaCallModule does before it compiles, so XLA drops the other platforms' branches: their
custom calls (a CUDA kernel, cuSOLVER) have no handler on the runtime that runs this one, and XLA refuses to
compile them even in a branch never taken.
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context
from .refine import main_function
from .rewrites import ops_where

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
"""The platforms a module may be lowered for: JAX's names (XlaCallModule takes them upper-cased)."""

JAX_PLATFORM_INDEX = "_platform_index"
GLOBAL_CONSTANT = "jax.global_constant"
"""The argument attribute JAX marks its platform index (and dimension variables) with, naming it."""


def platform_index_attributes() -> dict[str, ir.Attribute]:
    """The attributes of ``@main``'s platform index argument, as JAX marks it."""
    return {GLOBAL_CONSTANT: ir.StringAttr.get(JAX_PLATFORM_INDEX)}


def for_platform(mlir_text: str, index: int) -> str:
    """``mlir_text`` with ``@main``'s platform index argument removed and each use of it the constant ``index``."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(mlir_text)
        main = main_function(module)
        block = main.regions[0].blocks[0]
        with ir.InsertionPoint.at_block_begin(block):
            constant = stablehlo.constant(ir.DenseElementsAttr.get(np.asarray(index, dtype=np.int32),
                                                                   type=block.arguments[0].type))
        block.arguments[0].replace_all_uses_with(constant)
        block.erase_argument(0)
        signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(signature.inputs[1:],
                                                                              signature.results))
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(list(ir.ArrayAttr(main.attributes["arg_attrs"]))[1:])
        return module.operation.get_asm(enable_debug_info=True)


def cases_as_ifs(module: ir.Module) -> ir.Module:
    """``module`` with each ``stablehlo.case`` made a chain of ``stablehlo.if`` on its index (``index == 0``: the
    first branch, else ``index == 1``: the second, ..., else the last, as the case runs an index out of range).
    TensorFlow's XlaCallModule (2.21) refines the shapes of functions called in an if's branches, not in a
    case's, so a dynamic module it takes holds ifs."""
    for case in ops_where(module, lambda op: op.name == "stablehlo.case" and len(op.regions) > 1):
        with ir.InsertionPoint(case), case.location:
            results = _if_chain(case.operands[0], list(case.regions), [r.type for r in case.results])
        for old, new in zip(case.results, results):
            old.replace_all_uses_with(new)
        case.erase()
    return module


def _if_chain(index: ir.Value, branches: list, types: list, first: int = 0) -> list:
    """The results of ``if index == first {branches[0]} else {the chain of the other branches}``, emitted at the
    current insertion point (two branches at least); each branch's block is moved into its place."""
    constant = stablehlo.constant(ir.DenseElementsAttr.get(np.asarray(first, dtype=np.int32), type=index.type))
    chosen = stablehlo.IfOp(types, stablehlo.compare(index, constant, stablehlo.ComparisonDirectionAttr.get("EQ")))
    branches[0].blocks[0].append_to(chosen.true_branch)
    if len(branches) == 2:
        branches[1].blocks[0].append_to(chosen.false_branch)
    else:
        with ir.InsertionPoint(chosen.false_branch.blocks.append()):
            stablehlo.return_(_if_chain(index, branches[1:], types, first + 1))
    return list(chosen.results)
