"""``F.linear_cross_entropy`` with chunking options: torch's ``torch_nn::_linear_cross_entropy_batch_chunked``
custom ops, lowered as what they compute, ``cross_entropy(linear(input, weight, bias), target)``, without the
chunks (XLA picks its own tiling).

The scalar op (reduction mean or sum) also returns the loss's gradients with respect to input, linear weight and
bias, each computed only where its ``compute_*_grad`` flag is set (else an empty tensor): with ``g`` the
gradient of the loss with respect to the logits (``w_i (softmax - one_hot)``, divided by the total weight for
the mean), they are ``g @ W``, ``g^T @ input`` and ``sum_i g``. Everything is computed in the op's ``acc_dtype``.
"""
from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo

from ..constants import full_like
from ..emit.contraction import contract
from ..emit.elementwise import compare
from ..emit.index_plans import along_dim_plan, gather_plan
from ..emit.reduce import reduce
from ..mlir_types import mlir_shape
from ..promotion import convert
from ..registry import lower
from ..shapes import broadcast_in_dim, iota, reshape

try:  # registers the custom ops (torch 2.13 and later)
    import torch.nn.modules.linear_cross_entropy  # noqa: F401
    _CHUNKED = torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default
    _CHUNKED_NONE = torch.ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default
except (ImportError, AttributeError):
    _CHUNKED = _CHUNKED_NONE = None


class _Problem:
    """Logits ``input @ W^T + b`` (N, C) and the per-sample weights ``weight[t] * (t != ignore_index)``."""

    def __init__(self, ctx, x, linear_weight, target, linear_bias, weight, ignore_index, acc_dtype):
        self.ctx, self.x, self.linear_weight = ctx, x, linear_weight
        self.dtype = acc_dtype or torch.float32
        self.batch, self.classes = ctx.arg_meta(0).shape[0], ctx.arg_meta(1).shape[0]
        self.sizes = [self.batch, self.classes]
        logits = contract(x, linear_weight, [], [], [1], [1], mlir_shape(self.sizes), self.dtype)
        if linear_bias is not None:
            bias = broadcast_in_dim(ctx, convert(linear_bias, self.dtype), self.sizes, [1])
            logits = stablehlo.add(logits, bias)
        self.logits = convert(logits, self.dtype)
        self.target = convert(target, torch.int64)
        counted = compare(self.target, full_like(ctx, [self.batch], ignore_index, torch.int64), "NE")
        self.safe_target = stablehlo.select(counted, self.target, full_like(ctx, [self.batch], 0, torch.int64))
        sample_weight = full_like(ctx, [self.batch], 1, self.dtype)
        if weight is not None:
            sample_weight = self._at_target(broadcast_in_dim(ctx, convert(weight, self.dtype), self.sizes, [1]))
        self.weight = stablehlo.select(counted, sample_weight, full_like(ctx, [self.batch], 0, self.dtype))

    def _at_target(self, table):
        """``table[i, target[i]]`` for a (N, C) table."""
        index = reshape(self.ctx, self.safe_target, [self.batch, 1])
        picked = gather_plan(self.ctx, table, self.sizes, along_dim_plan(self.ctx, 1, index, [self.batch, 1]))
        return reshape(self.ctx, picked, [self.batch])

    def losses(self):
        """Per-sample ``w_i (logsumexp(z_i) - z_i[t_i])`` and the row log-sum-exps."""
        peak = reduce(self.ctx, self.logits, [1], float("-inf"), stablehlo.maximum)
        finite = compare(stablehlo.abs(peak), full_like(self.ctx, [self.batch], float("inf"), self.dtype), "LT")
        peak = stablehlo.select(finite, peak, full_like(self.ctx, [self.batch], 0, self.dtype))  # as logsumexp
        shifted = stablehlo.subtract(self.logits, broadcast_in_dim(self.ctx, peak, self.sizes, [0]))
        sums = reduce(self.ctx, stablehlo.exponential(shifted), [1], 0, stablehlo.add)
        total = stablehlo.add(stablehlo.log(sums), peak)
        return stablehlo.multiply(self.weight, stablehlo.subtract(total, self._at_target(self.logits))), total

    def logit_gradient(self, total, divisor):
        """``w_i (softmax(z_i) - one_hot(t_i)) / divisor``."""
        softmax = stablehlo.exponential(stablehlo.subtract(
            self.logits, broadcast_in_dim(self.ctx, total, self.sizes, [0])))
        hot = compare(iota(self.ctx, self.sizes, 1), broadcast_in_dim(self.ctx, self.safe_target, self.sizes, [0]),
                      "EQ")
        difference = stablehlo.subtract(softmax, convert(hot, self.dtype))
        scale = stablehlo.divide(self.weight, divisor)
        return stablehlo.multiply(difference, broadcast_in_dim(self.ctx, scale, self.sizes, [0]))


def linear_cross_entropy_none(ctx, x, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size,
                              acc_policy, acc_dtype):
    problem = _Problem(ctx, x, linear_weight, target, linear_bias, weight, ignore_index, acc_dtype)
    return convert(problem.losses()[0], ctx.out_dtype)


def linear_cross_entropy(ctx, x, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                         label_smoothing, batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph,
                         compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad):
    """(loss, grad input, grad linear weight, grad bias) for reduction mean or sum."""
    if label_smoothing:
        raise NotImplementedError("chunked linear_cross_entropy with label smoothing")
    problem = _Problem(ctx, x, linear_weight, target, linear_bias, weight, ignore_index, acc_dtype)
    losses, total = problem.losses()
    loss = reduce(ctx, losses, [0], 0, stablehlo.add)
    divisor = full_like(ctx, [problem.batch], 1, problem.dtype)
    if reduction == "mean":
        weight_sum = reduce(ctx, problem.weight, [0], 0, stablehlo.add)
        loss = stablehlo.divide(loss, weight_sum)
        divisor = broadcast_in_dim(ctx, weight_sum, [problem.batch], [])
    metas = ctx.out_meta
    outputs = [convert(loss, metas[0].dtype)]
    flags = (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad)
    gradient = problem.logit_gradient(total, divisor) if any(flags) else None
    for flag, meta, compute in zip(flags, metas[1:], (_input_gradient, _weight_gradient, _bias_gradient)):
        value = compute(ctx, problem, gradient, meta.shape) if flag else full_like(ctx, meta.shape, 0, meta.dtype)
        outputs.append(convert(value, meta.dtype))
    return outputs


def _input_gradient(ctx, problem, gradient, sizes):
    return contract(gradient, problem.linear_weight, [], [], [1], [0], mlir_shape(sizes), problem.dtype)


def _weight_gradient(ctx, problem, gradient, sizes):
    return contract(gradient, problem.x, [], [], [0], [0], mlir_shape(sizes), problem.dtype)


def _bias_gradient(ctx, problem, gradient, sizes):
    return reduce(ctx, gradient, [0], 0, stablehlo.add)


if _CHUNKED is not None:
    lower(_CHUNKED)(linear_cross_entropy)
    lower(_CHUNKED_NONE)(linear_cross_entropy_none)
