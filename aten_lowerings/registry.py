"""Registry from torch op overloads to lowering rules.

A rule is ``rule(ctx, *args, **kwargs)``: the FX node's arguments with every
tensor replaced by its MLIR value (and SymInts by 0-d i64 tensors). It returns
one ``ir.Value`` or a sequence of them, in the order of the node's outputs.
"""
from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict[object, Callable] = {}


def lower(*targets):
    """Register the decorated rule for each op overload (or a whole overload packet), or for an op named as
    ``op_name`` spells it, for ops of optional libraries (``"torchao.quantize_affine.default"``) that exist only
    once the library is imported."""

    def register(rule):
        for target in targets:
            if target in LOWERINGS:
                raise ValueError(f"two lowerings registered for {target}")
            LOWERINGS[target] = rule
        return rule

    return register


def lowering_for(target) -> Callable | None:
    rule = LOWERINGS.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = LOWERINGS.get(target.overloadpacket) or LOWERINGS.get(str(target))
    return rule


def op_name(target) -> str:
    """Readable name of an FX call target, e.g. ``aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))
