"""Random numbers: the program's ``rng_seed`` argument, which ops draw from it, and the bit streams, uniform
samples and dropout masks the random ops and attention with dropout draw.

Bits come from ``stablehlo.rng_bit_generator`` (THREE_FRY) started from ``ctx.rng_key()``: the program's
``rng_seed`` argument and the node's own number, so two random nodes draw different numbers and one seed
reproduces them all. ``rng_bit_generator`` has no shape operand, so a tensor of symbolic size (a dynamic dim, a
data-dependent one held padded) draws counter-based bits instead: SplitMix64 of each element's row-major index
from a stream that the same key selects (elementwise ops over a ``dynamic_iota``, which shape refinement
specialises like any other). Uniform floats in [0, 1) take the bits as a mantissa.
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import constant, full_like
from ..mlir_types import tensor_type
from ..promotion import convert
from ..shapes import broadcast_in_dim, iota, is_static, reshape
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
    """Random unsigned words (``uint32`` or ``uint64``) of torch sizes ``sizes`` from this node's key."""
    key = ctx.rng_key()
    if not is_static(sizes):
        return _counter_bits(ctx, key, sizes, dtype)
    return stablehlo.rng_bit_generator(key.type, tensor_type(sizes, dtype),
                                       stablehlo.RngAlgorithmAttr.get("THREE_FRY"), key)[1]


def _word(number: int) -> int:
    """A 64-bit word as MLIR's ``ui64`` attributes take it: two's complement in a signed int."""
    return number - 2 ** 64 if number >= 2 ** 63 else number


_GOLDEN = _word(0x9E3779B97F4A7C15)  # SplitMix64's increment (2**64 / golden ratio)


def _splitmix(ctx, sizes, z: ir.Value) -> ir.Value:
    """SplitMix64's output function (Steele, Lea, Flood 2014) on ``uint64`` words of torch sizes ``sizes``."""
    for shift, factor in ((30, _word(0xBF58476D1CE4E5B9)), (27, _word(0x94D049BB133111EB))):
        z = stablehlo.multiply(stablehlo.xor(z, stablehlo.shift_right_logical(z, full_like(ctx, sizes, shift,
                                                                                              torch.uint64))),
                               full_like(ctx, sizes, factor, torch.uint64))
    return stablehlo.xor(z, stablehlo.shift_right_logical(z, full_like(ctx, sizes, 31, torch.uint64)))


def _counter_bits(ctx, key: ir.Value, sizes, dtype: torch.dtype) -> ir.Value:
    """Words of symbolic ``sizes``: element ``i`` (row-major) is ``splitmix(stream + (i + 1) * golden)``, the
    stream ``splitmix(seed + number * golden)`` of the key ``[seed, number]``."""
    seed, number = (stablehlo.reshape(tensor_type([], torch.uint64), stablehlo.slice(key, [i], [i + 1], [1]))
                    for i in (0, 1))
    stream = _splitmix(ctx, [], stablehlo.add(seed, stablehlo.multiply(number, constant(_GOLDEN, torch.uint64))))
    index = stablehlo.add(reshape(ctx, iota(ctx, [math.prod(sizes)], 0, torch.uint64), sizes), full_like(ctx, sizes, 1,
                                                                                                torch.uint64))
    state = stablehlo.add(broadcast_in_dim(ctx, stream, sizes, []),
                          stablehlo.multiply(index, full_like(ctx, sizes, _GOLDEN, torch.uint64)))
    words = _splitmix(ctx, sizes, state)
    if dtype == torch.uint64:
        return words
    high = stablehlo.shift_right_logical(words, full_like(ctx, sizes, 32, torch.uint64))
    return convert(high, dtype)


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
