"""Ops lowered through their composite implicit kernel: the kernel traced (``make_fx``) on the node's static
shapes into ATen ops, and that graph lowered inline, as ``run_decompositions`` would decompose the op but for
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
from torch.fx.experimental.proxy_tensor import make_fx

from .registry import lower

aten = torch.ops.aten

TORCHAO_AFFINE = ("torchao.choose_qparams_affine.default", "torchao.quantize_affine.default",
                  "torchao.dequantize_affine.default")


@lower(*TORCHAO_AFFINE)
def composite(ctx, *args, **kwargs):
    target = ctx.node.target
    tensors = [index for index, a in enumerate(args) if isinstance(a, ir.Value)]
    kernel = _get_decomp_for_cia(target)

    def traced(*values):
        given = dict(zip(tensors, values))
        return kernel(*[given.get(index, a) for index, a in enumerate(args)], **kwargs)

    examples = [_example(ctx, index) for index in tensors]
    graph_module = make_fx(traced)(*examples)
    _divide_in_float64(graph_module)
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
    """A zero tensor of argument ``index``'s static shape and dtype, to trace the kernel on."""
    value = ctx.arg_meta(index)
    if not all(isinstance(size, int) for size in value.shape):
        raise NotImplementedError(f"{ctx.node.target} on the symbolic shape {list(value.shape)}: its composite "
                                  "kernel is traced on static shapes only")
    return torch.zeros(value.shape, dtype=value.dtype)
