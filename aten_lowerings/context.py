"""What a lowering rule sees of the node it lowers."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxlib.mlir import ir

from .mlir_types import tensor_type
from .shape_values import SymbolicDims


class LoweringContext:
    """Per-node view for a rule: the node's metadata in and out, and shape values.

    Rules read result shapes and dtypes from here (torch.export already knows
    them) instead of re-deriving them from operands.
    """

    __slots__ = ("node", "dims", "_lower_graph")

    def __init__(self, node: torch.fx.Node, dims: SymbolicDims,
                 lower_graph: Callable[[torch.fx.GraphModule, Sequence], list]):
        self.node = node
        self.dims = dims
        self._lower_graph = lower_graph

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
        """``meta['val']`` of the node's positional argument ``index`` (None for literals)."""
        arg = self.node.args[index]
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None

    # -- shapes ----------------------------------------------------------
    def size_value(self, size) -> ir.Value:
        return self.dims.size(size)

    def shape_value(self, sizes) -> ir.Value:
        return self.dims.shape(list(sizes))

    # -- nested graphs (higher-order ops) ---------------------------------
    def lower_graph(self, graph_module: torch.fx.GraphModule, args: Sequence) -> list:
        return self._lower_graph(graph_module, args)
