"""An ExportedProgram with quantization ops, made ready for lowering: tensor-subclass weights unwrapped, schemes
checked, weights nothing reads dropped, static schemes found, patterns fused. Programs without quantization ops
pass through untouched."""
from __future__ import annotations

from typing import Callable

import torch
from torch.export import ExportedProgram

from ..exported_program import WeightRewrite, copied_graph_module, is_weight, weight_values
from .fusion import fuse
from .schemes import DEQUANTIZE, QUANTIZE, SCHEME, check_supported, is_quantization_op, scheme_of
from .torchao_weights import unwrapped_weights

QUANTIZED_OPS_FORMS = ("fused", "unfused")


def _quantization_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph_module.graph.nodes if n.op == "call_function" and is_quantization_op(n.target)]


def prepare_quantized(program: ExportedProgram) -> ExportedProgram:
    """Check the program's quantization schemes, raising ``UnsupportedQuantizationError`` (naming the node) for
    one StableHLO cannot express, and drop the weights nothing reads: pt2e's convert folds each quantized
    weight into an int8 constant but leaves its float original on the module, and torch.export lifts it.
    Weights held as torchao tensor subclasses become their inner tensors first (``unwrapped_weights``)."""
    program = unwrapped_weights(program)
    nodes = _quantization_nodes(program.graph_module)
    if not nodes:
        return program
    static_value = _static_values(program, program.graph_module)
    for node in nodes:
        check_supported(node)
        if node.target in QUANTIZE + DEQUANTIZE:
            scheme_of(node, static_value)
    return _without_unused_weights(program)


def lowering_graph(program: ExportedProgram, quantized_ops: str = "fused") -> torch.fx.GraphModule:
    """The graph to lower. With quantization ops it is a copy whose (de)quantize nodes carry their static
    schemes (``node.meta[SCHEME]``) and, for ``"fused"``, with products on quantized operands fused."""
    if quantized_ops not in QUANTIZED_OPS_FORMS:
        raise ValueError(f"quantized_ops must be one of {QUANTIZED_OPS_FORMS}, got {quantized_ops!r}")
    if not _quantization_nodes(program.graph_module):
        return program.graph_module
    graph_module = copied_graph_module(program.graph_module)
    static_value = _static_values(program, graph_module)
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target in QUANTIZE + DEQUANTIZE:
            scheme = scheme_of(node, static_value)
            if scheme is not None:
                node.meta[SCHEME] = scheme
    if quantized_ops == "fused":
        fuse(graph_module)
    return graph_module


def _static_values(program: ExportedProgram, graph_module: torch.fx.GraphModule) -> Callable[[object], object]:
    """``value(arg)``: a number argument, the tensor behind a weight placeholder or a tensor attribute, or
    None for anything computed at run time (and for buffers the program mutates)."""
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    targets = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs if is_weight(spec)}
    stored = weight_values(program, targets.values())

    def value(arg):
        if isinstance(arg, (int, float)):
            return arg
        if not isinstance(arg, torch.fx.Node):
            return None
        if arg.op == "placeholder" and arg.name in targets and targets[arg.name] not in mutated:
            return stored[targets[arg.name]]
        if arg.op == "get_attr":
            return getattr(graph_module, arg.target)
        return None

    return value


def _without_unused_weights(program: ExportedProgram) -> ExportedProgram:
    unused = {n.name for n in program.graph.nodes if n.op == "placeholder" and not n.users}
    dropped = {s.arg.name for s in program.graph_signature.input_specs if is_weight(s) and s.arg.name in unused}
    if not dropped:
        return program
    rewrite = WeightRewrite(program)
    for node in [n for n in rewrite.graph.nodes if n.op == "placeholder" and n.name in dropped]:
        rewrite.drop(node)
    return rewrite.program()
