"""Sharding plans: the integer program's optimum (``ilp_plan``), FSDP and data-parallel plans, and the
``ShardingPlan`` each is: name -> spec for every weight and input, as ``shardings=`` takes it, plus the
activations to constrain. The search (``choose``) weighs them against each other.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from torch_stablehlo.exported_program import USER_INPUT, copied_graph_module
from torch_stablehlo.runtime.device_costs import DeviceCosts
from torch_stablehlo.stablehlo_ir.shardy import Spec

from ..conversion.signature import RNG_SEED, Signature
from ..errors import ShardingError
from .op_dims import CONTRACTIONS, is_contraction, shape_of
from .picture import entry_axes, plan_text
from .problem import build_problem, repeated_layers
from .solve import solve


@dataclass(frozen=True)
class Held:
    """One weight or input of a plan: its shape and dtype size, for the picture and the byte counts."""
    shape: tuple
    itemsize: int


class ShardingPlan(dict):
    """Name -> spec (a tuple with one entry per dim: a mesh axis, a tuple of axes, or None; ``()``: replicated)
    for every weight and input. ``cost``: one call's seconds as the search judged it (the best call of the plan
    timed on the mesh, or the integer program's estimate; None for plans not searched); ``constraints``: graph
    node name -> spec, the activations the program is told to lay out so; ``mesh``; ``held``: each name's shape
    and item size. ``str(plan)`` draws it (``picture.plan_text``).
    """

    def __init__(self, specs: dict, mesh: dict[str, int], held: dict[str, Held], cost: float | None = None,
                 constraints: dict[str, Spec] | None = None):
        super().__init__(specs)
        self.mesh, self.held, self.cost, self.constraints = mesh, held, cost, constraints or {}
        self.timings: dict[str, float] = {}  # the search's candidates, timed on the mesh (``autoshard.choose``)
        self.confirmed: dict[str, float] = {}  # the close ones, after more calls
        self.chosen: str | None = None       # which candidate this plan is

    def device_bytes(self, name: str) -> int:
        """Bytes of ``name`` each device holds."""
        held = self.held[name]
        split = math.prod(self.mesh[a] for entry in self[name] for a in entry_axes(entry))
        return math.prod(int(d) if isinstance(d, int) else 1 for d in held.shape) * held.itemsize // split

    @property
    def total_device_bytes(self) -> int:
        return sum(self.device_bytes(name) for name in self)

    @classmethod
    def of_signature(cls, signature: Signature) -> "ShardingPlan":
        """The plan a (loaded) program was partitioned with: its inputs' shardings (those left to XLA omitted)."""
        slots = [s for s in signature.caller_inputs if s.sharding is not None]
        return cls({s.name: user_spec(s.sharding) for s in slots}, dict(signature.mesh or {}),
                   {s.name: Held(s.tensor.shape, s.tensor.torch_dtype.itemsize) for s in slots})

    def __str__(self) -> str:
        return plan_text(self)


def user_spec(spec: Spec) -> tuple:
    """A ``Spec`` as ``shardings=`` takes it (``("model", None)``), trailing unsplit dims dropped."""
    entries = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def held_slots(signature: Signature, program: ExportedProgram) -> dict[torch.fx.Node, str]:
    """The program's placeholders that are weights or inputs, by signature name."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    return {node: slot.name for node, slot in zip(placeholders, signature.inputs)
            if slot.tensor is not None and slot.kind != RNG_SEED}


def checked_budget(max_bytes_per_device):
    if max_bytes_per_device is not None and not (isinstance(max_bytes_per_device, (int, float))
                                                 and max_bytes_per_device > 0):
        raise ShardingError(f"max_bytes_per_device must be a positive number of bytes, got {max_bytes_per_device!r}")
    return max_bytes_per_device


def ilp_plan(program: ExportedProgram, signature: Signature, mesh: dict[str, int], costs: DeviceCosts,
             max_bytes_per_device=None, loop_carried: int = 0) -> ShardingPlan:
    """The plan whose estimate under ``costs`` is least, under the budget (``problem`` solved by ``solve``);
    ``loop_carried``: the program's first that many results are its first user inputs at the next call (a loop's
    step)."""
    names = held_slots(signature, program)
    problem = build_problem(program.graph, names, mesh, costs, carried_results(program, loop_carried))
    solution = solve(problem, max_bytes_per_device)
    specs, constraints = {}, {}
    for choice, pick in zip(problem.choices, solution.picks):
        strategy = choice.strategies[pick]
        for node in choice.nodes:
            if node in names:
                specs[names[node]] = user_spec(strategy.result)
            elif is_contraction(node):
                constraints[node.name] = strategy.result
    order = list(names.values())  # the signature's order
    return ShardingPlan({n: specs[n] for n in order}, mesh, _held(names), solution.seconds, constraints)


def carried_results(program: ExportedProgram, count: int) -> dict[torch.fx.Node, torch.fx.Node]:
    """The program's first ``count`` user results -> the user inputs (placeholders) they are at the next call."""
    if not count:
        return {}
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    inputs = [n for n, spec in zip(placeholders, program.graph_signature.input_specs)
              if spec.kind == InputKind.USER_INPUT]
    returned = next(n for n in program.graph.nodes if n.op == "output").args[0]
    results = [n for n, spec in zip(returned, program.graph_signature.output_specs)
               if spec.kind == OutputKind.USER_OUTPUT]
    return {result: given for result, given in zip(results[:count], inputs[:count])
            if isinstance(result, torch.fx.Node)}


def data_parallel_plan(program: ExportedProgram, signature: Signature, mesh: dict[str, int]) -> ShardingPlan:
    """Every weight whole on every device, every input's dim 0 split over as many of the mesh's axes (in order)
    as divide it."""
    names = held_slots(signature, program)
    kinds = {s.name: s.kind for s in signature.inputs}
    specs = {}
    for node, name in names.items():
        specs[name] = ()
        size = shape_of(node)[0] if kinds[name] == "user_input" and shape_of(node) else None
        if isinstance(size, int):
            axes = _dividing_axes(size, mesh)
            specs[name] = (axes[0] if len(axes) == 1 else axes,) if axes else ()
    return ShardingPlan(specs, mesh, _held(names))


def megatron_plan(program: ExportedProgram, signature: Signature, mesh: dict[str, int]) -> ShardingPlan:
    """The hand-written tensor-parallel plan (Megatron-LM's) over the mesh's last axis, found from the graph: in
    each stack of repeated layers, a product whose result goes back to the residual stream (reaches an ``add``
    through views alone: attention's output projection, the MLP's down projection) is rowwise, every other product
    of a weight (q/k/v, gate/up) colwise with its bias; the other weights whole; the inputs' dim 0 over the
    other axes, where they divide it (data-parallel)."""
    axis = list(mesh)[-1]
    names = held_slots(signature, program)
    plan = data_parallel_plan(program, signature, {a: n for a, n in mesh.items() if a != axis})
    plan.mesh = mesh
    stacks = repeated_layers([n for n in program.graph.nodes if n.op in ("placeholder", "call_function")], names)
    for layer in (layer for layers in stacks for layer in layers):
        for weight, dim in [split for node in layer for split in _weight_split(node) + _experts_split(node, layer)]:
            if weight in names and shape_of(weight)[dim] % mesh[axis] == 0:
                plan[names[weight]] = (None,) * dim + (axis,)
    return plan


_VIEWS = {torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default,
          torch.ops.aten.dropout.default, torch.ops.aten.clone.default, torch.ops.aten.to.dtype,
          torch.ops.aten._to_copy.default, torch.ops.aten.alias.default}


def _to_residual(node: torch.fx.Node, result: torch.fx.Node | None = None) -> bool:
    """Whether ``node``'s result (``result``: the product's) reaches, through views alone, an ``add`` whose other
    operand does not come from it (the residual stream; gelu's ``x + 0.044715 * x**3`` is not)."""
    result = result or node
    for user in node.users:
        if user.target is torch.ops.aten.add.Tensor:
            others = [a for a in user.args if isinstance(a, torch.fx.Node) and a is not node]
            if others and not any(_comes_from(other, result) for other in others):
                return True
        elif user.target in _VIEWS and _to_residual(user, result):
            return True
    return False


def _to_choice(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result reaches a softmax or top-k through views alone."""
    return any(user.target in _CHOICES or (user.target in _VIEWS and _to_choice(user)) for user in node.users)


_CHOICES = {torch.ops.aten._softmax.default, torch.ops.aten.softmax.int, torch.ops.aten.topk.default}


def _comes_from(value: torch.fx.Node, source: torch.fx.Node, steps: int = 16) -> bool:
    """Whether ``value`` is computed from ``source`` within ``steps`` ops."""
    return value is source or (steps > 0 and any(_comes_from(a, source, steps - 1) for a in value.all_input_nodes))


def _weight_split(node: torch.fx.Node) -> list[tuple[torch.fx.Node, int]]:
    """(weight placeholder, dim to split) of a product of a weight: linear's [out, in] weight (and bias), addmm's
    and mm's [in, out] one (Conv1D); rowwise where its result goes back to the residual stream."""
    rowwise = _to_residual(node)
    if _to_choice(node):  # a router's scores: chosen among whole (not a product Megatron splits)
        return []
    if node.target is torch.ops.aten.linear.default and len(node.args) > 1:
        weight, bias = node.args[1], node.args[2] if len(node.args) > 2 else None
        return [(weight, 1)] if rowwise else [(weight, 0)] + ([(bias, 0)] if bias is not None else [])
    if node.target in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
        bias, weight = (node.args[0], node.args[2]) if node.target is torch.ops.aten.addmm.default else \
            (None, node.args[1])
        return [(weight, 0)] if rowwise else [(weight, 1)] + ([(bias, 0)] if bias is not None else [])
    return []


def _experts_split(node: torch.fx.Node, layer: list[torch.fx.Node]) -> list[tuple[torch.fx.Node, int]]:
    """(weight placeholder, dim to split) of a mixture of experts' grouped product (``op_dims``' einsum over
    experts, inputs and outputs: weights [experts, inner, out], as given or the transpose of [experts, out, inner]):
    the product whose input comes from another grouped product of its ``layer`` (the experts' down projection)
    splits its inner
    dim, the others their output dim (each expert's MLP split as Megatron splits a dense one)."""
    if not is_contraction(node) or node.target in CONTRACTIONS - {torch.ops.aten._grouped_mm.default}:
        return []
    x, weight = node.args[:2]
    transposed = weight.target is torch.ops.aten.transpose.int and sorted(d % 3 for d in weight.args[1:]) == [1, 2]
    placeholder = weight.args[0] if transposed else weight
    rowwise = any(other is not node and other.target == node.target and _comes_from(x, other) for other in layer)
    inner, out = (2, 1) if transposed else (1, 2)
    return [(placeholder, inner if rowwise else out)]


def _dividing_axes(size: int, mesh: dict[str, int]) -> tuple:
    axes, split = (), 1
    for axis, count in mesh.items():
        if size % (split * count) == 0:
            axes, split = axes + (axis,), split * count
    return axes


def _held(names: dict[torch.fx.Node, str]) -> dict[str, Held]:
    return {name: Held(tuple(node.meta["val"].shape), node.meta["val"].element_size()) for node, name in names.items()}


def fsdp_plan(program: ExportedProgram, signature: Signature, axis: str = "fsdp",
              batch_axis: str | None = None, mesh: dict[str, int] | None = None) -> ShardingPlan:
    """Every weight's largest dim divisible by ``mesh[axis]`` split over ``axis`` (none divisible: replicated),
    every input's dim 0 over ``batch_axis`` where it divides, and the products' results constrained to be split
    only over the batch, so each weight is gathered where it is used (PyTorch/XLA's FSDPv2 layout). Without a mesh, the
    axis sizes are read as any size: the largest dim is split."""
    sizes = dict(mesh or {})
    for name in (axis, batch_axis):
        if name is not None and sizes and name not in sizes:
            raise ShardingError(f"fsdp_shardings: axis {name!r} is not in the mesh {sizes}")
    specs, held = {}, {}
    for node, name in held_slots(signature, program).items():
        value = node.meta["val"]
        shape = [int(d) if isinstance(d, int) else None for d in value.shape]
        held[name] = Held(tuple(value.shape), value.element_size())
        slot_kind = next(s.kind for s in signature.inputs if s.name == name)
        if slot_kind == USER_INPUT:
            ok = batch_axis is not None and shape and (shape[0] is None or shape[0] % sizes.get(batch_axis, 1) == 0)
            specs[name] = (batch_axis,) if ok else ()
            continue
        fits = [d for d, size in enumerate(shape) if size is not None and size % sizes.get(axis, 1) == 0
                and size >= sizes.get(axis, 1)]
        dim = max(fits, key=lambda d: (shape[d], -d), default=None)
        specs[name] = () if dim is None else (None,) * dim + (axis,)
    constraints = {}  # products' results whole but for the batch: each weight is gathered where it is used
    for node in program.graph.nodes:
        if node.op == "call_function" and is_contraction(node):
            shape = node.meta["val"].shape
            split = batch_axis is not None and shape and isinstance(shape[0], int) and \
                shape[0] % sizes.get(batch_axis, 1) == 0
            constraints[node.name] = ((batch_axis,) if split else (),) + ((),) * (len(shape) - 1)
    return ShardingPlan(specs, sizes, held, constraints=constraints)


def constrained_graph(graph_module: torch.fx.GraphModule, constraints: dict[str, Spec]) -> torch.fx.GraphModule:
    """A copy of ``graph_module`` with a ``mark_sharding`` after each node ``constraints`` names."""
    copy = copied_graph_module(graph_module)
    by_name = {n.name: n for n in copy.graph.nodes}
    for name, spec in constraints.items():
        if name not in by_name:
            raise ShardingError(f"the plan constrains node {name!r}, which this program lacks: a plan's activation "
                                "constraints hold for the program it was searched on")
        node = by_name[name]
        with copy.graph.inserting_after(node):
            marked = copy.graph.call_function(torch.ops.torch_stablehlo.mark_sharding.default,
                                              (node, json.dumps([list(axes) for axes in spec])))
        marked.meta = {**node.meta, "val": node.meta["val"]}
        node.replace_all_uses_with(marked, delete_user_cb=lambda user: user is not marked)
    copy.recompile()
    return copy
