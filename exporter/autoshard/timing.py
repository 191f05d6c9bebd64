"""Plans timed on the mesh: each candidate plan compiled and run on the mesh's devices, the calls alternated
between the plans in rounds (a shared machine's noise falls on all of them alike), the best call of each kept;
a plan far behind after its first timed calls is not called again.

Where the program has stacks of repeated layers, they are timed on a shallow copy of it: each stack cut to its
first ``KEPT_LAYERS`` layers (the last kept layer's results feed what the stack's last layer fed), so a 32-layer
decoder's plans compile and run as a 1-layer one's (compiling is most of the search's time: one layer is half a
2-layer copy's, and the layout a layer hands the next is the one it took from the embedding). The plans name
weights by the program's names; those of the cut layers are dropped with them, the kept layer's specs are every
repeated layer's (the search ties them).

The candidates are compiled at LLVM optimisation level 1 (``TIMING_OPTIONS``): XLA's HLO passes, the SPMD
partitioning and its collectives are the final program's, only the fused kernels' machine code is optimised less.
Compiling is most of the search's time and this halves it (a one-layer decoder's five candidates on 8 CPU devices:
3.5 s of CPU time against 8.5 s); the candidates' times and their order matched level 2's within the machine's noise
(Llama-style and GPT-2 on {data: 2, model: 4}, every candidate compiled both ways and timed in the same rounds;
BERT on {data: 2, model: 4}: data-parallel and Megatron within 10% of each other on one and two layers, at both
levels). What does not hold on a loaded machine is the order of a few calls: the search (``choose``) times every
candidate ``ROUNDS`` times, then the close ones ``CONFIRM_ROUNDS`` times more (``TimedRuns.timed``: no compile).
"""
from __future__ import annotations

import time

import torch
from torch.export import ExportedProgram

from torch_stablehlo.exported_program import WeightRewrite
from torch_stablehlo.runtime import pjrt

from ..conversion.calls import tensor_inputs
from ..conversion.inplace import InPlaceWrites
from ..conversion.lowerable import lowerable
from ..conversion.signature import Signature, signature_of
from ..formats.artifact import StableHLOArtifact
from .plan import ShardingPlan, held_slots
from .problem import repeated_layers

TIMING_OPTIONS = (("xla_backend_optimization_level", 1),)
KEPT_LAYERS = 1
ROUNDS = 5  # the first call compiles and places the weights; the best of the others counts
CONFIRM_ROUNDS = 8  # more calls for close candidates: on a loaded machine the best of four put BERT's Megatron plan
#                     2x behind data-parallel where more calls put them 10% apart
SLOWER = 2.5  # a plan whose first timed calls are this much slower than the best one's is not called again (a
#              few calls on a loaded machine can be 2x off)


def timeable(program: ExportedProgram, signature: Signature) -> bool:
    """Whether the plans can be timed: static shapes, weights with data, example inputs kept by torch.export."""
    return (not signature.is_dynamic and program.example_inputs is not None
            and not any(getattr(v, "is_meta", False) for v in [*program.state_dict.values(),
                                                                  *program.constants.values()]))


class TimedRuns:
    """The candidate plans (by name) compiled on ``program``'s shallow copy, and the best call of each so far."""

    def __init__(self, program: ExportedProgram, signature: Signature, plans: dict[str, ShardingPlan],
                 platform: str = "cpu"):
        shallow = shallow_program(program, held_slots(signature, program))
        shallow_writes = InPlaceWrites.of_program(shallow)
        shallow_signature = signature_of(shallow, shallow_writes.kinds)
        args, kwargs = program.example_inputs
        self.inputs = tensor_inputs(shallow_signature, args, kwargs)
        self.runs = {}
        for name, plan in plans.items():
            sharded = _restricted(plan, shallow_signature, shallow)
            conversion = lowerable(shallow, shallow_signature, shallow_writes, plan.mesh, sharded, (platform,))
            text = conversion.lower().operation.get_asm()
            self.runs[name] = StableHLOArtifact(text, conversion.signature, conversion.weights, platform=platform)
        self.best = dict.fromkeys(self.runs, float("inf"))
        self._calls = dict.fromkeys(self.runs, 0)

    def timed(self, names, rounds: int) -> dict[str, float]:
        """Seconds of the best call so far of each of ``names``, after ``rounds`` more calls of each (alternated;
        a plan's first call compiles it and is not counted; one far behind after two is not called again)."""
        with pjrt.extra_xla_options(*TIMING_OPTIONS):
            for _ in range(rounds):
                leader = min(self.best[name] for name in names)
                for name in names:
                    if self._calls[name] > 2 and self.best[name] > SLOWER * leader:
                        continue  # out of the running: its calls say so
                    start = time.perf_counter()
                    self.runs[name].run_flat(self.inputs)
                    if self._calls[name]:
                        self.best[name] = min(self.best[name], time.perf_counter() - start)
                    self._calls[name] += 1
        return {name: self.best[name] for name in names}


def shallow_program(program: ExportedProgram, names: dict[torch.fx.Node, str]) -> ExportedProgram:
    """``program`` with each stack of more than ``KEPT_LAYERS`` repeated layers cut to its first ones (a copy;
    ``program`` itself if it has none)."""
    stacks = [layers for layers in repeated_layers(list(program.graph.nodes), names) if len(layers) > KEPT_LAYERS]
    if not stacks:
        return program
    rewrite = WeightRewrite(program)
    copy_of = {old.name: new for old, new in zip(program.graph.nodes, rewrite.graph.nodes)}
    dropped, twin = set(), {}
    for layers in stacks:
        for layer in layers[KEPT_LAYERS:]:
            for node, last in zip(layer, layers[KEPT_LAYERS - 1]):
                dropped.add(copy_of[node.name])
                twin[copy_of[node.name]] = copy_of[last.name]
    output = next(n for n in rewrite.graph.nodes if n.op == "output")
    for node in dropped:  # what the cut layers fed outside them (the stack's output) now reads the last kept layer
        if output in node.users:
            rewrite.returned_instead(node, twin[node])
        node.replace_all_uses_with(twin[node], delete_user_cb=lambda user: user not in dropped)
    for node in reversed(list(rewrite.graph.nodes)):
        if node in dropped:
            if node.op == "placeholder":
                rewrite.drop(node)
            else:
                rewrite.graph.erase_node(node)
    return rewrite.program()


def _restricted(plan: ShardingPlan, signature: Signature, program: ExportedProgram) -> ShardingPlan:
    """``plan`` for the shallow copy: its specs of the tensors the copy takes, its constraints on nodes it has."""
    names = {slot.name for slot in signature.inputs}
    nodes = {node.name for node in program.graph.nodes}
    return ShardingPlan({n: s for n, s in plan.items() if n in names}, plan.mesh,
                        {n: h for n, h in plan.held.items() if n in names},
                        constraints={n: s for n, s in plan.constraints.items() if n in nodes})
