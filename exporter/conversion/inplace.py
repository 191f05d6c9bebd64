"""In-place ops the graph walk functionalises itself, so that they need no ``run_decompositions`` re-trace.

An in-place op that writes only its first argument (``add_``, ``copy_``, ``index_copy_``, ``detach_``, ...) is
lowered as its out-of-place twin (``add``, ``copy``, ...), and the walk rebinds the written tensor to the result
(a write through slices, selects or diagonals of a tensor, ``mask[:, :k] = 0``, is scattered back into it first):
the written node and every node made before the write that is the same tensor (``_identity_classes``: an earlier
in-place op's result, a ``to`` or view that changed nothing). Later uses of any of them see the new value, as
they would in torch. That is exact when no other alias of the written tensor (a view of part of it, a ``to``
that may have copied), made before the write, is read after it; and when the twin has a lowering, draws no
random numbers (the signature's ``rng_seed`` looks for functional random ops) and the write keeps the tensor's
shape and dtype.

The written tensor may be a temporary of the graph or the program's state (the buffers and lifted constants it
writes; ``exported_program.input_kinds``): a state placeholder is rebound like any other node, so its value after the
walk is its new value, which ``@main`` returns (``GraphLowering``). A write to part of a state tensor (through a
slice) cannot be carried so; such writes, and writes to the inputs whose updates the program returns itself
(user inputs, parameters), are left to ``run_decompositions``, which returns them.

What a program writes is found once per graph (``InPlaceWrites``) and read by every later step: the unsupported
targets, the mutations left to ``run_decompositions``, the signature's input kinds and the graph walk.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from torch.export import ExportedProgram

from torch_stablehlo.aten_lowerings import RANDOM_OPS, lowering_for
from torch_stablehlo.exported_program import input_kinds, returned_placeholders

aten = torch.ops.aten


# views whose writes reach the tensor they view: the scatter that puts a view's elements back
VIEW_SCATTERS = {aten.slice.Tensor: aten.slice_scatter.default, aten.select.int: aten.select_scatter.default,
                 aten.diagonal.default: aten.diagonal_scatter.default}


class Write(NamedTuple):
    """An in-place node the walk lowers as ``twin``. Its result is the new value of the tensor it writes, which
    is a view of another through the ``through`` views (innermost first; none: the tensor itself): each
    view's new value is scattered back into the tensor it views (``VIEW_SCATTERS``). The outermost tensor's
    new value becomes the value of each node in ``rebinds``."""
    twin: torch._ops.OpOverload
    rebinds: tuple[torch.fx.Node, ...]
    through: tuple[torch.fx.Node, ...] = ()


@dataclass(frozen=True)
class InPlaceWrites:
    """What one graph writes in place, found once (``of_program``) and read by the later steps."""
    graph_module: torch.fx.GraphModule
    kinds: tuple[str | None, ...]        # each placeholder's kind (``exported_program.input_kinds``): the written
                                         # buffers and constants are state
    written: dict[torch.fx.Node, set]    # each node that writes a placeholder -> the placeholders it writes
    functional: dict[torch.fx.Node, Write]  # the in-place nodes the walk lowers as their twin (``functionalised``)
    left: tuple[torch.fx.Node, ...]      # the mutating nodes the walk cannot functionalise: run_decompositions'

    @classmethod
    def of_program(cls, program: ExportedProgram) -> "InPlaceWrites":
        """The writes of ``program``'s graph, its placeholders' kinds read from what the graph writes."""
        aliases = _alias_classes(list(program.graph.nodes))
        written = written_placeholders(program.graph_module, aliases)
        return cls._of(program.graph_module, input_kinds(program, set().union(*written.values())), written, aliases)

    def on_copy(self, graph_module: torch.fx.GraphModule) -> "InPlaceWrites":
        """The writes of a copy of this graph (the same placeholders, other nodes: quantization annotated,
        composites outlined); this analysis itself for the same graph."""
        if graph_module is self.graph_module:
            return self
        aliases = _alias_classes(list(graph_module.graph.nodes))
        return InPlaceWrites._of(graph_module, self.kinds, written_placeholders(graph_module, aliases), aliases)

    @classmethod
    def _of(cls, graph_module: torch.fx.GraphModule, kinds: Sequence[str | None], written: dict,
            aliases: dict) -> "InPlaceWrites":
        functional = functionalised(graph_module, returned_placeholders(graph_module, kinds), aliases)
        return cls(graph_module, tuple(kinds), written, functional,
                   tuple(unfunctionalised_mutations(graph_module, functional)))


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


def functionalised(graph_module: torch.fx.GraphModule, returned=None, aliases=None) -> dict[torch.fx.Node, Write]:
    """In-place nodes of ``graph_module`` the walk lowers as their functional twin (``aliases``: the graph's
    ``_alias_classes``, made here if not given).

    ``returned`` is the set of placeholders whose writes the program returns itself (user inputs, parameters):
    those are left to ``run_decompositions``; None means every placeholder (a nested graph's inputs are its
    caller's values). A write to another placeholder (the program's state) is rebound when it writes the
    whole tensor.
    """
    nodes = list(graph_module.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op in ("placeholder", "get_attr")]
    returned = set(placeholders if returned is None else returned) | {n for n in nodes if n.op == "get_attr"}
    aliases = _alias_classes(nodes) if aliases is None else aliases
    identities = _identity_classes(nodes)
    writes = {}
    for node in nodes:
        twin = functional_twin(node.target) if node.op == "call_function" else None
        if twin is None or twin in RANDOM_OPS or lowering_for(twin) is None or not _same_type(node, node.args[0]):
            continue
        through = _views_written(node.args[0])
        written = through[-1].args[0] if through else node.args[0]
        members, same = aliases[written], identities[written]
        if members & returned or any(m.op == "placeholder" and m not in same for m in members):
            continue
        rebinds = [a for a in same if position[a] < position[node]]
        stale = [a for a in members - set(rebinds) - set(through) if position[a] < position[node]
                 and any(position[user] > position[node] for user in a.users)]
        if not stale:
            writes[node] = Write(twin, (written, *sorted(set(rebinds) - {written}, key=position.get)),
                                 tuple(through))
    return writes


def _views_written(node) -> list[torch.fx.Node]:
    """The chain of ``VIEW_SCATTERS`` views that ``node`` is (itself first, then the view it was taken from,
    ...); empty where ``node`` is not such a view."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in VIEW_SCATTERS:
        chain.append(node)
        node = node.args[0]
    return chain


def written_placeholders(graph_module: torch.fx.GraphModule, aliases=None) -> dict[torch.fx.Node, set]:
    """Each node that writes a placeholder, itself or through an alias -> the placeholders it writes
    (``aliases``: the graph's ``_alias_classes``, made at the first write if not given)."""
    nodes = list(graph_module.graph.nodes)
    written = {}
    for node in nodes:
        arguments = _written_arguments(node)
        if not arguments:
            continue
        aliases = _alias_classes(nodes) if aliases is None else aliases
        placeholders = {m for value in arguments for m in aliases[value] if m.op == "placeholder"}
        if placeholders:
            written[node] = placeholders
    return written


def _written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return []
    unmarked = UNMARKED_WRITES.get(node.target)
    written = [value for argument, value in _bound(node)
               if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node)]
    return written + (unmarked(node) if unmarked else [])


def _batch_norm_statistics(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)`` in training
    updates the running statistics given."""
    bound = dict((argument.name, value) for argument, value in _bound(node))
    if not bound.get("training"):
        return []
    return [bound[name] for name in ("running_mean", "running_var") if isinstance(bound.get(name), torch.fx.Node)]


UNMARKED_WRITES = {aten.native_batch_norm.default: _batch_norm_statistics}
"""Ops that write arguments their schema does not mark as written (``Tensor?``, not ``Tensor(a!)``): each one's
written arguments at a node. torch.export keeps them in its graph unfunctionalised (``ep.module()`` runs them and
updates what they write), so the conversion must functionalise them like any mutation."""


def _same_type(node: torch.fx.Node, written) -> bool:
    """The write keeps the written tensor's shape and dtype (``resize_`` does not), so rebinding it is exact."""
    new, old = node.meta.get("val"), getattr(written, "meta", {}).get("val")
    return (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and new.dtype == old.dtype
            and new.shape == old.shape)


def _classes(nodes, edges) -> dict[torch.fx.Node, set]:
    """The classes of ``nodes`` joined by ``edges(node)`` (the nodes each one joins)."""
    classes = {node: {node} for node in nodes}
    for node in nodes:
        for source in edges(node):
            if classes[node] is not classes[source]:
                merged = classes[node] | classes[source]
                for member in merged:
                    classes[member] = merged
    return classes


def _alias_classes(nodes) -> dict[torch.fx.Node, set]:
    """Each node's set of possible aliases: a view or in-place op's result joins the arguments it may alias
    (its schema says which); getitem and non-aten calls join all their node arguments, conservatively."""
    return _classes(nodes, lambda node: _aliased_arguments(node) if node.op == "call_function" else [])


def _identity_classes(nodes) -> dict[torch.fx.Node, set]:
    """Each node's set of nodes that are the same tensor: an in-place op's result is its first argument, and a
    view or ``to`` whose result has its input's dtype, shape, strides and offset changed nothing."""
    def same_tensor(node):
        source = node.args[0] if node.op == "call_function" and node.args else None
        if not isinstance(source, torch.fx.Node) or source not in _aliased_arguments(node):
            return []
        return [source] if _same_layout(node.meta.get("val"), source.meta.get("val")) else []

    return _classes(nodes, same_tensor)


def _same_layout(new, old) -> bool:
    """Both tensors with one dtype, shape, strides and offset (symbolic sizes compared by expression, adding no
    guards)."""
    if not (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)) or new.dim() != old.dim():
        return False
    layout = lambda t: [t.dtype, *t.shape, *t.stride(), t.storage_offset()]  # noqa: E731
    return all(str(a) == str(b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b
               for a, b in zip(layout(new), layout(old)))


def _aliased_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments ``node``'s result may alias (``to`` only when it keeps the dtype: otherwise a copy; a
    ``getitem`` of an op's fresh results, such as topk's values and indices, none)."""
    target = node.target
    if target is operator.getitem and _makes_fresh_results(node.args[0]):
        return []
    if isinstance(target, torch._ops.OpOverload):
        if not any(r.alias_info is not None for r in target._schema.returns):
            return []
        if target.overloadpacket is aten.to and _dtype(node) != _dtype(node.args[0]):
            return []
        return [value for argument, value in _bound(node)
                if argument.alias_info is not None and isinstance(value, torch.fx.Node)]
    return list(node.all_input_nodes)


def _makes_fresh_results(node) -> bool:
    """An aten op whose results alias none of its arguments (its schema's returns have no alias)."""
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)
            and not any(r.alias_info is not None for r in node.target._schema.returns))


def _dtype(node) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _bound(node: torch.fx.Node) -> list:
    """(schema argument, value) for each argument ``node`` passes."""
    arguments = node.target._schema.arguments
    return list(zip(arguments, node.args)) + [(a, node.kwargs[a.name]) for a in arguments if a.name in node.kwargs]


def unfunctionalised_mutations(graph_module: torch.fx.GraphModule, writes: dict) -> list[torch.fx.Node]:
    """The mutating nodes that the walk cannot functionalise (not among ``writes``, ``graph_module``'s
    ``functionalised``): they need ``run_decompositions``."""
    return [n for n in graph_module.graph.nodes if n.op == "call_function" and n not in writes
            and isinstance(n.target, torch._ops.OpOverload) and (n.target._schema.is_mutable or _written_arguments(n))]
