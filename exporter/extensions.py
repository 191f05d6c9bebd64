"""Your own ops: a JAX function as the lowering of a ``torch.library`` op (or of an aten op, overriding ours), and
composites: a module or function whose calls become ``stablehlo.composite`` ops.

``lowering(op)`` registers it for every export (``platform="cuda"`` or ``"cpu"``: a variant for one platform,
which wins there over the one for every platform; a module lowered for several platforms calls each platform's
in its branch of a ``stablehlo.case``); ``scoped_lowering(op, function)`` for the exports inside a
``with`` block, winning over the global ones. The function is lowered into the module at export time
(``aten_lowerings.user_ops``): artifacts, bundles, SavedModels and ``to_jax()`` never need it again.

``composite(module_or_function, name=..., attributes=...)`` marks each call's tensor inputs and outputs with
marker ops that torch.export keeps (``aten_lowerings.composite_marks`` says why markers); the exporter outlines the
region between them into a ``stablehlo.composite`` whose decomposition is the region converted as usual.
"""
from __future__ import annotations

import functools
import itertools
import json
import re
from contextlib import contextmanager
from typing import Callable

import torch

from torch_stablehlo.aten_lowerings import COMPOSITE_MARK, USER_LOWERINGS, jax_rule, scoped_user_lowerings

from torch_stablehlo.stablehlo_ir.platforms import PLATFORMS  # a lowering is registered for one of them, or all


def lowering(op, *, platform: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: the decorated JAX function lowers ``op`` (a ``torch.library`` op's overload, with a fake, or an
    aten op's) in every export, on ``platform`` only if given. An op that writes its arguments (``mutates_args``):
    the function returns the op's results, then the new value of each argument it writes, in the schema's order.
    Returns the function unchanged."""
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
    """Raise before registering anything for an op that is not one overload or a platform JAX does not name."""
    if not isinstance(op, torch._ops.OpOverload):
        hint = " (an overload packet: name one overload, e.g. .default)" if isinstance(
            op, torch._ops.OpOverloadPacket) else ""
        raise TypeError(f"lowering takes a torch op overload such as torch.ops.mylib.my_op.default, got {op!r}{hint}")
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: a lowering is registered for one of {PLATFORMS} or None (all)")


def _callable(function) -> Callable:
    if not callable(function):
        raise TypeError(f"a lowering is a JAX function, got {type(function).__name__}")
    return function


_COMPOSITE_NAME = "_torch_stablehlo_composite"
"""The attribute naming the composite a module was made (its hooks mark each call once)."""

_CALLS = itertools.count()
"""Numbers the composites' calls: the marks of one call share its number."""


def composite(module_or_function, *, name: str, attributes: dict | None = None, version: int = 0):
    """Each call of ``module_or_function`` lowers as ``stablehlo.composite "name"`` with ``attributes`` (str, int,
    float, bool, or lists of them) and ``version``, its decomposition the call's ops. A module gets hooks and is
    returned itself (its weights keep their names); a function is returned wrapped."""
    text = _attributes_json(name, attributes or {}, version)
    if isinstance(module_or_function, torch.nn.Module):
        if hasattr(module_or_function, _COMPOSITE_NAME):
            raise ValueError(f"this module is the composite '{getattr(module_or_function, _COMPOSITE_NAME)}' "
                             f"already; wrap it in a module of its own to make it part of '{name}' too")
        setattr(module_or_function, _COMPOSITE_NAME, name)
        calls = []

        def mark_inputs(module, args, kwargs):
            calls.append(next(_CALLS))
            return _marked((args, kwargs), name, calls[-1], text, version, output=False)

        def mark_outputs(module, args, kwargs, result):
            return _marked(result, name, calls.pop(), text, version, output=True)

        module_or_function.register_forward_pre_hook(mark_inputs, with_kwargs=True)
        module_or_function.register_forward_hook(mark_outputs, with_kwargs=True)
        return module_or_function
    if not callable(module_or_function):
        raise TypeError(f"composite takes an nn.Module or a function, got {type(module_or_function).__name__}")

    @functools.wraps(module_or_function)
    def marked_call(*args, **kwargs):
        call = next(_CALLS)
        args, kwargs = _marked((args, kwargs), name, call, text, version, output=False)
        return _marked(module_or_function(*args, **kwargs), name, call, text, version, output=True)

    return marked_call


def _attributes_json(name: str, attributes: dict, version: int) -> str:
    """The attributes as the marks carry them, after checking the name, their types and the version."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"a composite's name is a dotted identifier such as 'mylib.mlp', got {name!r}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"a composite's version is an int >= 0, got {version!r}")
    for key, value in attributes.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if not isinstance(key, str) or not all(isinstance(v, (str, int, float, bool)) for v in items):
            raise TypeError(f"composite attribute {key!r}={value!r}: attributes are str, int, float, bool or lists "
                            "of them, keyed by str")
    return json.dumps(attributes)


def _marked(tree, name: str, call: int, attributes: str, version: int, output: bool):
    """``tree`` (a pytree) with each tensor marked as input or output ``position`` of call ``call``."""
    leaves, spec = torch.utils._pytree.tree_flatten(tree)
    leaves = [COMPOSITE_MARK(leaf, name, call, position, attributes, version, output)
              if isinstance(leaf, torch.Tensor) else leaf for position, leaf in enumerate(leaves)]
    return torch.utils._pytree.tree_unflatten(leaves, spec)
