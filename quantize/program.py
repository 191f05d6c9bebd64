"""An ExportedProgram with quantization ops, made ready for lowering: schemes checked, weights nothing reads
dropped, static schemes found, patterns fused. Programs without quantization ops pass through untouched."""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind

from .fusion import fuse
from .schemes import DEQUANTIZE, QUANTIZE, SCHEME, check_supported, is_quantization_op, scheme_of

QUANTIZED_OPS_FORMS = ("fused", "unfused")
_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _quantization_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph_module.graph.nodes if n.op == "call_function" and is_quantization_op(n.target)]


def prepare_quantized(program: ExportedProgram) -> ExportedProgram:
    """Check the program's quantization schemes, raising ``UnsupportedQuantizationError`` (naming the node) for
    one StableHLO cannot express, and drop the weights nothing reads: pt2e's convert folds each quantized
    weight into an int8 constant but leaves its float original on the module, and torch.export lifts it."""
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
    graph_module = _copy(program.graph_module)
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
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    targets = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
               **signature.inputs_to_lifted_tensor_constants}
    stored = {**program.constants, **program.state_dict}

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


def _copy(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph module with the same node names (copying a graph renames nodes named like
    builtins, such as ``input``; torch.export names them directly, as here, and its signature uses them)."""
    graph = copy.deepcopy(graph_module.graph)
    for old, new in zip(graph_module.graph.nodes, graph.nodes):
        new.name = old.name
    return torch.fx.GraphModule(graph_module, graph)


def _without_unused_weights(program: ExportedProgram) -> ExportedProgram:
    signature = program.graph_signature
    unused = {n.name for n in program.graph.nodes if n.op == "placeholder" and not n.users}
    dropped = {s.arg.name for s in signature.input_specs if s.kind in _WEIGHT_KINDS and s.arg.name in unused}
    if not dropped:
        return program
    graph_module = _copy(program.graph_module)
    for node in [n for n in graph_module.graph.nodes if n.op == "placeholder" and n.name in dropped]:
        graph_module.graph.erase_node(node)
    graph_module.recompile()
    kept = [s for s in signature.input_specs if s.arg.name not in dropped]
    targets = {s.target for s in kept}
    return ExportedProgram(
        root=graph_module, graph=graph_module.graph,
        graph_signature=ExportGraphSignature(kept, signature.output_specs),
        state_dict={k: v for k, v in program.state_dict.items() if k in targets},
        range_constraints=program.range_constraints, module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs,
        constants={k: v for k, v in program.constants.items() if k in targets}, verifiers=program.verifiers)
