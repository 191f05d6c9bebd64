"""A user's op lowered by a JAX function (``exporter.lowering``): the rule that calls it through ``call_jax``.

The function takes the node's arguments as torch.export recorded them: JAX arrays for tensors (lists of them for
``Tensor[]``, None for a missing optional), JAX dimensions for symbolic sizes, Python values for the rest. It
returns an array or a pytree of them, whose leaves are the op's results in order; each leaf's shape and dtype
must be the op's fake's (``ResultMismatch`` otherwise). The function is lowered into the module (one private
function per distinct signature), so the program never needs it again.
"""
from __future__ import annotations

import re
from typing import Callable

import jax
import torch
import torch.utils._pytree as pytree
from jaxlib.mlir import ir

from .emit.jax_functions import call_jax
from .mlir_types import tensor_type
from .registry import op_name
from .values import value_type


USER_FUNCTIONS = re.compile(r"jax_user_(\w+)_[0-9a-f]{10}")
"""The name of the private function a user's JAX lowering becomes (its op's name, dots as underscores); what
``torch-stablehlo inspect`` lists."""


class ResultMismatch(ValueError):
    """A user's JAX function returned results whose shapes or dtypes are not those of the op's fake."""


class MutatingOpError(ValueError):
    """An op that writes its arguments cannot be lowered by a JAX function, which returns new values."""


class _Tensor:
    """Where a tensor argument sits among the static ones (a leaf of the arguments' layout)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Tensor()


def refuse_mutating(target) -> None:
    """Raise ``MutatingOpError`` if ``target``'s schema writes one of its arguments."""
    schema = getattr(target, "_schema", None)
    written = [a.name for a in getattr(schema, "arguments", ()) if a.alias_info is not None and a.alias_info.is_write]
    if written:
        raise MutatingOpError(
            f"{op_name(target)} writes its argument(s) {', '.join(written)} in place (mutates_args); a JAX lowering "
            "returns new values and cannot write its inputs: define the op functionally (mutates_args=()), "
            "returning the new value, and write it back in the model (x.copy_(op(x)))")


def jax_rule(target, function: Callable, platform: str | None = None) -> Callable:
    """The lowering rule of ``target`` that calls ``function`` (lowered for ``platform``, JAX's platform name;
    None: JAX's default backend)."""
    name = "user_" + op_name(target).replace(".", "_")  # call_jax names the function jax_<name>_<hash>

    def rule(ctx, *args, **kwargs):
        metas = torch.fx.node.map_arg((ctx.node.args, ctx.node.kwargs), lambda node: node.meta["val"])
        values = pytree.tree_leaves((args, kwargs))
        leaves, layout = pytree.tree_flatten(metas)
        operands, sizes, static = [], [], []
        for leaf, value in zip(leaves, values):
            if isinstance(leaf, torch.Tensor):
                operands.append(value)
                sizes.append(leaf.shape)
            static.append(TENSOR if isinstance(leaf, torch.Tensor) else leaf)
        results = call_jax(ctx, _called, operands, sizes, name=name, platform=platform,
                           user=function, layout=layout, static=tuple(static))
        expected = _expected_types(ctx.out_meta)
        _check_results(target, results, expected)
        return results[0] if isinstance(ctx.out_meta, torch.Tensor) else results

    return rule


def _called(*tensors, user: Callable, layout, static: tuple):
    """``user`` on the arguments rebuilt from their layout, its results flattened (``call_jax`` returns leaves)."""
    tensors = iter(tensors)
    leaves = [next(tensors) if leaf is TENSOR else leaf for leaf in static]
    args, kwargs = pytree.tree_unflatten(leaves, layout)
    return jax.tree_util.tree_leaves(user(*args, **kwargs))


def _expected_types(out_meta) -> list[ir.RankedTensorType]:
    metas = [out_meta] if isinstance(out_meta, torch.Tensor) else list(out_meta)
    return [tensor_type(m.shape, m.dtype) for m in metas]


def _check_results(target, results: list[ir.Value], expected: list[ir.RankedTensorType]) -> None:
    got = [value_type(r) for r in results]
    same = len(got) == len(expected) and all(
        g.element_type == e.element_type and g.rank == e.rank and all(
            ir.ShapedType.is_dynamic_size(a) or ir.ShapedType.is_dynamic_size(b) or a == b
            for a, b in zip(g.shape, e.shape)) for g, e in zip(got, expected))
    if not same:
        raise ResultMismatch(
            f"the JAX lowering of {op_name(target)} returned {', '.join(map(str, got)) or 'nothing'}, but the op's "
            f"fake says {', '.join(map(str, expected))}: fix the function or the fake so they agree")
