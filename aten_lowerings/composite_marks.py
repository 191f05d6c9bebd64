"""A user's composite (``exporter.composite``): marker ops around a region, outlined into one call, lowered as a
``stablehlo.composite`` whose decomposition is the region converted by our walk.

torch.export inlines every Python call (non-strict export inlines even ``nested_compile_region``), so the
boundary is kept by marker ops, as PyTorch/XLA's ``StableHLOCompositeBuilder`` does: ``composite_mark`` is an
identity ``torch.library`` op with a fake, on each tensor input and output of one call, carrying the composite's
name, the call's number, the tensor's position, the attributes (JSON) and the version. torch.export keeps custom
ops as they are, through ``run_decompositions`` too. The exporter outlines each marked region into a
``COMPOSITE_CALL`` node over a nested graph (``exporter.conversion.composite_regions``); where a mark is left (nothing
outlined it), it lowers as the identity.
"""
from __future__ import annotations

import json

import torch
from jaxlib.mlir import ir

from .emit.composite import composite
from .mlir_types import tensor_type
from .registry import lower


@torch.library.custom_op("torch_stablehlo::composite_mark", mutates_args=())
def composite_mark(x: torch.Tensor, name: str, call: int, position: int, attributes: str, version: int,
                   output: bool) -> torch.Tensor:
    """``x`` (a copy: a custom op may not return its input), marked as input or output ``position`` of call
    ``call`` of the composite ``name``."""
    return x.clone()


@composite_mark.register_fake
def _(x, name, call, position, attributes, version, output):
    return torch.empty_like(x)


MARK = torch.ops.torch_stablehlo.composite_mark.default


def stablehlo_composite(body: torch.fx.GraphModule, name: str, attributes: str, version: int, *operands):
    """The target of an outlined composite's node: ``body`` (a graph module returning a tuple) run in torch on
    the operands (``find_divergence`` runs nodes so)."""
    return tuple(body(*operands))


COMPOSITE_CALL = stablehlo_composite


@lower(MARK)
def mark(ctx, x, name, call, position, attributes, version, output):
    return x


@lower(COMPOSITE_CALL)
def composite_call(ctx, body, name, attributes, version, *operands):
    metas = [ctx.arg_meta(4 + i) for i in range(len(operands))]
    result_types = [tensor_type(m.shape, m.dtype) for m in ctx.out_meta]
    results = composite(ctx, name, list(operands), metas, mlir_attributes(json.loads(attributes)), result_types,
                        lambda body_ctx, *arguments: body_ctx.lower_graph(body, arguments), version)
    return [results] if isinstance(results, ir.Value) else list(results)


def mlir_attributes(attributes: dict) -> dict[str, ir.Attribute]:
    """A composite's attributes (str, bool, int, float and lists of them) as MLIR attributes."""
    return {key: _attribute(value) for key, value in attributes.items()}


def _attribute(value) -> ir.Attribute:
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return ir.FloatAttr.get(ir.F32Type.get(), value)
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    return ir.ArrayAttr.get([_attribute(item) for item in value])
