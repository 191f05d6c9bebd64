"""Registry from torch op overloads to lowering rules.

A rule is ``rule(ctx, *args, **kwargs)``: the FX node's arguments with every
tensor replaced by its MLIR value (and SymInts by 0-d i64 tensors). It returns
one ``ir.Value`` or a sequence of them, in the order of the node's outputs.

One verb registers a rule: ``@lower(aten.x.default)`` over its function, or ``lower(aten.x.default)(rule)`` for a
rule that a helper makes (``emit.elementwise.elementwise(formula)``, a family's own rule factories). Helpers make
rules and return them; only ``lower`` puts them in the registry.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

import torch

LOWERINGS: dict[object, Callable] = {}

USER_LOWERINGS: dict[tuple[object, str | None], Callable] = {}
"""A user's rules (``exporter.lowering``), by (op overload, platform or None for every platform): they win over
ours, and a platform's over the one for every platform."""

_SCOPED: ContextVar[tuple[dict, ...]] = ContextVar("scoped_lowerings", default=())
"""User rules registered for one ``with`` block (innermost last); they win over ``USER_LOWERINGS``."""


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


@contextmanager
def scoped_user_lowerings(rules: dict[tuple[object, str | None], Callable]):
    """``rules`` (as ``USER_LOWERINGS``) win over every other rule inside the ``with`` block."""
    token = _SCOPED.set((*_SCOPED.get(), dict(rules)))
    try:
        yield
    finally:
        _SCOPED.reset(token)


def user_lowering_for(target, platform: str | None = None) -> Callable | None:
    """The user's rule for ``target`` on ``platform`` (the scoped ones first, then the global ones; a rule for
    the platform before the one for every platform); with ``platform`` None, a rule for any platform."""
    for rules in (*reversed(_SCOPED.get()), USER_LOWERINGS):
        for key in ((target, platform), (target, None)):
            if key in rules:
                return rules[key]
        if platform is None:
            found = next((rule for (op, _), rule in rules.items() if op == target), None)
            if found is not None:
                return found
    return None


def lowering_for(target, platform: str | None = None) -> Callable | None:
    """The rule that lowers ``target``: the user's (``user_lowering_for``), else ours."""
    rule = user_lowering_for(target, platform) if USER_LOWERINGS or _SCOPED.get() else None
    if rule is not None:
        return rule
    rule = LOWERINGS.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = LOWERINGS.get(target.overloadpacket) or LOWERINGS.get(str(target))
    return rule


def op_name(target) -> str:
    """Readable name of an FX call target, e.g. ``aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))
