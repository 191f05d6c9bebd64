"""Ops lowered through a torch kernel (their composite implicit kernel, or our ATen form of a fused one such as
``_native_multi_head_attention``): the kernel traced (``make_fx``) on the node's static shapes into ATen ops, and
that graph lowered inline, as ``run_decompositions`` would decompose the op but for
this node alone (``run_decompositions`` re-traces the whole program, and refuses programs whose lifted constants
are written in place, such as transformers' static KV cache exported with strict=False).

torchao's affine quantization primitives, which torch.export keeps in the graph of a model quantized with
torchao (``Int8DynamicActivationInt8WeightConfig``: the activation's per-row scale and int8 values;
``IntxWeightOnlyConfig``: group-wise weights dequantized): their kernels are torch's semantics exactly.
"""
from __future__ import annotations

import torch
from jaxlib.mlir import ir
from torch._export.utils import _get_decomp_for_cia
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from .registry import lower

aten = torch.ops.aten

TORCHAO_AFFINE = ("torchao.choose_qparams_affine.default", "torchao.quantize_affine.default",
                  "torchao.dequantize_affine.default")


@lower(*TORCHAO_AFFINE)
def composite(ctx, *args, **kwargs):
    return _lower_traced(ctx, _get_decomp_for_cia(ctx.node.target), args, kwargs, _divide_in_float64)


@lower(aten._native_multi_head_attention.default)
def native_multi_head_attention(ctx, *args, **kwargs):
    """``torch._native_multi_head_attention`` (``nn.MultiheadAttention``'s inference fast path) through
    ``_multi_head_attention``, its semantics in ATen ops."""
    return _lower_traced(ctx, _multi_head_attention, args, kwargs)


def _multi_head_attention(query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                          mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """Batch-first (B, L, E) attention: the packed in-projection, per-head softmax(q k^T / sqrt(d)) with the
    masked positions (a bool mask, True where masked: ``mask_type`` 0 an (L, S) attention mask, 1 a (B, S) key
    padding mask, 2 one of (B, H, L, S)) set to 0 after the softmax, as torch's masked softmax does, and the
    out-projection; the weights averaged over heads where asked, an empty tensor when not needed."""
    batch, length, _ = query.shape
    head = embed_dim // num_heads
    weights = qkv_weight.split(embed_dim)
    biases = qkv_bias.split(embed_dim)

    def heads(x, i):
        return torch.nn.functional.linear(x, weights[i], biases[i]).view(batch, -1, num_heads, head).transpose(1, 2)

    q, k, v = heads(query, 0), heads(key, 1), heads(value, 2)
    scores = (q / head ** 0.5) @ k.transpose(-2, -1)
    if mask is not None:
        masked = mask.view(batch, 1, 1, -1) if mask_type == 1 else mask
        scores = scores.masked_fill(masked, float("-inf"))
    probabilities = scores.softmax(-1)
    if mask is not None:
        probabilities = probabilities.masked_fill(masked, 0.0)
    attended = (probabilities @ v).transpose(1, 2).reshape(batch, length, embed_dim)
    output = torch.nn.functional.linear(attended, proj_weight, proj_bias)
    if not need_weights:
        return output, query.new_empty(0)
    return output, probabilities.mean(1) if average_attn_weights else probabilities


def _lower_traced(ctx, kernel, args, kwargs, rewrite=None):
    """``kernel`` (torch ops) on the node's arguments, traced (``make_fx``) on their static shapes and lowered
    inline; ``rewrite`` edits the traced graph first."""
    tensors = [index for index, a in enumerate(args) if isinstance(a, ir.Value)]

    def traced(*values):
        given = dict(zip(tensors, values))
        return kernel(*[given.get(index, a) for index, a in enumerate(args)], **kwargs)

    examples = [_example(ctx, index) for index in tensors]
    fake_mode = detect_fake_mode(examples)
    if fake_mode is None:
        graph_module = make_fx(traced)(*examples)
    else:  # symbolic sizes: traced on the node's own fakes, so the graph's sizes are the program's expressions
        with fake_mode:
            graph_module = make_fx(traced, tracing_mode="real")(*examples)
    if rewrite is not None:
        rewrite(graph_module)
    outputs = ctx.lower_graph(graph_module, [args[index] for index in tensors])
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _divide_in_float64(graph_module: torch.fx.GraphModule) -> None:
    """float32 ``x / number`` as ``(x.double() / number).float()``: XLA turns a division by a broadcast scalar
    into a product by its reciprocal, which rounds differently from torch's division in about half the cases (a
    quantization scale one ulp off flips values that round at .5); the float64 product rounds to torch's quotient."""
    for node in [n for n in graph_module.graph.nodes if n.target == aten.div.Tensor]:
        x, divisor = node.args
        if not isinstance(divisor, (int, float)) or node.meta["val"].dtype != torch.float32:
            continue
        with graph_module.graph.inserting_before(node):
            wide = graph_module.graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.float64})
            wide.meta["val"] = x.meta["val"].to(torch.float64)
            quotient = graph_module.graph.call_function(aten.div.Tensor, (wide, divisor))
            quotient.meta["val"] = wide.meta["val"]
        narrow_args = (quotient,)
        node.target, node.args, node.kwargs = aten._to_copy.default, narrow_args, {"dtype": torch.float32}
    graph_module.recompile()



def _example(ctx, index: int) -> torch.Tensor:
    """A zero tensor of argument ``index``'s static shape and dtype to trace the kernel on; of a symbolic shape,
    the node's own fake."""
    value = ctx.arg_meta(index)
    if not all(isinstance(size, int) for size in value.shape):
        return value
    return torch.zeros(value.shape, dtype=value.dtype)
