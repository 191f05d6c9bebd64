"""The facts the conversion reads off a torch.export ``ExportedProgram``, each decided here once: what each input
is (state, weight, user input) and what each output is, a weight's value, and the program with weight placeholders removed or added.

Below every package of the namespace (the graph walk, the signature, weight stacks and quantization all read it),
so it imports nothing of the package.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind, TensorArgument


@dataclass(frozen=True)
class Kind:
    """What one kind of input of an ExportedProgram is to the conversion."""
    name: str       # the signature's name for it (``InputSlot.kind``, stored in artifacts)
    weight: bool    # a tensor the program holds (state dict or constants): the artifact keeps it, @main takes it first
    returned: bool  # writes to it are outputs of the program's own (torch functionalises them), never carried state


PARAMETER, BUFFER, CONSTANT, USER_INPUT = "parameter", "buffer", "constant", "user_input"
INPUT_KINDS = {
    InputKind.PARAMETER: Kind(PARAMETER, weight=True, returned=True),
    InputKind.BUFFER: Kind(BUFFER, weight=True, returned=False),
    InputKind.CONSTANT_TENSOR: Kind(CONSTANT, weight=True, returned=False),
    InputKind.USER_INPUT: Kind(USER_INPUT, weight=False, returned=True),
}
"""The input kinds the conversion takes (the signature refuses the others: custom objects, tokens)."""
STATE = "state"
"""The kind of a buffer, lifted constant or parameter the program writes (torch's ``buffers_to_mutate`` and
``parameters_to_mutate``, a parameter written under ``no_grad``; or in place in the
graph: a strict=False export keeps a static KV cache as constants written by ``index_copy_``): carried from call
to call as ``ep.module()`` carries it, apart from the weights."""
WEIGHT_KINDS = frozenset(kind.name for kind in INPUT_KINDS.values() if kind.weight)
RETURNED_KINDS = frozenset(kind.name for kind in INPUT_KINDS.values() if kind.returned)
HELD_KINDS = WEIGHT_KINDS | {STATE}
"""The inputs the artifact holds and passes to ``@main`` itself: weights and state."""

USER_OUTPUT = "user_output"
STATE_UPDATE = "buffer_mutation"
"""An output that is a state slot's new value (its ``target``), carried to the next call."""
INPUT_UPDATE = "user_input_mutation"
"""An output that is the new value of a user input the program writes in place (its ``target``)."""
OUTPUT_KINDS = {OutputKind.USER_OUTPUT: USER_OUTPUT, OutputKind.BUFFER_MUTATION: STATE_UPDATE,
                OutputKind.PARAMETER_MUTATION: STATE_UPDATE, OutputKind.USER_INPUT_MUTATION: INPUT_UPDATE}
"""The output kinds the conversion takes, by the names the signature gives them (stored in artifacts)."""


def kind_name(spec: InputSpec) -> str | None:
    """The input's kind as the table names it; None for a kind the conversion does not take."""
    kind = INPUT_KINDS.get(spec.kind)
    return kind.name if kind is not None else None


def is_weight(spec: InputSpec) -> bool:
    return kind_name(spec) in WEIGHT_KINDS


def input_kinds(program: ExportedProgram, written: set[torch.fx.Node]) -> list[str | None]:
    """Each input's kind, in placeholder order (None for a kind the conversion does not take): the table's, except
    that a buffer or lifted constant the program writes (``written``: the placeholders its graph writes in place;
    or torch's ``buffers_to_mutate``) is ``STATE``. The one answer to "which inputs are state"."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values()) | set(signature.parameters_to_mutate.values())
    kinds = []
    for node, spec in zip(placeholders, signature.input_specs):
        kind = INPUT_KINDS.get(spec.kind)
        carried = kind is not None and kind.weight and (spec.target in mutated or (not kind.returned and node in written))
        kinds.append(STATE if carried else kind.name if kind is not None else None)
    return kinds


def shape_env_of(program: ExportedProgram):
    """The ShapeEnv of the program's symbolic sizes (reachable from its placeholders' fake values in the process
    that exported it), or None (a program without fake values, such as one loaded from disk without them)."""
    for node in program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value.node.shape_env
        fake_mode = getattr(value, "fake_mode", None)
        if getattr(fake_mode, "shape_env", None) is not None:
            return fake_mode.shape_env
    return None


def returned_placeholders(graph_module: torch.fx.GraphModule, kinds: Sequence[str | None]) -> list[torch.fx.Node]:
    """The placeholders whose writes are the program's own outputs (``RETURNED_KINDS``: user inputs, parameters),
    given each placeholder's kind in order (``input_kinds``, or a signature's slot kinds): the graph walk leaves
    writes to them to torch's functionalisation, and carries writes to the others (state) itself."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    return [node for node, kind in zip(placeholders, kinds) if kind in RETURNED_KINDS]


def weight_values(program: ExportedProgram, targets: Iterable[str]) -> dict[str, torch.Tensor]:
    """The value of each weight ``target`` (a state-dict or constants key): the program's own tensor, never a copy
    (a parameter's plain ``.data``); tied weights stay one object, so meta weights of a weightless export keep
    their ties too."""
    weights, plain = {}, {}
    for target in targets:
        value = program.state_dict[target] if target in program.state_dict else program.constants[target]
        if id(value) not in plain:
            plain[id(value)] = value.data if isinstance(value, torch.nn.Parameter) else value
        weights[target] = plain[id(value)]
    return weights


def copied_graph_module(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph module with the same node names (copying a graph renames nodes named like builtins,
    such as ``input``; torch.export names them directly, as here, and its signature uses the names)."""
    graph = copy.deepcopy(graph_module.graph)
    for old, new in zip(graph_module.graph.nodes, graph.nodes):
        new.name = old.name
    return torch.fx.GraphModule(graph_module, graph)


class WeightRewrite:
    """``program``'s weight placeholders rewritten on a copy of its graph (``graph``; the program itself is never
    changed): ``drop`` erases a weight placeholder nothing uses any more, ``add_constant`` adds a lifted constant
    after the weights, ``returned_instead`` returns one node in another's place; ``program()`` is the result, its state dict and constants holding what an input still names.
    """

    def __init__(self, program: ExportedProgram):
        self.source = program
        self.graph_module = copied_graph_module(program.graph_module)
        self.graph = self.graph_module.graph
        self._specs = list(program.graph_signature.input_specs)
        self._outputs = list(program.graph_signature.output_specs)
        self._constants = dict(program.constants)

    def drop(self, placeholder: torch.fx.Node) -> None:
        self.graph.erase_node(placeholder)
        self._specs = [s for s in self._specs if s.arg.name != placeholder.name]

    def returned_instead(self, node: torch.fx.Node, replacement: torch.fx.Node) -> None:
        """``replacement`` returned where ``node`` was (the output node's uses already moved to it)."""
        self._outputs = [replace(s, arg=TensorArgument(replacement.name))
                         if isinstance(s.arg, TensorArgument) and s.arg.name == node.name else s for s in self._outputs]

    def add_constant(self, name: str, target: str, value: torch.Tensor) -> torch.fx.Node:
        """A new placeholder ``name`` (after the weights, before the user inputs) for the constant ``target``."""
        first_input = next((i for i, s in enumerate(self._specs) if not is_weight(s)), len(self._specs))
        weights = {s.arg.name for s in self._specs[:first_input]}
        before = next(n for n in self.graph.nodes if n.op != "placeholder" or n.name not in weights)
        with self.graph.inserting_before(before):
            placeholder = self.graph.placeholder(name)
        self._specs.insert(first_input, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(placeholder.name), target))
        self._constants[target] = value
        return placeholder

    def program(self) -> ExportedProgram:
        self.graph_module.recompile()
        named = {s.target for s in self._specs}
        signature = ExportGraphSignature(self._specs, self._outputs)
        return self.source._update(self.graph_module, signature,
                                   state_dict={k: v for k, v in self.source.state_dict.items() if k in named},
                                   constants={k: v for k, v in self._constants.items() if k in named})
