"""The sharding search's problem: for each node of the graph its candidate strategies and what each costs, the cost
of every producer -> consumer layout change, and the bytes each weight and input holds per device.

Costs are seconds on the mesh's devices (``runtime.device_costs``): a product's flops over the measured rate, an
elementwise op's bytes over the memory rate, each split over the devices its strategy splits it across; a split
contracted dim adds an all-reduce of the result; an operand laid out otherwise than its consumer takes it adds an
all-gather (a dim no longer split) or an all-to-all (split along another dim); results are gathered whole.

Nodes of repeated layers (``layers.0`` ... ``layers.31``, found from ``nn_module_stack`` and weight names, the
layers' ops and shapes equal) share one choice: the problem has the variables of one layer, each counted once per
layer, so a 32-layer decoder is solved as fast as a one-layer one.
"""
from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from torch_stablehlo.runtime.device_costs import DeviceCosts
from torch_stablehlo.stablehlo_ir.shardy import Spec

from .op_dims import OpDims, op_dims, shape_of


@dataclass
class Strategy:
    """Mesh axis -> the label it splits (None: not used); the specs that follow, and the node's own cost."""
    assignment: tuple
    result: Spec
    operands: list[Spec]
    seconds: float
    split: int          # devices the result is split across


@dataclass
class Choice:
    """One class of nodes (one node, or the same node of every repeated layer) and its strategies."""
    nodes: list[torch.fx.Node]
    strategies: list[Strategy]
    seconds: list[float] = field(default_factory=list)   # per strategy: own costs of all members, self-edges too
    memory: list[float] | None = None                    # per strategy: bytes per device (weights and inputs)


@dataclass
class Edge:
    """Producer class -> operand ``index`` of consumer class, ``count`` times (once per layer); ``index`` None: a
    result carried back to an input (a loop step's state), taken in the layout the input's class gives it."""
    producer: int
    consumer: int
    index: int | None
    count: int
    nbytes: float

    def taken(self, strategy: Strategy) -> Spec:
        """The layout ``strategy`` of the consumer takes the value in."""
        return strategy.result if self.index is None else strategy.operands[self.index]


@dataclass
class Problem:
    choices: list[Choice]
    edges: list[Edge]
    mesh: dict[str, int]
    costs: DeviceCosts
    _reshards: dict = field(default_factory=dict, repr=False)  # (source, target, nbytes) -> seconds

    def reshard_seconds(self, source: Spec, target: Spec, nbytes: float) -> float:
        """The collectives taking a tensor of ``nbytes`` from layout ``source`` to ``target``."""
        if source == target:
            return 0.0
        key = (source, target, nbytes)
        if key not in self._reshards:
            self._reshards[key] = self._collective_seconds(source, target, nbytes)
        return self._reshards[key]

    def _collective_seconds(self, source: Spec, target: Spec, nbytes: float) -> float:
        split = math.prod(self.mesh[a] for axes in target for a in axes)
        seconds = 0.0
        for axis in self.mesh:
            was, now = _dim_of(source, axis), _dim_of(target, axis)
            if was is None or was == now:
                continue  # unchanged, or only sliced: free
            gather = self.costs.all_gather[axis]
            seconds += gather.seconds(nbytes / split) if now is None else \
                gather.seconds(nbytes / split / self.mesh[axis])  # all-to-all: each device sends a 1/n
        return seconds


def _dim_of(spec: Spec, axis: str):
    return next((d for d, axes in enumerate(spec) if axis in axes), None)


def build_problem(graph: torch.fx.Graph, weight_names: dict[torch.fx.Node, str], mesh: dict[str, int],
                  costs: DeviceCosts, carried: dict[torch.fx.Node, torch.fx.Node] | None = None) -> Problem:
    """The problem for ``graph`` over ``mesh``; ``weight_names`` names the weight and input placeholders (those
    counted in the memory budget); ``carried``: results (graph nodes) the next call takes back as inputs
    (placeholders), as a loop step's state: they stay laid out on the devices, changed only where the input's
    layout differs, where other results are gathered whole."""
    carried = carried or {}
    nodes = [n for n in graph.nodes if n.op in ("placeholder", "call_function") and shape_of(n) is not None]
    classes = _layer_classes(nodes, weight_names)
    problem = Problem([], [], mesh, costs)
    index_of: dict[torch.fx.Node, int] = {}
    dims_of: dict[torch.fx.Node, OpDims] = {}
    for members in classes:
        first = members[0]
        dims = _placeholder_dims(first) if first.op == "placeholder" else op_dims(first)
        for node in members:
            index_of[node], dims_of[node] = len(problem.choices), dims
        strategies = _strategies(dims, mesh, costs, first)
        choice = Choice(members, strategies, [s.seconds * len(members) for s in strategies])
        if first in weight_names:
            nbytes = _nbytes(first)
            choice.memory = [nbytes * len(members) / s.split for s in strategies]
        problem.choices.append(choice)
    outputs = [n for n in next(n for n in graph.nodes if n.op == "output").args[0] if isinstance(n, torch.fx.Node)]
    edges: dict[tuple, Edge] = {}
    for node in outputs:  # results leave the program whole, or go back to the input they are carried to
        if node in carried and node in index_of and carried[node] in index_of:
            key = (index_of[node], index_of[carried[node]], None)
            edges.setdefault(key, Edge(*key, 0, _nbytes(node))).count += 1
        elif node in index_of:
            choice = problem.choices[index_of[node]]
            whole = ((),) * len(shape_of(node))
            choice.seconds = [c + problem.reshard_seconds(s.result, whole, _nbytes(node))
                              for c, s in zip(choice.seconds, choice.strategies)]
    for node in nodes:
        for index, (operand, _) in enumerate(dims_of[node].operands):
            if operand not in index_of:
                continue
            key = (index_of[operand], index_of[node], index)
            if key not in edges:
                edges[key] = Edge(*key, 0, _nbytes(operand))
            edges[key].count += 1
    for edge in edges.values():
        if edge.producer == edge.consumer:  # a layer's node feeding its own twin in the next layer
            choice = problem.choices[edge.producer]
            choice.seconds = [c + edge.count * problem.reshard_seconds(s.result, edge.taken(s), edge.nbytes)
                              for c, s in zip(choice.seconds, choice.strategies)]
        else:
            problem.edges.append(edge)
    return problem


def _placeholder_dims(node: torch.fx.Node) -> OpDims:
    shape = shape_of(node)
    sizes = {i: int(d) if isinstance(d, int) else 1 for i, d in enumerate(shape)}
    return OpDims([], tuple(range(len(shape))), sizes, {i for i, d in enumerate(shape) if not isinstance(d, int)})


def _nbytes(node: torch.fx.Node) -> float:
    value = node.meta["val"]
    return float(math.prod(int(d) if isinstance(d, int) else 1 for d in value.shape) * value.element_size())


def _strategies(dims: OpDims, mesh: dict[str, int], costs: DeviceCosts, node: torch.fx.Node) -> list[Strategy]:
    """Every way of giving each mesh axis one label it divides (or none), no label two axes."""
    open_labels = [label for label in dims.sizes if label not in dims.fixed]
    options = [[None] + [label for label in open_labels if dims.sizes[label] % size == 0]
               for size in mesh.values()]
    contracted = dims.contracted
    result_bytes = _nbytes(node)
    operand_bytes = sum(_nbytes(n) for n, _ in dims.operands)
    found = []
    for assignment in itertools.product(*options):
        used = [label for label in assignment if label is not None]
        if len(set(used)) != len(used):
            continue
        axes_of = defaultdict(tuple)
        for axis, label in zip(mesh, assignment):
            if label is not None:
                axes_of[label] += (axis,)
        spec = lambda labels: tuple(axes_of[label] for label in labels)  # noqa: E731
        split_all = math.prod(size for size, label in zip(mesh.values(), assignment) if label is not None)
        result_split = math.prod(mesh[a] for label in dims.result for a in axes_of[label])
        seconds = (dims.flops / costs.flops if dims.flops else (result_bytes + operand_bytes) / costs.memory)
        seconds /= split_all
        if node.op != "placeholder":
            for axis, label in zip(mesh, assignment):
                if label in contracted:
                    seconds += costs.all_reduce[axis].seconds(result_bytes / result_split)
        found.append(Strategy(assignment, spec(dims.result), [spec(labels) for _, labels in dims.operands],
                              seconds, result_split))
    return found


def _layer_classes(nodes: list[torch.fx.Node], weight_names: dict[torch.fx.Node, str]) -> list[list[torch.fx.Node]]:
    """The nodes grouped: each node of a repeated layer with its twins in the other layers, every other node
    alone."""
    twin: dict[torch.fx.Node, torch.fx.Node] = {}
    for layers in repeated_layers(nodes, weight_names):
        for members in layers:
            twin.update(zip(members, layers[0]))
    classes: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        classes.setdefault(twin.get(node, node), []).append(node)
    return list(classes.values())


def repeated_layers(nodes: list[torch.fx.Node],
                    weight_names: dict[torch.fx.Node, str]) -> list[list[list[torch.fx.Node]]]:
    """Per stack of repeated layers (``layers.0`` ... ``layers.N`` whose every layer has the same ops, shapes and
    wiring), its layers in order, each its nodes in one order (so the i-th node of every layer are twins)."""
    groups: dict[str, dict[int, list[torch.fx.Node]]] = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        if node.op == "call_function":
            place = _layer_of(node)
            if place:
                groups[place[0]][place[1]].append(node)
    for node in nodes:
        if node.op == "placeholder" and node in weight_names:
            for family in groups:
                match = re.match(rf"{re.escape(family)}\.(\d+)\.", weight_names[node])
                if match:
                    groups[family][int(match.group(1))].append(node)
                    break
    stacks = []
    for family, layers in groups.items():
        ordered = [_ordered(members, weight_names) for _, members in sorted(layers.items())]
        shapes = [_layout(members, weight_names) for members in ordered]
        if len(ordered) > 1 and all(s == shapes[0] for s in shapes):
            stacks.append(ordered)
    return stacks


def _layer_of(node: torch.fx.Node):
    """(stack name, layer index) of the outermost numbered module ``node`` was traced in, e.g. ("layers", 3)."""
    for path, _ in (node.meta.get("nn_module_stack") or {}).values():
        match = re.fullmatch(r"(.+)\.(\d+)", path) if isinstance(path, str) else None
        if match:
            return match.group(1), int(match.group(2))
    return None


def _ordered(members, weight_names) -> list[torch.fx.Node]:
    """A layer's ops in graph order, then its weights by name with the layer index taken out."""
    ops = [n for n in members if n.op == "call_function"]
    weights = sorted((n for n in members if n.op == "placeholder"),
                     key=lambda n: re.sub(r"\.\d+\.", ".#.", weight_names[n], count=1))
    return ops + weights


def _layout(members, weight_names) -> list:
    """What must match for two layers to share a choice: each node's op, shape and operands (by position in the
    layer, or as outside it); each weight's name without its layer index."""
    position = {n: i for i, n in enumerate(members)}
    found = []
    for node in members:
        if node.op == "placeholder":
            found.append((re.sub(r"\.\d+\.", ".#.", weight_names[node], count=1), shape_of(node)))
        else:
            found.append((str(node.target), shape_of(node),
                          tuple(position.get(a, -1) for a in node.all_input_nodes)))
    return found
