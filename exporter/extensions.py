"""Your own ops: a JAX function as the lowering of a ``torch.library`` op (or of an aten op, overriding ours).

``lowering(op)`` registers it for every export (``platform="cuda"`` or ``"cpu"``: a variant for one platform,
which wins there over the one for every platform); ``scoped_lowering(op, function)`` for the exports inside a
``with`` block, winning over the global ones. The function is lowered into the module at export time
(``aten_lowerings.user_ops``): artifacts, bundles, SavedModels and ``to_jax()`` never need it again.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from torch_stablehlo.aten_lowerings import (USER_LOWERINGS, MutatingOpError, jax_rule, refuse_mutating,
                                            scoped_user_lowerings)

from .errors import LoweringError

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
"""The platforms a lowering may be registered for: JAX's names, which ``export_to_stablehlo(platform=...)`` takes."""


def lowering(op, *, platform: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: the decorated JAX function lowers ``op`` (a ``torch.library`` op's overload, with a fake, or an
    aten op's) in every export, on ``platform`` only if given. Returns the function unchanged."""
    _checked(op, platform)

    def register(function: Callable) -> Callable:
        USER_LOWERINGS[(op, platform)] = jax_rule(op, _callable(function), platform)
        return function

    return register


@contextmanager
def scoped_lowering(op, function: Callable, *, platform: str | None = None):
    """``function`` lowers ``op`` in the exports run inside the ``with`` block, winning over ``lowering``'s."""
    _checked(op, platform)
    with scoped_user_lowerings({(op, platform): jax_rule(op, _callable(function), platform)}):
        yield


def _checked(op, platform: str | None) -> None:
    """Raise before registering anything for an op that is not one overload, a platform JAX does not name, or
    an op that writes its arguments."""
    if not isinstance(op, torch._ops.OpOverload):
        hint = " (an overload packet: name one overload, e.g. .default)" if isinstance(
            op, torch._ops.OpOverloadPacket) else ""
        raise TypeError(f"lowering takes a torch op overload such as torch.ops.mylib.my_op.default, got {op!r}{hint}")
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: a lowering is registered for one of {PLATFORMS} or None (all)")
    try:
        refuse_mutating(op)
    except MutatingOpError as error:
        raise LoweringError(str(error)) from None


def _callable(function) -> Callable:
    if not callable(function):
        raise TypeError(f"a lowering is a JAX function, got {type(function).__name__}")
    return function
