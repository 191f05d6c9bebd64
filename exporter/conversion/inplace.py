"""In-place ops the graph walk functionalises itself, so that they need no ``run_decompositions`` re-trace.

An in-place op that writes only its first argument (``add_``, ``copy_``, ``index_copy_``, ``detach_``, ...) is
lowered as its out-of-place twin (``add``, ``copy``, ...), and the walk rebinds the written node to the result:
later uses of that node see the new value, as they would in torch. That is exact when the written tensor is
a temporary of the graph (or a lifted constant, which the program does not return) and no other alias of it,
made before the write (a view, a ``to`` that returned its input), is read after it; and when the twin has a
lowering, draws no random numbers (the signature's ``rng_seed`` looks for functional random ops) and the
write keeps the tensor's shape and dtype. Writes to user inputs,
parameters and buffers, and anything else, are left to ``run_decompositions``, which returns them.
"""
from __future__ import annotations

import torch

from torch_stablehlo.aten_lowerings import RANDOM_OPS, lowering_for

aten = torch.ops.aten


def functional_twin(target) -> torch._ops.OpOverload | None:
    """The out-of-place overload of an aten op that writes only its first argument (``add_.Tensor`` ->
    ``add.Tensor``), or None."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    arguments = target._schema.arguments
    writes = [a.alias_info is not None and a.alias_info.is_write for a in arguments]
    if not writes or not writes[0] or any(writes[1:]) or not target._schema.name.endswith("_"):
        return None
    packet = getattr(aten, target._schema.name.removeprefix("aten::")[:-1], None)
    twin = getattr(packet, target._overloadname, None) if packet is not None else None
    return None if twin is None or twin._schema.is_mutable else twin


def functionalised(graph_module: torch.fx.GraphModule, state=None) -> dict[torch.fx.Node, torch._ops.OpOverload]:
    """In-place nodes of ``graph_module`` the walk lowers as their functional twin: node -> twin.

    ``state`` is the set of placeholders whose writes the program must return
    (``exported_program.state_placeholders``); None means every placeholder (a nested graph's inputs are its
    caller's values).
    """
    nodes = list(graph_module.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op in ("placeholder", "get_attr")]
    state = set(placeholders if state is None else state) | {n for n in nodes if n.op == "get_attr"}
    aliases = _alias_classes(nodes)
    twins = {}
    for node in nodes:
        twin = functional_twin(node.target) if node.op == "call_function" else None
        if twin is None or twin in RANDOM_OPS or lowering_for(twin) is None or not _same_type(node, node.args[0]):
            continue
        written = node.args[0]
        members = aliases[written]
        if members & state:
            continue
        stale = [a for a in members if a is not written and position[a] < position[node]
                 and any(position[user] > position[node] for user in a.users)]
        if not stale:
            twins[node] = twin
    return twins


def _same_type(node: torch.fx.Node, written) -> bool:
    """The write keeps the written tensor's shape and dtype (``resize_`` does not), so rebinding it is exact."""
    new, old = node.meta.get("val"), getattr(written, "meta", {}).get("val")
    return (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and new.dtype == old.dtype
            and new.shape == old.shape)


def _alias_classes(nodes) -> dict[torch.fx.Node, set]:
    """Each node's set of possible aliases: a view or in-place op's result joins the arguments it may alias
    (its schema says which); getitem and non-aten calls join all their node arguments, conservatively."""
    classes = {node: {node} for node in nodes}

    def join(a, b):
        if classes[a] is not classes[b]:
            merged = classes[a] | classes[b]
            for member in merged:
                classes[member] = merged

    for node in nodes:
        if node.op != "call_function":
            continue
        for source in _aliased_arguments(node):
            join(node, source)
    return classes


def _aliased_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments ``node``'s result may alias."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        if not any(r.alias_info is not None for r in schema.returns):
            return []
        bound = list(zip(schema.arguments, node.args)) + [(a, node.kwargs[a.name]) for a in schema.arguments
                                                          if a.name in node.kwargs]
        return [value for argument, value in bound
                if argument.alias_info is not None and isinstance(value, torch.fx.Node)]
    return list(node.all_input_nodes)


def unfunctionalised_mutations(graph_module: torch.fx.GraphModule, twins: dict) -> list[torch.fx.Node]:
    """The mutating nodes that the walk cannot functionalise (not among ``twins``, ``graph_module``'s
    ``functionalised``): they need ``run_decompositions``."""
    return [n for n in graph_module.graph.nodes if n.op == "call_function" and n not in twins
            and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]
