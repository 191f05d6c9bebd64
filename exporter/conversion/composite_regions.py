"""Each region a user marked as a composite (``exporter.composite``; ``aten_lowerings.composite_marks``) outlined into
one ``COMPOSITE_CALL`` node over a nested graph, which lowers to ``stablehlo.composite``.

A call's region is the nodes between its input marks and its output marks: those that depend on an input mark
and that an output mark depends on. What else the region reads (weights, values computed before the call that
depend on no input) becomes an operand after the marked inputs. Nested composites are outlined in the body of
the outer one's nested graph.
"""
from __future__ import annotations

import operator
import re

import torch

from torch_stablehlo.aten_lowerings import COMPOSITE_CALL, COMPOSITE_MARK
from torch_stablehlo.exported_program import copied_graph_module


def outline_composites(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph_module`` itself where it has no composite marks, else a copy with every marked region outlined."""
    if not _marks(graph_module.graph):
        return graph_module
    graph_module = copied_graph_module(graph_module)
    _outline_all(graph_module)
    return graph_module


def _marks(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is COMPOSITE_MARK]


def _outline_all(graph_module: torch.fx.GraphModule) -> None:
    """Outline the regions, outermost first (the one whose last output mark comes last), in place; input marks
    without output marks are left (they lower as the identity)."""
    while outputs := [m for m in _marks(graph_module.graph) if _is_output(m)]:
        call = _call_of(outputs[-1])
        _outline(graph_module, [m for m in _marks(graph_module.graph) if _call_of(m) == call])
    graph_module.graph.lint()
    graph_module.recompile()


def _call_of(mark: torch.fx.Node) -> int:
    return mark.args[2]


def _is_output(mark: torch.fx.Node) -> bool:
    return mark.args[6]


def _outline(graph_module: torch.fx.GraphModule, marks: list[torch.fx.Node]) -> None:
    """Replace one call's marks and region by a ``COMPOSITE_CALL`` node and ``getitem``s of it."""
    inputs = sorted((m for m in marks if not _is_output(m)), key=lambda m: m.args[3])
    outputs = sorted((m for m in marks if _is_output(m)), key=lambda m: m.args[3])
    region = _region(graph_module.graph, inputs, outputs)
    captured = [n for n in _read_by(region, outputs) if n not in region and n not in inputs]
    body = _body(inputs, captured, region, outputs)
    name, attributes, version = outputs[0].args[1], outputs[0].args[4], outputs[0].args[5]
    graph = graph_module.graph
    attribute = _free_name(graph_module, "composite_" + re.sub(r"\W", "_", name))
    graph_module.add_submodule(attribute, body)
    with graph.inserting_before(outputs[0]):
        getter = graph.get_attr(attribute)
        node = graph.create_node("call_function", COMPOSITE_CALL, (getter, name, attributes, version,
                                                                  *[m.args[0] for m in inputs], *captured),
                                 name=attribute)
        node.meta = {**outputs[0].meta, "val": tuple(m.meta["val"] for m in outputs)}
        for index, mark in enumerate(outputs):
            item = graph.call_function(operator.getitem, (node, index))
            item.meta = dict(mark.meta)
            mark.replace_all_uses_with(item)
    for dead in reversed([*inputs, *region, *outputs]):
        if not dead.users:
            graph.erase_node(dead)


def _region(graph: torch.fx.Graph, inputs: list[torch.fx.Node], outputs: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes that depend on an input mark and that an output mark depends on (the marks excluded), in
    graph order."""
    after_inputs, stack = set(), [u for m in inputs for u in m.users]
    while stack:
        node = stack.pop()
        if node not in after_inputs and node not in outputs:
            after_inputs.add(node)
            stack.extend(node.users)
    region, stack = set(), [o.args[0] for o in outputs]
    while stack:
        node = stack.pop()
        if node in after_inputs and node not in region:
            region.add(node)
            stack.extend(node.all_input_nodes)
    return [n for n in graph.nodes if n in region]


def _read_by(region: list[torch.fx.Node], outputs: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes the region and the output marks read, in first-read order."""
    read = {}
    for node in [*region, *outputs]:
        for argument in node.all_input_nodes:
            read.setdefault(argument, None)
    return list(read)


def _body(inputs, captured, region, outputs) -> torch.fx.GraphModule:
    """The region as a graph module of its own: placeholders for the marked inputs and the captured values,
    the region's nodes copied in order, the output marks' arguments returned as a tuple."""
    body, mapping = torch.fx.Graph(), {}
    for index, node in enumerate([*inputs, *captured]):
        placeholder = body.placeholder(f"operand_{index}")
        placeholder.meta = dict(node.meta)
        mapping[node] = placeholder
    for node in region:
        mapping[node] = body.node_copy(node, mapping.__getitem__)
    body.output(tuple(mapping[m.args[0]] for m in outputs))
    result = torch.fx.GraphModule(torch.nn.Module(), body)
    _outline_all(result)
    return result


def _free_name(graph_module: torch.fx.GraphModule, stem: str) -> str:
    names = {n.name for n in graph_module.graph.nodes} | set(dict(graph_module.named_children()))
    return next(f"{stem}_{i}" for i in range(len(names) + 1) if f"{stem}_{i}" not in names)
