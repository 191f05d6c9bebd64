"""What a lowering rule sees of the node it lowers."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxlib.mlir import ir

from .mlir_types import tensor_type
from .shape_values import SymbolicDims
from .value_facts import ValueFacts


class LoweringContext:
    """Per-node view for a rule: the node's metadata in and out, shape values, the program's device mesh, and the
    platforms the code being emitted runs on.

    Rules read result shapes and dtypes from here (torch.export already knows
    them) instead of re-deriving them from operands, and whether the program is
    SPMD from ``mesh`` (the signature's, which the graph walker passes on).
    """

    __slots__ = ("node", "dims", "facts", "mesh", "platforms", "platform_index", "_lower_graph", "_rng_key")

    def __init__(self, node: torch.fx.Node, dims: SymbolicDims,
                 lower_graph: Callable[[torch.fx.GraphModule, Sequence], list],
                 rng_key: Callable[[], ir.Value] | None = None, *, mesh: dict[str, int] | None,
                 platforms: tuple[str, ...] = (), platform_index: ir.Value | None = None,
                 facts: ValueFacts | None = None):
        self.node = node
        self.dims = dims
        # what the walk knows about the values lowered so far beyond their types (value_facts): rules read it
        # instead of the ops that made their operands
        self.facts = facts if facts is not None else ValueFacts()
        self.mesh = mesh  # the device mesh (axis -> size) @main is partitioned over; None: one device
        # the platforms the code emitted here runs on: the module's, or one in a branch of a per-platform
        # ``stablehlo.case`` (``emit.platform_case``); none given: JAX's default backend lowers JAX functions
        self.platforms = platforms
        self.platform_index = platform_index  # @main's platform index argument, where the module has one
        self._lower_graph = lower_graph
        self._rng_key = rng_key

    # -- outputs ---------------------------------------------------------
    @property
    def out_meta(self):
        """The node's ``meta['val']``: a FakeTensor, or a tuple/list of them."""
        return self.node.meta["val"]

    @property
    def out_shape(self) -> torch.Size:
        return self.out_meta.shape

    @property
    def out_dtype(self) -> torch.dtype:
        return self.out_meta.dtype

    def out_type(self, index: int | None = None) -> ir.RankedTensorType:
        meta = self.out_meta if index is None else self.out_meta[index]
        return tensor_type(meta.shape, meta.dtype)

    # -- inputs ----------------------------------------------------------
    def arg_meta(self, index: int):
        """``meta['val']`` of the node's positional tensor argument ``index`` (None for literals and scalars)."""
        arg = self.node.args[index]
        meta = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        return meta if isinstance(meta, torch.Tensor) else None

    def literal(self, position: int, key: str | None = None, default=None):
        """Argument ``position`` (or keyword ``key``) as written in the graph, SymInt nodes read as their SymInts
        (sizes, strides, offsets that rules need as numbers or size expressions, not as values)."""
        args = self.node.args
        arg = args[position] if position < len(args) else self.node.kwargs.get(key, default)
        return torch.fx.node.map_arg(arg, lambda node: node.meta["val"])

    # -- shapes ----------------------------------------------------------
    def size_value(self, size) -> ir.Value:
        return self.dims.size(size)

    def shape_value(self, sizes) -> ir.Value:
        return self.dims.shape(list(sizes))

    def with_dims(self, dims: SymbolicDims) -> "LoweringContext":
        """This node's context with its symbolic sizes read from ``dims`` (a decomposition function's own) and no
        random numbers (a function cannot reach ``@main``'s ``rng_seed``)."""
        return LoweringContext(self.node, dims, self._lower_graph, mesh=self.mesh, platforms=self.platforms,
                               platform_index=self.platform_index, facts=self.facts)

    def on_platform(self, platform: str) -> "LoweringContext":
        """This node's context for the code of one platform (a branch of a per-platform ``stablehlo.case``)."""
        return LoweringContext(self.node, self.dims, self._lower_graph, self._rng_key, mesh=self.mesh,
                               platforms=(platform,), platform_index=self.platform_index, facts=self.facts)

    # -- random numbers ---------------------------------------------------
    def rng_key(self) -> ir.Value:
        """A fresh ``tensor<2xui64>`` THREE_FRY state: the program's ``rng_seed`` argument and a number of its own."""
        if self._rng_key is None:
            raise NotImplementedError("random ops here have no rng_seed argument to draw from")
        return self._rng_key()

    # -- nested graphs (higher-order ops) ---------------------------------
    def lower_graph(self, graph_module: torch.fx.GraphModule, args: Sequence) -> list:
        """The nested graph's outputs given its inputs' values, its symbolic sizes read from this context's
        ``dims`` (a decomposition function's own, inside one)."""
        return self._lower_graph(graph_module, args, self.dims)
