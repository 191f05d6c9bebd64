"""How many operations a module holds, by name (nested regions included)."""
from __future__ import annotations

import re
from collections import Counter

from jaxlib.mlir import ir

from .mlir_context import make_context
from .rewrites import ops_where

_STABLEHLO_OP = re.compile(r"^(stablehlo|chlo)\.")


def op_histogram(mlir_text: str) -> Counter:
    """How many times each operation occurs in the module, nested regions included (the module itself not)."""
    with make_context() as context:
        module = ir.Module.parse(mlir_text, context)  # held while walked
        counts = Counter(op.name for op in ops_where(module, lambda op: True))
    del counts["builtin.module"]
    return counts


def count_ops(mlir_text: str) -> int:
    """StableHLO (and CHLO) operations in the module, including those nested in regions (e.g. reduce bodies)."""
    return sum(count for name, count in op_histogram(mlir_text).items() if _STABLEHLO_OP.match(name))
