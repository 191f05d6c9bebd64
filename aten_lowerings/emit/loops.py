"""``stablehlo.while`` from Python callables: a loop that carries same-typed values."""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo


def while_loop(initial: list, condition, body) -> list:
    """``stablehlo.while`` over same-typed values: ``condition(*values)`` a 0-d bool, ``body(*values)`` the next."""
    types = [v.type for v in initial]
    op = stablehlo.WhileOp(types, initial)
    for region, build in ((op.cond, lambda args: [condition(*args)]), (op.body, lambda args: body(*args))):
        block = region.blocks.append(*types)
        with ir.InsertionPoint(block):
            stablehlo.return_(build(list(block.arguments)))
    return list(op.results)
