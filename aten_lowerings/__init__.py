"""ATen -> StableHLO lowering rules: a registry and one module per op family.

Importing this package registers every family.
"""
from . import (  # noqa: F401  (each import registers its rules)
    activations,
    attention,
    backward,
    bessel,
    control_flow,
    conv_pool,
    creation,
    data_dependent,
    distance,
    elementwise,
    fft,
    higher_order,
    indexing,
    linalg,
    linalg_factor,
    linalg_solvers,
    linear_cross_entropy,
    normalization,
    padding,
    polynomials,
    quantized,
    random_ops,
    reductions,
    sampling,
    scalars,
    scatter_ops,
    sharding,
    resampling,
    shape_ops,
    sorting,
    special,
    special_math,
)
from .registry import LOWERINGS, lower, lowering_for

__all__ = ["LOWERINGS", "lower", "lowering_for"]
