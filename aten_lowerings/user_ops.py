"""A user's op lowered by a JAX function (``exporter.lowering``): the rule that calls it through ``call_jax``.

The function takes the node's arguments as torch.export recorded them: JAX arrays for tensors (lists of them for
``Tensor[]``, None for a missing optional), JAX dimensions for symbolic sizes, Python values for the rest. It
returns an array or a pytree of them, whose leaves are the op's results in order, then (an op that writes its
arguments, ``mutates_args``) the new value of each argument it writes; each leaf's shape and dtype must be the
op's fake's (``ResultMismatch`` otherwise). The function is lowered into the module (one private
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
from .registry import lower, op_name, user_lowering_for
from .values import value_type


USER_FUNCTIONS = re.compile(r"jax_user_(\w+)_[0-9a-f]{10}")
"""The name of the private function a user's JAX lowering becomes (its op's name, dots as underscores); what
``torch-stablehlo inspect`` lists."""


class ResultMismatch(ValueError):
    """A user's JAX function returned results whose shapes or dtypes are not those of the op's fake."""


class _Tensor:
    """Where a tensor argument sits among the static ones (a leaf of the arguments' layout)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Tensor()

higher_order = torch.ops.higher_order
FUNCTIONALISED = (higher_order.auto_functionalized, higher_order.auto_functionalized_v2)
"""How torch.export records a call of an op that writes its arguments: the op, wrapped (functionalised)."""


def lowered_target(node: torch.fx.Node):
    """The op whose lowering lowers ``node``: the wrapped op of a functionalised call, else the node's target."""
    return node.args[0] if node.target in FUNCTIONALISED else node.target


def written_arguments(target) -> list:
    """The schema arguments ``target`` writes in place (``mutates_args``)."""
    schema = getattr(target, "_schema", None)
    return [a for a in getattr(schema, "arguments", ()) if a.alias_info is not None and a.alias_info.is_write]


class UserRule:
    """The lowering rule of ``target`` that calls a user's JAX ``function`` (lowered for ``platform``, JAX's
    platform name; None: JAX's default backend). An op that writes its arguments is lowered where torch.export
    functionalised its call (``functionalised_call``): its function returns the op's results, then the new value
    of each argument it writes, in the schema's order."""

    def __init__(self, target, function: Callable, platform: str | None = None):
        self.target, self.function, self.platform = target, function, platform
        self.name = "user_" + op_name(target).replace(".", "_")  # call_jax names the function jax_<name>_<hash>

    def __call__(self, ctx, *args, **kwargs):
        if written_arguments(self.target):
            raise NotImplementedError(f"{op_name(self.target)} writes its arguments: it is lowered where its call "
                                      "is functionalised (auto_functionalized), not here")
        metas = torch.fx.node.map_arg((ctx.node.args, ctx.node.kwargs), lambda node: node.meta["val"])
        results = self.call(ctx, metas, (args, kwargs), _metas(ctx.out_meta))
        return results[0] if isinstance(ctx.out_meta, torch.Tensor) else results

    def call(self, ctx, metas, values, expected: list) -> list[ir.Value]:
        """The function on ``values`` (``(args, kwargs)``, their torch metadata ``metas``); its results, checked
        against the ``expected`` metas."""
        leaves, layout = pytree.tree_flatten(metas)
        operands, sizes, static = [], [], []
        for leaf, value in zip(leaves, pytree.tree_leaves(values)):
            if isinstance(leaf, torch.Tensor):
                operands.append(value)
                sizes.append(leaf.shape)
            static.append(TENSOR if isinstance(leaf, torch.Tensor) else leaf)
        results = call_jax(ctx, _called, operands, sizes, name=self.name, platform=self.platform,
                           user=self.function, layout=layout, static=tuple(static))
        _check_results(self.target, results, [tensor_type(m.shape, m.dtype) for m in expected])
        return results


def jax_rule(target, function: Callable, platform: str | None = None) -> UserRule:
    """The lowering rule of ``target`` that calls ``function`` (see ``UserRule``)."""
    return UserRule(target, function, platform)


@lower(*FUNCTIONALISED)
def functionalised_call(ctx, op, **kwargs):
    """A call of an op that writes its arguments, as torch.export functionalised it: the user's lowering of ``op``
    on its arguments (v2: each written one a whole tensor of ``_all_bases``), its results, then the new value of
    each written argument (v2: of each base)."""
    rule = user_lowering_for(op, ctx.platforms[0] if len(ctx.platforms) == 1 else None)
    if not isinstance(rule, UserRule):
        raise NotImplementedError(f"{op_name(op)} writes its arguments and has no user lowering "
                                  "(torch_stablehlo.exporter.lowering)")
    metas = torch.fx.node.map_arg(dict(ctx.node.kwargs), lambda node: node.meta["val"])
    v2 = ctx.node.target is higher_order.auto_functionalized_v2
    bases, base_metas = (kwargs["_all_bases"], metas["_all_bases"]) if v2 else (None, None)
    args, arg_metas, kwonly, kwonly_metas, written = [], [], {}, {}, []
    for argument in op._schema.arguments:
        value, meta = _functionalised_argument(op, argument, kwargs, metas, bases, base_metas, v2)
        if argument.kwarg_only:
            kwonly[argument.name], kwonly_metas[argument.name] = value, meta
        else:
            args.append(value)
            arg_metas.append(meta)
        if argument in written_arguments(op):
            written.append((argument.name, meta))
    outputs = list(ctx.out_meta)
    leading = outputs[:len(outputs) - (len(bases) if v2 else len(written))]  # the op's results (None: none)
    returned = [meta for meta in leading if isinstance(meta, torch.Tensor)]
    results = iter(rule.call(ctx, (arg_metas, kwonly_metas), (args, kwonly),
                             returned + [meta for _, meta in written]))
    leading = [next(results) if isinstance(meta, torch.Tensor) else None for meta in leading]
    new_values = {name: next(results) for name, _ in written}
    if not v2:
        return (*leading, *new_values.values())
    new_bases = list(bases)
    for name, _ in written:
        index = kwargs[f"_{name}_base_index"]
        if index is not None:
            new_bases[index] = new_values[name]
    return (*leading, *new_bases)


def _functionalised_argument(op, argument, kwargs, metas, bases, base_metas, v2: bool):
    """One schema argument of a functionalised call and its metadata (a written one of v2 from its base)."""
    if not (v2 and argument in written_arguments(op)):
        if argument.name in kwargs:
            return kwargs[argument.name], metas[argument.name]
        default = argument.default_value if argument.has_default_value() else None
        return default, default
    index = kwargs.get(f"_{argument.name}_base_index")
    if index is None:
        return None, None
    if isinstance(index, list) or any(f"_{argument.name}_{part}" in kwargs
                                      for part in ("size", "stride", "storage_offset", "slice_dim")):
        raise NotImplementedError(f"{op_name(op)} writes {argument.name}, a view of a larger tensor or a list; a "
                                  "user lowering takes written arguments that are whole tensors")
    return bases[index], base_metas[index]


def _called(*tensors, user: Callable, layout, static: tuple):
    """``user`` on the arguments rebuilt from their layout, its results flattened (``call_jax`` returns leaves)."""
    tensors = iter(tensors)
    leaves = [next(tensors) if leaf is TENSOR else leaf for leaf in static]
    args, kwargs = pytree.tree_unflatten(leaves, layout)
    return jax.tree_util.tree_leaves(user(*args, **kwargs))


def _metas(out_meta) -> list:
    return [out_meta] if isinstance(out_meta, torch.Tensor) else list(out_meta)


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
