"""The graph ``GraphLowering`` walks and the signature it lowers ``@main`` to, for a program made convertible
(``pipeline._ready``) and a sharding: what ``export_to_stablehlo`` lowers, and what the sharding search compiles
and times for each plan it weighs (``exporter.autoshard.timing``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxlib.mlir import ir
from torch.export import ExportedProgram

from torch_stablehlo.exported_program import shape_env_of, weight_values
from torch_stablehlo.quantize import lowering_graph
from torch_stablehlo.stablehlo_ir.mlir_context import make_context

from ..autoshard.plan import ShardingPlan, constrained_graph
from .composite_regions import outline_composites
from .graph_lowering import GraphLowering
from .inplace import InPlaceWrites
from .input_shardings import shard_signature
from .read_only import untouched
from .signature import Signature


@dataclass
class Conversion:
    """A model made ready to lower: ``lower`` builds its StableHLO."""
    program: ExportedProgram             # the convertible program (see ``convert``)
    signature: Signature                 # @main's calling convention
    graph_module: torch.fx.GraphModule   # the graph to lower (``quantize.lowering_graph``)
    writes: InPlaceWrites                # what that graph writes in place
    weights: dict[str, torch.Tensor]     # @main's held arguments: the weights and the state's exported values
    plan: ShardingPlan | None = None     # the searched sharding plan (shardings="auto" or a ShardingPlan given)

    def lower(self, exposed: Sequence[torch.fx.Node] = ()) -> ir.Module:
        """``@main`` in a fresh module, for the signature's platforms; it also returns the values of the
        ``exposed`` top-graph nodes, last."""
        with untouched(shape_env_of(self.program), "lowering"):
            lowering = GraphLowering(self.graph_module, self.signature, self.writes.functional, exposed)
            return lowering.lower(make_context())


def lowerable(program: ExportedProgram, signature: Signature, writes: InPlaceWrites, mesh, shardings,
              platforms: Sequence[str] = (), quantized_ops: str = "fused") -> Conversion:
    """``program`` ready to lower: ``signature`` sharded over ``mesh`` as ``shardings`` says (a mapping, a
    ``ShardingPlan`` or None), the graph to lower (quantization ops as ``quantized_ops`` says, composites
    outlined, a plan's activation constraints added) and what it writes in place (``writes``: the analysis of
    ``program``'s graph, carried over to the graph to lower where that is a copy)."""
    signature = dataclasses.replace(shard_signature(signature, mesh, shardings, program.graph_module),
                                    platforms=list(platforms))
    graph_module = outline_composites(lowering_graph(program, quantized_ops))
    if isinstance(shardings, ShardingPlan) and shardings.constraints and mesh is not None:  # activation layouts
        graph_module = constrained_graph(graph_module, shardings.constraints)
    writes = writes.on_copy(graph_module)  # a copy where quantization ops are annotated or composites outlined
    plan = shardings if isinstance(shardings, ShardingPlan) and mesh is not None else None
    return Conversion(program, signature, graph_module, writes, held_values(program, signature), plan)


def held_values(program: ExportedProgram, signature: Signature) -> dict[str, torch.Tensor]:
    """The values of ``@main``'s held arguments: the weights (the program's own tensors, never copies) and the
    state's exported values (copies: running ``ep.module()`` writes the program's own)."""
    held = weight_values(program, [slot.target for slot in signature.held_inputs])
    for slot in signature.state:
        value = held[slot.target]
        held[slot.target] = value if value.is_meta else value.detach().clone()
    return held
