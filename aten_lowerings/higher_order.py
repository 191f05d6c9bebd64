"""Higher-order ops: nested graphs (wrap_with_set_grad_enabled, wrap_with_autocast, hints_wrapper) lowered inline.

Grad mode means nothing to an inference program. Under an enabled autocast the
nested graph's nodes already carry the dtypes autocast chose, and every rule
produces its node's dtype, so inlining the graph reproduces autocast's casts.
"""
from __future__ import annotations

import operator

import torch

from .registry import lower

higher_order = torch.ops.higher_order


@lower(higher_order.wrap_with_set_grad_enabled)
def wrap_with_set_grad_enabled(ctx, enabled, graph_module, *operands):
    return tuple(ctx.lower_graph(graph_module, operands))


@lower(higher_order.wrap_with_autocast)
def wrap_with_autocast(ctx, device_type, dtype, enabled, cache_enabled, graph_module, *operands):
    return tuple(ctx.lower_graph(graph_module, operands))


@lower(higher_order.hints_wrapper)
def hints_wrapper(ctx, graph_module, args, kwargs, *, hints=None):
    """Hints for a compiler about the body (``hints``) mean nothing here: the body, inline. It returns one tensor
    or a tuple (taken apart by getitem)."""
    outputs = ctx.lower_graph(graph_module, [*args, *kwargs.values()])
    if any(user.target is operator.getitem for user in ctx.node.users):
        return tuple(outputs)
    return outputs[0]
