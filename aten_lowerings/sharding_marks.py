"""``mark_sharding``: a sharding annotation on an activation, kept by torch.export and lowered to
``sdy.sharding_constraint`` (the spec names axes of the mesh given to ``export_to_stablehlo``; exported
without a mesh, the program runs on one device and the annotation is dropped)."""
from __future__ import annotations

import json

import torch

from torch_stablehlo.stablehlo_ir.shardy import constrain, normalize_spec

from .registry import lower


@torch.library.custom_op("torch_stablehlo::mark_sharding", mutates_args=())
def _mark_sharding(x: torch.Tensor, spec: str) -> torch.Tensor:
    """Eager: the values unchanged (a copy; custom ops may not return their input)."""
    return x.clone()


@_mark_sharding.register_fake
def _(x: torch.Tensor, spec: str) -> torch.Tensor:
    return torch.empty_like(x)


def mark_sharding(tensor: torch.Tensor, spec) -> torch.Tensor:
    """``tensor`` annotated to be laid out as ``spec`` says (one entry per dim: a mesh axis name, a tuple of
    them, or None), as PyTorch/XLA's ``mark_sharding``; use its result. The axes are the export's ``mesh``'s."""
    spec = normalize_spec(spec)
    if len(spec) != tensor.dim():
        raise ValueError(f"mark_sharding: the spec has {len(spec)} entries, the tensor {tensor.dim()} dims "
                         f"({list(tensor.shape)}); give one entry per dim")
    return torch.ops.torch_stablehlo.mark_sharding(tensor, json.dumps(spec))


def spec_of(node: torch.fx.Node):
    """The spec of a ``mark_sharding`` node (None for any other node)."""
    if node.op != "call_function" or node.target is not torch.ops.torch_stablehlo.mark_sharding.default:
        return None
    return normalize_spec(json.loads(node.args[1]))


# Schema: torch_stablehlo::mark_sharding(Tensor x, str spec) -> Tensor
@lower(torch.ops.torch_stablehlo.mark_sharding.default)
def mark_sharding_rule(ctx, x, spec):
    if not ctx.mesh:  # a single-device program
        return x
    return constrain(x, normalize_spec(json.loads(spec)))
