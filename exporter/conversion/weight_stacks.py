"""Stacks of weights folded into one weight: ``torch.stack`` of parameters, buffers or constants (what
``scan_layers`` does with each layer's tensors) becomes a lifted constant of ``@main`` holding the stacked
values, and the weights stacked leave ``@main`` where nothing else uses them. So a scanned model's module does
not grow with its depth: it neither takes one argument per layer's tensor nor stacks them on every call."""
from __future__ import annotations

import torch
from torch.export import ExportedProgram

from torch_stablehlo.exported_program import WeightRewrite, is_weight, weight_values


def fold_weight_stacks(program: ExportedProgram) -> ExportedProgram:
    """``program`` with each stack of weights (in its top graph) replaced by one constant; the program
    itself when it has none (it is never changed in place)."""
    weight_specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs if is_weight(spec)}
    if not any(_stacks_weights(node, weight_specs) for node in program.graph.nodes):
        return program
    rewrite = WeightRewrite(program)
    for node in [n for n in rewrite.graph.nodes if _stacks_weights(n, weight_specs)]:
        operands = node.args[0]
        targets = [weight_specs[o.name].target for o in operands]
        values = weight_values(program, targets)
        stacked = rewrite.add_constant(f"stacked_{node.name}", f"{targets[0]}:stack{len(targets)}",
                                       torch.stack([values[t] for t in targets], *node.args[1:]))
        stacked.meta = dict(node.meta)
        node.replace_all_uses_with(stacked)
        rewrite.graph.erase_node(node)
        for operand in {o for o in operands if not o.users}:
            rewrite.drop(operand)
    return rewrite.program()


def _stacks_weights(node: torch.fx.Node, weight_specs: dict) -> bool:
    return (node.op == "call_function" and node.target is torch.ops.aten.stack.default
            and all(isinstance(o, torch.fx.Node) and o.name in weight_specs for o in node.args[0]))
