"""One walk over the FX graph of an ExportedProgram, emitting a StableHLO ``@main``.

Graph placeholders (parameters, buffers, lifted constants, then user inputs)
become the arguments of ``@main`` in the same order; non-tensor placeholders
are folded in as the Python values torch.export specialised them to.
"""
from __future__ import annotations

import itertools
import operator
from typing import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

import aten_lowerings  # noqa: F401  (registers every op family)
from aten_lowerings.context import LoweringContext
from aten_lowerings.mlir_types import tensor_type
from aten_lowerings.registry import lowering_for, op_name
from aten_lowerings.sampling import RNG_SEED_DTYPE, RNG_SEED_NAME, seeded_key, uses_random
from aten_lowerings.shape_values import SymbolicDims

from .errors import LoweringError
from .locations import LocationCache, describe
from .progress import progress

def _is_tensor_meta(meta) -> bool:
    return isinstance(meta, torch.Tensor)

def _is_size_meta(meta) -> bool:
    """A SymInt over input dims (not a data-dependent one, from ``.item()`` or ``nonzero``)."""
    return isinstance(meta, torch.SymInt) and not free_unbacked_symbols(meta)

class GraphLowering:
    """Lowers the graph of one ExportedProgram into a fresh ``ir.Module``."""

    def __init__(self, graph_module: torch.fx.GraphModule):
        self.graph_module = graph_module
        self.dims = SymbolicDims()
        self.locations = LocationCache()
        self._seed: ir.Value | None = None  # @main's last argument where the graph draws random numbers
        self._keys = itertools.count()

    def lower(self, context: ir.Context, arg_names: Sequence[str] | None = None,
              function_name: str = "main") -> ir.Module:
        """Build the module; ``arg_names`` (one per tensor placeholder) become the arguments' locations."""
        placeholders = [n for n in self.graph_module.graph.nodes if n.op == "placeholder"]
        tensor_inputs = [n for n in placeholders if _is_tensor_meta(n.meta.get("val"))]
        with context, ir.Location.unknown():
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                arg_types = [tensor_type(n.meta["val"].shape, n.meta["val"].dtype) for n in tensor_inputs]
                names = list(arg_names or [n.name for n in tensor_inputs])
                random = uses_random(self.graph_module)
                if random:  # after the user inputs, like the signature's rng_seed slot
                    arg_types.append(tensor_type([], RNG_SEED_DTYPE))
                    names = names[:len(tensor_inputs)] + [RNG_SEED_NAME]
                function = func.FuncOp(function_name, (arg_types, []))
                function.attributes["sym_visibility"] = ir.StringAttr.get("public")
                block = function.add_entry_block(arg_locs=[ir.Location.name(name) for name in names])
                self._seed = block.arguments[-1] if random else None
            for node, argument in zip(tensor_inputs, block.arguments):
                self.dims.bind_input(argument, node.meta["val"].shape)
            with ir.InsertionPoint(block):
                argument_of = dict(zip(tensor_inputs, block.arguments))
                inputs = [argument_of[n] if n in argument_of else n.meta.get("val") for n in placeholders]
                output = next(n for n in self.graph_module.graph.nodes if n.op == "output")
                results = [r for r, a in zip(self.lower_graph(self.graph_module, inputs), output.args[0])
                           if isinstance(a, torch.fx.Node)]  # constant outputs live in the signature
                func.ReturnOp(results)
            function.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(arg_types, [r.type for r in results]))
            try:
                module.operation.verify()
            except ir.MLIRError as error:  # a rule emitted an invalid op: say which, not just "parse failed" later
                raise LoweringError(f"the emitted StableHLO does not verify: {error}") from error
        return module

    def lower_graph(self, graph_module: torch.fx.GraphModule, inputs: Sequence) -> list:
        """Lower a graph given the values of its placeholders; returns its flat outputs."""
        env: dict[torch.fx.Node, object] = {}
        placeholders = iter(inputs)
        nodes = graph_module.graph.nodes
        if graph_module is self.graph_module:  # the top graph: a progress bar if it runs long on a terminal
            nodes = progress(nodes, desc="lowering", unit="node", total=len(nodes))
        for node in nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "get_attr":
                env[node] = getattr(graph_module, node.target)
            elif node.op == "call_function":
                env[node] = self._lower_call(node, env)
            elif node.op == "output":
                return list(torch.fx.node.map_aggregate(node.args[0], lambda a: env[a] if isinstance(a, torch.fx.Node) else a))
            else:
                raise LoweringError(f"unexpected FX node kind {node.op!r} ({node.format_node()})")
        raise LoweringError("graph has no output node")

    def _lower_call(self, node: torch.fx.Node, env: dict):
        if node.target is operator.getitem:
            source, index = node.args
            return env[source][index]
        meta = node.meta.get("val")
        name = op_name(node.target)
        with self.locations.for_node(node, name):
            if _is_size_meta(meta):  # SymInt arithmetic: emitted from its expression
                return self.dims.size(meta)
            rule = lowering_for(node.target)
            if rule is None:  # checked before the walk; only reachable for nested graphs
                raise LoweringError(f"no lowering for {name} at {describe(node)}")
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            ctx = LoweringContext(node, self.dims, self.lower_graph, self._rng_key if self._seed is not None else None)
            try:
                return rule(ctx, *args, **kwargs)
            except LoweringError:
                raise
            except Exception as error:
                raise LoweringError(
                    f"lowering {name} failed at {describe(node)}: {type(error).__name__}: {error}\n"
                    f"  node: {node.format_node()}") from error

    def _rng_key(self) -> ir.Value:
        return seeded_key(self._seed, next(self._keys))


def unsupported_targets(graph_module: torch.fx.GraphModule) -> dict:
    """Every call target (nested graphs included) without a lowering: target -> list of nodes."""
    missing: dict[object, list[torch.fx.Node]] = {}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            attr = getattr(graph_module, node.target)
            if isinstance(attr, torch.fx.GraphModule):
                for target, nodes in unsupported_targets(attr).items():
                    missing.setdefault(target, []).extend(nodes)
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if _is_size_meta(node.meta.get("val")) or lowering_for(node.target) is not None:
            continue
        missing.setdefault(node.target, []).append(node)
    return missing
