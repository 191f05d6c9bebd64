"""ATen -> StableHLO lowering rules: a registry, one module per op family (the families grouped by kind in
``elementwise``, ``shape``, ``linalg`` and ``nn``), and the shared emitters the families build on (``emit``).

Importing this package registers every family. What the exporter needs is here: the registry, the context a rule
sees, the padded sizes of data-dependent results, the random-seed argument, and the constant and while-loop
emitters a module built outside the graph walk (a generate loop) uses.
"""
from . import (  # noqa: F401  (each import registers its rules)
    composite_marks,
    control_flow,
    data_dependent,
    elementwise,
    higher_order,
    linalg,
    nn,
    quantized,
    random_ops,
    reductions,
    shape,
    sharding_marks,
    sorting,
    traced_kernels,
)
from .emit.padded import PaddedDims, call_time_sizes, fills_padding, is_padded, keeps_padding, padding_filled
from .emit.random_bits import RANDOM_OPS, RNG_SEED_DTYPE, RNG_SEED_NAME, seeded_key, uses_random
from .composite_marks import COMPOSITE_CALL, MARK as COMPOSITE_MARK
from .constants import constant
from .context import LoweringContext
from .value_facts import ValueFacts
from .emit.loops import while_loop
from .emit.platform_case import per_platform
from .mlir_types import tensor_type
from .registry import LOWERINGS, USER_LOWERINGS, lower, lowering_for, op_name, scoped_user_lowerings
from .user_ops import USER_FUNCTIONS, UserRule, jax_rule, lowered_target
from .sharding_marks import mark_sharding, spec_of

__all__ = ["LOWERINGS", "lower", "lowering_for", "op_name", "LoweringContext", "ValueFacts", "tensor_type", "PaddedDims",
           "is_padded", "keeps_padding", "fills_padding", "padding_filled", "call_time_sizes", "RANDOM_OPS",
           "RNG_SEED_NAME", "RNG_SEED_DTYPE", "seeded_key", "uses_random",
           "mark_sharding", "spec_of", "constant", "while_loop", "USER_LOWERINGS", "scoped_user_lowerings", "jax_rule",
           "UserRule", "lowered_target", "COMPOSITE_CALL", "COMPOSITE_MARK", "USER_FUNCTIONS", "per_platform"]
