"""Random numbers: the program's ``rng_seed`` argument, which ops draw from it, and the bit streams, uniform
samples and dropout masks the random ops and attention with dropout draw.

Bits come from ``stablehlo.rng_bit_generator`` (THREE_FRY) started from ``ctx.rng_key()``: the program's
``rng_seed`` argument and the node's own number, so two random nodes draw different numbers and one seed
reproduces them all. Uniform floats in [0, 1) take the bits as a mantissa.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..mlir_types import tensor_type
from ..promotion import convert
from ..shapes import is_static
from .elementwise import compare

aten = torch.ops.aten

RNG_SEED_NAME, RNG_SEED_DTYPE = "rng_seed", torch.int64  # @main's extra argument where a graph draws numbers

# float64 takes 52 mantissa bits from 64-bit words, every other float 23 from 32-bit words (then rounds)
_WORDS = {torch.float64: (torch.uint64, 12, 0x3FF0000000000000)}
_FLOAT32_WORDS = (torch.uint32, 9, 0x3F800000)


def seeded_key(seed: ir.Value, number: int) -> ir.Value:
    """THREE_FRY state ``[seed, number]`` (``tensor<2xui64>``) from a 0-d integer seed value."""
    one = tensor_type([1], torch.uint64)
    seed = stablehlo.reshape(one, convert(seed, torch.uint64))
    return stablehlo.concatenate([seed, constant(number, torch.uint64, [1])], 0)


def random_bits(ctx, sizes, dtype: torch.dtype) -> ir.Value:
    """Random unsigned words of torch sizes ``sizes`` (static) from this node's key."""
    if not is_static(sizes):
        raise NotImplementedError("random tensors of symbolic size")
    key = ctx.rng_key()
    return stablehlo.rng_bit_generator(key.type, tensor_type(sizes, dtype),
                                       stablehlo.RngAlgorithmAttr.get("THREE_FRY"), key)[1]


def _below_one(dtype: torch.dtype) -> float:
    return torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()


def uniform_values(ctx, sizes, dtype: torch.dtype) -> ir.Value:
    """Uniform samples in [0, 1): random mantissa bits under the exponent of 1.0, minus 1."""
    word, shift, one = _WORDS.get(dtype, _FLOAT32_WORDS)
    float_type = torch.float64 if dtype == torch.float64 else torch.float32
    bits = stablehlo.shift_right_logical(random_bits(ctx, sizes, word), full_like(ctx, sizes, shift, word))
    mantissa = stablehlo.or_(bits, full_like(ctx, sizes, one, word))
    value = stablehlo.subtract(stablehlo.bitcast_convert(tensor_type(sizes, float_type), mantissa),
                               full_like(ctx, sizes, 1.0, float_type))
    if dtype == float_type:
        return value
    return stablehlo.minimum(convert(value, dtype), full_like(ctx, sizes, _below_one(dtype), dtype))  # no 1.0


def keep_mask(ctx, sizes, p: float) -> ir.Value:
    """True with probability 1 - p (torch's ``bernoulli_(1 - p)`` dropout noise), of torch sizes ``sizes``."""
    return compare(uniform_values(ctx, sizes, torch.float32), full_like(ctx, sizes, p, torch.float32), "GE")


def dropout_values(ctx, x, p, sizes, dtype):
    """(output, keep mask): each element of ``x`` (torch sizes ``sizes``, static) zeroed with probability ``p``,
    the rest scaled by 1 / (1 - p), in ``dtype``."""
    keep = keep_mask(ctx, sizes, p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    kept = stablehlo.multiply(convert(x, dtype), full_like(ctx, sizes, scale, dtype))
    return stablehlo.select(keep, kept, full_like(ctx, sizes, 0, dtype)), keep


# -- which graphs draw numbers (and so take the rng_seed argument) ----------------------------------------------

RANDOM_OPS = frozenset({
    aten.rand.default, aten.rand_like.default, aten.randn.default, aten.randn_like.default, aten.uniform.default,
    aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, aten.normal.float_float,
    aten.normal_functional.default, aten.bernoulli.default, aten.bernoulli.p, aten.randint.low,
    aten.randint.default, aten.randint_like.default, aten.randint_like.low_dtype, aten.randperm.default,
    aten.randperm.generator,
    aten.native_dropout.default, aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
    aten.feature_alpha_dropout.default, aten.rrelu_with_noise_functional.default, aten.geometric.default,
    aten.multinomial.default, aten.scaled_dot_product_attention.default})

# where a node of these ops draws nothing: the position of its train flag (dropout_p for attention)
_TRAIN_ARGUMENT = {aten.native_dropout.default: 2, aten.dropout.default: 2, aten.feature_dropout.default: 2,
                   aten.alpha_dropout.default: 2, aten.feature_alpha_dropout.default: 2,
                   aten.rrelu_with_noise_functional.default: 4, aten.scaled_dot_product_attention.default: 4}
_TRAIN_DEFAULT = {aten.rrelu_with_noise_functional.default: False, aten.scaled_dot_product_attention.default: 0.0}


def uses_random(graph_module: torch.fx.GraphModule) -> bool:
    """Whether the graph draws random numbers (and so needs the ``rng_seed`` argument)."""
    return any(node.target in RANDOM_OPS and not _draws_nothing(node) for node in graph_module.graph.nodes)


def _draws_nothing(node: torch.fx.Node) -> bool:
    """A dropout (or rrelu) in eval mode, or attention without dropout."""
    position = _TRAIN_ARGUMENT.get(node.target)
    if position is None:
        return False
    default = _TRAIN_DEFAULT.get(node.target)
    flag = node.args[position] if len(node.args) > position else node.kwargs.get(
        node.target._schema.arguments[position].name, default)
    return flag is False or flag == 0
