"""Stacks of weights folded into one weight: ``torch.stack`` of parameters, buffers or constants (what
``scan_layers`` does with each layer's tensors) becomes a lifted constant of ``@main`` holding the stacked
values, and the weights stacked leave ``@main`` where nothing else uses them. So a scanned model's module does
not grow with its depth: it neither takes one argument per layer's tensor nor stacks them on every call."""
from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

_WEIGHTS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def fold_weight_stacks(program: ExportedProgram) -> ExportedProgram:
    """``program`` with each stack of weights (in its top graph) replaced by one constant; the program
    itself when it has none (it is never changed in place)."""
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    weight_specs = {name: spec for name, spec in specs.items() if spec.kind in _WEIGHTS}
    if not any(_stacks_weights(node, weight_specs) for node in program.graph.nodes):
        return program
    graph = torch.fx.Graph()
    copied = {}
    graph.output(graph.graph_copy(program.graph, copied))
    constants = dict(program.constants)
    input_specs = list(program.graph_signature.input_specs)
    first_input = next((i for i, s in enumerate(input_specs) if s.kind not in _WEIGHTS), len(input_specs))
    before = next(n for n in graph.nodes if n.op != "placeholder" or n.name not in weight_specs)
    for node in [copied[n] for n in program.graph.nodes if _stacks_weights(n, weight_specs)]:
        operands = node.args[0]
        targets = [weight_specs[o.name].target for o in operands]
        name = f"{targets[0]}:stack{len(targets)}"
        constants[name] = torch.stack([_value(program, t) for t in targets], *node.args[1:])
        with graph.inserting_before(before):
            stacked = graph.placeholder(f"stacked_{node.name}")
        stacked.meta = dict(node.meta)
        node.replace_all_uses_with(stacked)
        graph.erase_node(node)
        input_specs.insert(first_input, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(stacked.name), name))
        first_input += 1
        for operand in {o for o in operands if not o.users}:
            graph.erase_node(operand)
            input_specs = [s for s in input_specs if s.arg.name != operand.name]
            first_input -= 1
    kept = {s.target for s in input_specs if s.kind in _WEIGHTS}
    signature = ExportGraphSignature(input_specs, list(program.graph_signature.output_specs))
    return program._update(torch.fx.GraphModule(program.graph_module, graph), signature,
                           state_dict={k: v for k, v in program.state_dict.items() if k in kept},
                           constants={k: v for k, v in constants.items() if k in kept})


def _stacks_weights(node: torch.fx.Node, weight_specs: dict) -> bool:
    return (node.op == "call_function" and node.target is torch.ops.aten.stack.default
            and all(isinstance(o, torch.fx.Node) and o.name in weight_specs for o in node.args[0]))


def _value(program: ExportedProgram, target: str) -> torch.Tensor:
    value = program.state_dict[target] if target in program.state_dict else program.constants[target]
    return value.data if isinstance(value, torch.nn.Parameter) else value
