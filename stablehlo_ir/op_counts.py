"""How many operations a module holds, by name (nested regions included)."""
from __future__ import annotations

import re
from collections import Counter

from jaxlib.mlir import ir

from .mlir_context import make_context

_STABLEHLO_OP = re.compile(r"^(stablehlo|chlo)\.")


def op_histogram(mlir_text: str) -> Counter:
    """How many times each operation occurs in the module, nested regions included (the module itself not)."""
    counts: Counter = Counter()

    def visit(op):
        counts[op.name] += 1
        return ir.WalkResult.ADVANCE

    with make_context() as context:
        module = ir.Module.parse(mlir_text, context)  # held while walked
        module.operation.walk(visit)
    del counts["builtin.module"]
    return counts


def count_ops(mlir_text: str) -> int:
    """StableHLO (and CHLO) operations in the module, including those nested in regions (e.g. reduce bodies)."""
    return sum(count for name, count in op_histogram(mlir_text).items() if _STABLEHLO_OP.match(name))
