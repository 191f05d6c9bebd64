"""Fusing ``dequantize -> linear/conv/matmul [-> relu] -> quantize`` into one op on quantized operands.

The fused node calls one of the functions below (their bodies are torch's semantics of the pattern, so a
fused graph still runs in torch); its lowering emits ``dot_general``/``convolution`` on ``!quant.uniform``
types, the form serving compilers consume. A product whose output is not quantized keeps a float result
(the int32 accumulator dequantized); a float lhs with a quantized weight is the weight-only (hybrid) form.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .schemes import DEQUANTIZE, QUANTIZE, QuantScheme, static_scheme

aten = torch.ops.aten


@dataclass(frozen=True)
class FusedSchemes:
    lhs: QuantScheme | None      # None: a float lhs (weight-only quantization)
    rhs: QuantScheme
    out: QuantScheme | None      # None: a float result
    relu: bool = False


def _pattern(op, schemes: FusedSchemes, lhs, rhs, *rest):
    """quantize(relu?(op(dequantize(lhs), dequantize(rhs), *rest)))."""
    if schemes.lhs is not None:
        lhs = schemes.lhs.dequantize(lhs)
    out = op(lhs, schemes.rhs.dequantize(rhs), *rest)
    if schemes.relu:
        out = torch.relu(out)
    return out if schemes.out is None else schemes.out.quantize(out)


def quantized_linear(x, weight, bias, schemes: FusedSchemes):
    return _pattern(F.linear, schemes, x, weight, bias)


def quantized_conv(x, weight, bias, stride, padding, dilation, groups, schemes: FusedSchemes):
    transposed_padding = [0] * (weight.dim() - 2)
    return _pattern(lambda a, w, b: aten.convolution(a, w, b, stride, padding, dilation, False,
                                                     transposed_padding, groups), schemes, x, weight, bias)


def quantized_matmul(a, b, schemes: FusedSchemes):
    return _pattern(torch.matmul, schemes, a, b)


FUSED_OPS = (quantized_linear, quantized_conv, quantized_matmul)


# -- matching -----------------------------------------------------------------------------------------------

@dataclass
class _Product:
    """The operands of a fusible op: ``rest`` follows lhs and rhs in the fused call; ``rhs_axis`` is the dim
    of rhs a per-channel scheme may use (output features)."""
    lhs: torch.fx.Node
    rhs: torch.fx.Node
    rest: tuple
    rhs_axis: int


def _linear(node):
    x, weight, bias = (list(node.args) + [None])[:3]
    return _Product(x, weight, (bias,), 0)


_CONV_DEFAULTS = (None, 1, 0, 1, 1)  # bias, stride, padding, dilation, groups of conv1d/2d/3d


def _conv(node):
    x, weight, *given = node.args
    return _conv_product(x, weight, (*given, *_CONV_DEFAULTS[len(given):]))


def _convolution(node):
    x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
    return None if transposed else _conv_product(x, weight, (bias, stride, padding, dilation, groups))


def _conv_product(x, weight, rest):
    """Batched inputs only (an unbatched conv reshapes around the op)."""
    if x.meta["val"].dim() != weight.meta["val"].dim():
        return None
    return _Product(x, weight, rest, 0)


def _matmul(node):
    a, b = node.args
    ranks = {a.meta["val"].dim(), b.meta["val"].dim()}
    if len(ranks) != 1 or min(ranks) < 2 or a.meta["val"].shape[:-2] != b.meta["val"].shape[:-2]:
        return None
    return _Product(a, b, (), min(ranks) - 1)


_LINEAR = (quantized_linear, "stablehlo.dot_general", _linear)
_CONV = (quantized_conv, "stablehlo.convolution", _conv)
_CONVOLUTION = (quantized_conv, "stablehlo.convolution", _convolution)
_MATMUL = (quantized_matmul, "stablehlo.dot_general", _matmul)
# op -> (fused op, what its lowering emits, the node's operands or None when it cannot fuse)
FUSIBLE = {aten.linear.default: _LINEAR, aten.conv1d.default: _CONV, aten.conv2d.default: _CONV,
           aten.conv3d.default: _CONV, aten.convolution.default: _CONVOLUTION,
           aten.mm.default: _MATMUL, aten.bmm.default: _MATMUL, aten.matmul.default: _MATMUL}

_EIGHT_BIT = (torch.int8, torch.uint8)


def _input_scheme(node) -> QuantScheme | None:
    """The static 8-bit scheme of a float32 dequantize feeding a product, else None."""
    if not isinstance(node, torch.fx.Node) or node.target not in DEQUANTIZE:
        return None
    scheme = static_scheme(node)
    if scheme is None or scheme.storage not in _EIGHT_BIT or node.meta["val"].dtype != torch.float32:
        return None
    return scheme


def _output(node):
    """(scheme, relu, last node) of a per-tensor quantize after ``node`` (through one relu), or None."""
    relu = len(node.users) == 1 and next(iter(node.users)).target == aten.relu.default
    last = next(iter(node.users)) if relu else node
    if len(last.users) != 1:
        return None
    quantize = next(iter(last.users))
    scheme = static_scheme(quantize) if quantize.target in QUANTIZE else None
    if scheme is None or scheme.axis is not None:
        return None
    return scheme, relu, quantize


def _fuse_one(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    fused_op, _, operands = FUSIBLE[node.target]
    product = operands(node)
    if product is None or node.meta["val"].dtype != torch.float32:
        return False
    rhs = _input_scheme(product.rhs)
    if rhs is None or not rhs.symmetric or rhs.axis not in (None, product.rhs_axis):
        return False
    lhs = _input_scheme(product.lhs)
    if lhs is not None and lhs.axis is not None:
        return False
    output = _output(node) if lhs is not None else None
    schemes = FusedSchemes(lhs, rhs, *(output[:2] if output else (None, False)))
    last = output[2] if output else node
    lhs_value = product.lhs.args[0] if lhs is not None else product.lhs
    with graph.inserting_before(node):
        fused = graph.call_function(fused_op, (lhs_value, product.rhs.args[0], *product.rest, schemes))
    fused.meta = {**node.meta, "val": last.meta["val"]}
    last.replace_all_uses_with(fused)
    for dead in dict.fromkeys([last, *last.all_input_nodes, node, product.lhs, product.rhs]):
        if not dead.users and dead.op == "call_function":
            graph.erase_node(dead)
    return True


def fuse(graph_module: torch.fx.GraphModule) -> None:
    """Fuse every matching pattern in place (nodes must carry their static schemes)."""
    graph = graph_module.graph
    fused = [_fuse_one(graph, node) for node in list(graph.nodes)
             if node.op == "call_function" and node.target in FUSIBLE]
    if any(fused):
        graph_module.recompile()


def keeps_quantized(node: torch.fx.Node) -> bool:
    """Whether every user of a (fused or quantize) node takes a quantized operand, so that its value can keep
    its ``!quant.uniform`` type instead of being cast to integer storage."""
    return bool(node.users) and all(
        user.target in FUSED_OPS or (user.target in DEQUANTIZE and static_scheme(user) is not None)
        for user in node.users)
