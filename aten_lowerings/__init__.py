"""ATen -> StableHLO lowering rules: a registry and one module per op family.

Importing this package registers every family.
"""
from . import (  # noqa: F401  (each import registers its rules)
    activations,
    attention,
    conv_pool,
    creation,
    elementwise,
    higher_order,
    indexing,
    linalg,
    normalization,
    quantized,
    reductions,
    shape_ops,
)
from .registry import LOWERINGS, lower, lowering_for

__all__ = ["LOWERINGS", "lower", "lowering_for"]
