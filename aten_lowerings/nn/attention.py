"""Attention: scaled_dot_product_attention (masks, causal, scale, grouped-query, dropout).

The decomposition is wrapped in a ``stablehlo.composite`` so a backend can
match the whole op (its attributes: scale, is_causal, enable_gqa) and anything
else runs the decomposition function. Products are ``dot_general`` with the
leading dims as batch dims, broadcast as torch broadcasts them (grouped-query attention, and keys and values
of one head, split the query heads into (kv heads, group) instead of repeating keys and values); the softmax is
computed in float32 for low precision, normalized after the product with
values, and a fully masked row gives zeros, as torch does. With dropout the
op is random, and inlined rather than a composite. Over a long key length with a mask
only the live prefix of the keys is read (``emit.live_prefix``).
"""
from __future__ import annotations

import math

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.composite import composite
from ..emit.contraction import contract
from ..emit.elementwise import compare
from ..emit.live_prefix import bucket_lengths, over_live_prefix
from ..emit.random_bits import dropout_values
from ..emit.reduce import reduce
from ..mlir_types import DYNAMIC, mlir_shape, tensor_type
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..shapes import broadcast_in_dim, broadcast_to, iota, reshape
from ..values import dtype_of, static_shape

aten = torch.ops.aten


# -- the decomposition ------------------------------------------------------------------

def _broadcast_leading(ctx, values, all_sizes, groups: int):
    """Query, key and value with their leading dims broadcast to one shape, as torch broadcasts them (a key and
    value of batch 1, say); the head dim of grouped keys and values (``groups`` > 1) keeps its size. The values
    and their sizes."""
    lead = len(all_sizes[1]) - 2
    common = [next((size for size in sizes if size != 1), 1) for sizes in zip(*(s[:lead] for s in all_sizes))]
    results = []
    for index, (value, sizes) in enumerate(zip(values, all_sizes)):
        target = list(common) + list(sizes[lead:])
        if groups > 1 and index > 0:
            target[lead - 1] = sizes[lead - 1]
        results.append((value if target == list(sizes) else broadcast_to(ctx, value, target), target))
    return zip(*results)


def _attention(ctx, metas, out_metas, query, key, value, mask, scale: float, is_causal: bool, groups: int,
               dropout_p: float = 0.0):
    """Attention output, and with two ``out_metas`` the log-sum-exp, computed in float32 for low precision and
    converted to ``out_metas``' dtypes; with ``dropout_p`` the softmax weights go through dropout (``ctx`` must
    draw random numbers). Over a long static KV cache with a mask, only its live prefix is read
    (``emit.live_prefix``)."""
    (query, key, value), (q_sizes, k_sizes, v_sizes) = _broadcast_leading(
        ctx, (query, key, value), [list(m.shape) for m in metas], groups)

    def attend(mask, keys):
        key, value = keys
        length = static_shape(key)[-2]  # a bucket's (emit.live_prefix) where static
        sizes = [s if length == DYNAMIC else s[:-2] + [length] + s[-1:] for s in (k_sizes, v_sizes)]
        results = _products(ctx, query, key, value, mask, q_sizes, *sizes, scale, is_causal, groups,
                            len(out_metas), dropout_p)
        return [convert(r, m.dtype) for r, m in zip(results, out_metas)]

    lengths = [] if is_causal or dropout_p else bucket_lengths(mask, [key, value])
    if not lengths:
        return attend(mask, [key, value])
    return over_live_prefix(ctx, mask, _mask_sizes(ctx), [key, value], [k_sizes, v_sizes], lengths,
                            [tensor_type(m.shape, m.dtype) for m in out_metas], attend)


def _mask_sizes(ctx) -> list:
    """The torch sizes of the node's attention mask (``attn_mask``, by keyword or fourth positional argument)."""
    node = ctx.node
    mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
    return list(mask.meta["val"].shape)


def _products(ctx, query, key, value, mask, q_sizes, k_sizes, v_sizes, scale: float, is_causal: bool,
              groups: int, outputs: int, dropout_p: float):
    """The decomposition over keys and values as they are (float32 for low precision)."""
    dtype = compute_dtype(dtype_of(query))
    length, source = q_sizes[-2], k_sizes[-2]
    batch = len(k_sizes) - 2  # leading dims, the kv head dim included
    rows = ([groups] if groups > 1 else []) + [length]
    if groups > 1:
        query = reshape(ctx, query, k_sizes[:-2] + rows + [q_sizes[-1]])
    scores_sizes = k_sizes[:-2] + rows + [source]
    scores = contract(query, key, range(batch), range(batch),
                      [batch + len(rows)], [batch + 1], mlir_shape(scores_sizes), dtype)
    scores = stablehlo.multiply(scores, full_like(ctx, scores_sizes, scale, dtype))
    if mask is not None:
        full_mask = reshape(ctx, broadcast_to(ctx, mask, q_sizes[:-1] + [source]), scores_sizes)
        scores = _apply_mask(ctx, scores, full_mask, scores_sizes)
    if is_causal:
        causal = compare(iota(ctx, [length, source], 1), iota(ctx, [length, source], 0), "LE")
        rank = len(scores_sizes)
        scores = _apply_mask(ctx, scores, broadcast_in_dim(ctx, causal, scores_sizes, [rank - 2, rank - 1]),
                             scores_sizes)
    return _softmax_times_values(ctx, scores, scores_sizes, value, v_sizes, q_sizes, batch, outputs, dropout_p)


def _apply_mask(ctx, scores, mask, sizes):
    """A bool mask keeps the scores where it is true (the rest become -inf); a float mask is added."""
    if dtype_of(mask) == torch.bool:
        return stablehlo.select(mask, scores, full_like(ctx, sizes, float("-inf"), dtype_of(scores)))
    return stablehlo.add(scores, convert(mask, dtype_of(scores)))


def _softmax_times_values(ctx, scores, scores_sizes, value, v_sizes, q_sizes, batch, outputs, dropout_p=0.0):
    dtype = dtype_of(scores)
    rows_sizes, row_dims = scores_sizes[:-1], list(range(len(scores_sizes) - 1))
    row_max = reduce(ctx, scores, [len(scores_sizes) - 1], float("-inf"), stablehlo.maximum)
    zeros = full_like(ctx, rows_sizes, 0, dtype)
    row_max = stablehlo.select(compare(row_max, full_like(ctx, rows_sizes, float("-inf"), dtype), "EQ"),
                               zeros, row_max)  # a fully masked row: exp(-inf - 0) = 0, not NaN
    weights = stablehlo.exponential(stablehlo.subtract(scores, broadcast_in_dim(ctx, row_max, scores_sizes,
                                                                                row_dims)))
    total = reduce(ctx, weights, [len(scores_sizes) - 1], 0, stablehlo.add)
    total = stablehlo.select(compare(total, zeros, "EQ"), full_like(ctx, rows_sizes, 1, dtype), total)
    out_sizes = rows_sizes + [v_sizes[-1]]
    if dropout_p:  # dropout of the softmax: the unnormalized weights, divided by the total below
        weights = dropout_values(ctx, weights, dropout_p, scores_sizes, dtype)[0]
    if len(q_sizes) == 4 and q_sizes[-1] == v_sizes[-1]:
        # torch runs these shapes with its CPU flash kernel, which rounds the exponentials to the
        # inputs' dtype before the product with values (its math fallback stays in float32)
        weights = convert(weights, dtype_of(value))
    out = contract(weights, value, range(batch), range(batch), [len(scores_sizes) - 1], [batch],
                   mlir_shape(out_sizes), dtype_of(weights))
    out = stablehlo.divide(out, broadcast_in_dim(ctx, total, out_sizes, row_dims))
    ctx.dims.note(out, out_sizes)  # so the reshape below, to the same sizes without grouped heads, is none
    results = [reshape(ctx, out, q_sizes[:-1] + [v_sizes[-1]])]
    if outputs == 2:
        results.append(reshape(ctx, stablehlo.add(row_max, stablehlo.log(total)), q_sizes[:-1]))
    return results


# -- the ops ---------------------------------------------------------------------------------

def _options(ctx, scale, enable_gqa) -> tuple[float, int]:
    """The scale (default 1/sqrt(E)) and the query-head group size, after checking what is supported."""
    q_sizes, k_sizes = ctx.arg_meta(0).shape, ctx.arg_meta(1).shape
    if scale is None:
        if not isinstance(q_sizes[-1], int):
            raise NotImplementedError("attention with a dynamic head size needs an explicit scale")
        scale = 1 / math.sqrt(q_sizes[-1])
    if len({len(q_sizes), len(k_sizes), len(ctx.arg_meta(2).shape)}) > 1:
        raise NotImplementedError("attention over query, key and value of different ranks")
    groups = 1
    if len(q_sizes) > 2 and (enable_gqa or (k_sizes[-3] == 1 and q_sizes[-3] != 1)):
        # grouped-query attention, and keys and values of one head broadcast over the query's (multi-query
        # attention without enable_gqa): the query heads split into (kv heads, group), no repeat of keys
        heads, kv_heads = q_sizes[-3], k_sizes[-3]
        if not (isinstance(heads, int) and isinstance(kv_heads, int)):
            raise NotImplementedError("grouped-query attention with a dynamic number of heads")
        groups = heads // kv_heads
    return scale, groups


def _attention_composite(ctx, name, query, key, value, mask, scale, is_causal, groups, outputs: int):
    metas = [ctx.arg_meta(i) for i in range(3)]
    operands = [query, key, value] + ([mask] if mask is not None else [])
    attributes = {"scale": ir.FloatAttr.get(ir.F64Type.get(), scale), "is_causal": ir.BoolAttr.get(is_causal),
                  "enable_gqa": ir.BoolAttr.get(groups > 1)}
    out_metas = list(ctx.out_meta) if outputs > 1 else [ctx.out_meta]

    def body(body_ctx, query, key, value, mask=None):
        return _attention(body_ctx, metas, out_metas, query, key, value, mask, scale, is_causal, groups)

    return composite(ctx, name, operands, metas, attributes, [tensor_type(m.shape, m.dtype) for m in out_metas],
                      body)


@lower(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    scale, groups = _options(ctx, scale, enable_gqa)
    # no composite where it is random (its decomposition function could not reach the rng_seed argument)
    if dropout_p:
        metas = [ctx.arg_meta(i) for i in range(3)]
        return _attention(ctx, metas, [ctx.out_meta], query, key, value, attn_mask, scale, is_causal, groups,
                          dropout_p)[0]
    return _attention_composite(ctx, "torch.aten.scaled_dot_product_attention", query, key, value, attn_mask,
                                scale, is_causal, groups, outputs=1)


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_for_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """Output and log-sum-exp (0 for a fully masked row, as torch's kernel)."""
    if dropout_p != 0:
        raise NotImplementedError(f"flash attention with dropout_p={dropout_p} (scaled_dot_product_attention "
                                  f"with dropout is lowered)")
    scale, _ = _options(ctx, scale, False)
    return _attention_composite(ctx, "torch.aten._scaled_dot_product_flash_attention_for_cpu", query, key, value,
                                attn_mask, scale, is_causal, 1, outputs=2)
