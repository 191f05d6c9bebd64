"""ATen -> StableHLO lowering rules: a registry and one module per op family.

Importing this package registers every family.
"""
from . import (  # noqa: F401  (each import registers its rules)
    activations,
    attention,
    backward,
    conv_pool,
    creation,
    distance,
    elementwise,
    fft,
    higher_order,
    indexing,
    linalg,
    linalg_factor,
    normalization,
    padding,
    quantized,
    reductions,
    sampling,
    scalars,
    resampling,
    shape_ops,
    sorting,
    special,
)
from .registry import LOWERINGS, lower, lowering_for

__all__ = ["LOWERINGS", "lower", "lowering_for"]
