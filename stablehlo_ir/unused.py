"""Erasing ops whose results nothing reads, as the walk leaves them (a reshape of a reshape reads the first one's
operand, a size computed for a shape that folded away, ...). Only ops without effects go: custom calls,
collectives, control flow and anything outside StableHLO/CHLO stay, whether read or not."""
from __future__ import annotations

from typing import Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from .mlir_context import make_context
from .refine import main_function
from .rewrites import refresh_function_type

_KEPT = {"stablehlo.custom_call", "stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed",
         "stablehlo.after_all", "stablehlo.optimization_barrier", "stablehlo.all_reduce", "stablehlo.all_gather",
         "stablehlo.all_to_all", "stablehlo.reduce_scatter", "stablehlo.collective_permute",
         "stablehlo.collective_broadcast", "stablehlo.while", "stablehlo.if", "stablehlo.case",
         "stablehlo.composite"}


def erase_unused(block: ir.Block) -> None:
    """Erase the effect-free ops in ``block`` (and the blocks nested in its ops) whose results are never read.
    One pass from the end: an op's readers come after it, so a chain goes at once."""
    for op in reversed(list(block.operations)):
        operation = op.operation
        for region in operation.regions:
            for inner in region.blocks:
                erase_unused(inner)
        name = operation.name
        if (operation.results and name.startswith(("stablehlo.", "chlo.")) and name not in _KEPT
                and not any(True for result in operation.results for _ in result.uses)):
            operation.erase()


def results_only(mlir_text: str, keep: Sequence[int]) -> str:
    """``mlir_text`` whose ``@main`` returns only its results at ``keep`` (in that order), the ops nothing then
    reads erased: e.g. the sizes a module computes, without the tensors it makes of them."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(mlir_text)
        main = main_function(module)
        block = main.regions[0].blocks[0]
        returned = next(op for op in block.operations if op.operation.name == "func.return")
        with ir.InsertionPoint(returned):
            func.ReturnOp([returned.operands[i] for i in keep])
        returned.operation.erase()
        erase_unused(block)
        refresh_function_type(main)
        return module.operation.get_asm(enable_debug_info=True)
