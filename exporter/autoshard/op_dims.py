"""Each FX node seen as an einsum: which dims of its operands and of its result are one index (a *label*).

A sharding strategy assigns mesh axes to labels; the operands' and the result's specs follow from it. A label in
the operands but not the result (a contracted or reduced dim) split over an axis leaves partial results on each
device: an all-reduce. A *fixed* label may not be split (a softmax's dim, an attention's sequence, a dim made by a
reshape that only its major dim can carry). Ops without a rule here take and give whole tensors (every label
fixed): the search then keeps them replicated, which is always correct, only perhaps not the fastest.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch

aten = torch.ops.aten


@dataclass
class OpDims:
    """One node as an einsum: ``operands`` (producer node, label per dim), the result's labels, label sizes."""
    operands: list[tuple[torch.fx.Node, tuple[int, ...]]]
    result: tuple[int, ...]
    sizes: dict[int, int] = field(default_factory=dict)   # label -> size (only divisors of it may split it)
    fixed: set[int] = field(default_factory=set)          # labels never split
    flops: float = 0.0                                    # arithmetic of the whole op (0: memory-bound)

    @property
    def contracted(self) -> set[int]:
        """Labels of operands absent from the result: split, they leave partial sums (an all-reduce)."""
        return {label for _, labels in self.operands for label in labels} - set(self.result) - self.fixed


class _Labels:
    """Fresh labels for one op, with their sizes (a symbolic or unknown size: fixed)."""

    def __init__(self):
        self.dims = OpDims([], ())

    def new(self, size, fixed: bool = False) -> int:
        label = len(self.dims.sizes)
        if isinstance(size, int) and not fixed:
            self.dims.sizes[label] = size
        else:
            self.dims.sizes[label] = 1
            self.dims.fixed.add(label)
        return label

    def many(self, shape, fixed: bool = False) -> tuple[int, ...]:
        return tuple(self.new(_static(d), fixed) for d in shape)

    def share(self, label: int, size) -> None:
        """``label`` also names a dim of ``size``: it splits only by divisors of both."""
        size = _static(size)
        if size is None:
            self.dims.fixed.add(label)
        else:
            self.dims.sizes[label] = math.gcd(self.dims.sizes[label], size)

    def fix(self, *labels: int) -> None:
        self.dims.fixed.update(labels)


def _static(size):
    try:
        return int(size)
    except (TypeError, ValueError):  # a symbolic size that has no hint
        return None


def shape_of(node) -> tuple | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def tensor_operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    found = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) if shape_of(n) is not None else None)
    return found


def op_dims(node: torch.fx.Node) -> OpDims:
    """``node`` as an einsum (its result must be a tensor)."""
    rule = _RULES.get(node.target) or _NAMED_RULES.get(str(node.target))
    if rule is None and isinstance(node.target, torch._ops.OpOverload) and torch.Tag.pointwise in node.target.tags:
        rule = _pointwise
    labels = _Labels()
    if rule is None or rule(node, labels) is False:
        labels = _Labels()
        labels.dims.result = labels.many(shape_of(node), fixed=True)
        labels.dims.operands = [(n, labels.many(shape_of(n), fixed=True)) for n in tensor_operands(node)]
    return labels.dims


def _pointwise(node, labels: _Labels):
    """Operands broadcast against the result from the right; a broadcast size-1 dim is its own (fixed) label."""
    shape = shape_of(node)
    result = labels.many(shape)
    labels.dims.result = result
    for operand in tensor_operands(node):
        own = shape_of(operand)
        mapped = []
        for i, size in enumerate(own):
            at = len(shape) - len(own) + i
            if at < 0 or (_static(size) == 1 and _static(shape[at]) != 1):
                mapped.append(labels.new(1, fixed=True))
            else:
                mapped.append(result[at])
        labels.dims.operands.append((operand, tuple(mapped)))


def _linear(node, labels: _Labels):
    x, weight = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    *batch, k = labels.many(shape_of(x))
    n = labels.new(shape_of(weight)[0])
    labels.dims.result = (*batch, n)
    labels.dims.operands = [(x, (*batch, k)), (weight, (n, k))] + ([(bias, (n,))] if bias is not None else [])
    labels.dims.flops = 2.0 * math.prod(_sizes(shape_of(node))) * (_static(shape_of(x)[-1]) or 1)


def _matmul(node, labels: _Labels):
    """mm, bmm and addmm: [..., m, k] x [..., k, n] (equal batch dims)."""
    bias, (a, b) = (node.args[0], node.args[1:3]) if node.target is aten.addmm.default else (None, node.args[:2])
    a_shape, b_shape = shape_of(a), shape_of(b)
    if len(a_shape) != len(b_shape):
        return False
    *batch, m, k = labels.many(a_shape)
    for label, size in zip(batch, b_shape[:-2]):
        labels.share(label, size)
    n = labels.new(b_shape[-1])
    labels.dims.result = (*batch, m, n)
    labels.dims.operands = [(a, (*batch, m, k)), (b, (*batch, k, n))]
    if bias is not None:
        labels.dims.operands.append((bias, (labels.new(1, fixed=True), n)[-len(shape_of(bias)):]))
    labels.dims.flops = 2.0 * math.prod(_sizes(shape_of(node))) * (_static(a_shape[-1]) or 1)


def _attention(node, labels: _Labels):
    """scaled_dot_product_attention: batch and heads split; each head's sequence and features whole."""
    q, k, v = node.args[:3]
    *batch, length, features = labels.many(shape_of(q))
    labels.fix(length, features)
    kv_batch = []
    for label, size in zip(batch, shape_of(k)[:-2]):
        labels.share(label, size)
        kv_batch.append(label)
    source = labels.new(shape_of(k)[-2], fixed=True)
    labels.dims.result = (*batch, length, labels.new(shape_of(v)[-1], fixed=True))
    labels.dims.operands = [(q, (*batch, length, features)), (k, (*kv_batch, source, features)),
                            (v, (*kv_batch, source, labels.dims.result[-1]))]
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if isinstance(mask, torch.fx.Node):
        labels.dims.operands.append((mask, labels.many(shape_of(mask), fixed=True)))
    labels.dims.flops = 4.0 * math.prod(_sizes(shape_of(q))) * (_static(shape_of(k)[-2]) or 1)


def _reduction(node, labels: _Labels):
    """sum/mean/amax over ``dims`` (keepdim or not): the reduced labels are contracted."""
    x = node.args[0]
    shape = shape_of(x)
    dims = node.args[1] if len(node.args) > 1 else None
    dims = range(len(shape)) if dims is None or dims == [] else [d % len(shape) for d in
                                                                 (dims if isinstance(dims, (list, tuple)) else [dims])]
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    own = labels.many(shape)
    labels.dims.operands = [(x, own)]
    labels.dims.result = tuple(labels.new(1, fixed=True) if i in dims else label
                               for i, label in enumerate(own) if keep or i not in dims)


def _along_dim(node, labels: _Labels):
    """softmax, slices, selects, cumsum: every dim shared but the one worked along."""
    x = node.args[0]
    shape, result_shape = shape_of(x), shape_of(node)
    dim = (node.args[1] if len(node.args) > 1 else 0) % max(len(shape), 1)
    own = labels.many(shape)
    labels.fix(own[dim])
    labels.dims.operands = [(x, own)]
    if len(result_shape) == len(shape):
        labels.dims.result = tuple(own[i] if i != dim else labels.new(result_shape[i], fixed=True)
                                   for i in range(len(shape)))
    else:  # select: the dim is gone
        labels.dims.result = own[:dim] + own[dim + 1:]


def _cat(node, labels: _Labels):
    tensors, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    shape = shape_of(node)
    dim %= len(shape)
    result = labels.many(shape)
    labels.fix(result[dim])
    labels.dims.result = result
    for t in tensors:
        if shape_of(t) is None or len(shape_of(t)) != len(shape):
            return False
        labels.dims.operands.append((t, tuple(r if i != dim else labels.new(1, fixed=True)
                                              for i, r in enumerate(result))))


def _permute(node, labels: _Labels):
    x = node.args[0]
    own = labels.many(shape_of(x))
    rank = len(own)
    if node.target is aten.permute.default:
        order = [d % rank for d in node.args[1]]
    else:
        order = list(range(rank))
        if rank >= 2:
            a, b = (node.args[1] % rank, node.args[2] % rank) if node.target is aten.transpose.int else (0, 1)
            order[a], order[b] = order[b], order[a]
    labels.dims.operands = [(x, own)]
    labels.dims.result = tuple(own[d] for d in order)


def _reshape(node, labels: _Labels):
    """view/reshape: dims grouped where the products meet; a group's major dims share a label, the rest fixed."""
    x = node.args[0]
    source, target = [_static(d) for d in shape_of(x)], [_static(d) for d in shape_of(node)]
    if None in source or None in target:
        return False
    own = labels.many(source)
    result = [labels.new(size, fixed=True) for size in target]
    i = j = 0
    while i < len(source) and j < len(target):
        a, b = [i], [j]
        left, right = source[i], target[j]
        while left != right:
            if left < right:
                i += 1
                a.append(i)
                left *= source[i]
            else:
                j += 1
                b.append(j)
                right *= target[j]
        majors_in = [d for d in a if source[d] != 1]
        majors_out = [d for d in b if target[d] != 1]
        if majors_in and majors_out:
            label = own[majors_in[0]]
            labels.share(label, target[majors_out[0]])
            result[majors_out[0]] = label
            labels.fix(*(own[d] for d in majors_in[1:]))
        else:
            labels.fix(*(own[d] for d in a))
        i, j = i + 1, j + 1
    labels.fix(*own[i:])
    labels.dims.operands = [(x, own)]
    labels.dims.result = tuple(result)


def _unsqueeze(node, labels: _Labels):
    x = node.args[0]
    own = labels.many(shape_of(x))
    dim = node.args[1] % (len(own) + 1)
    labels.dims.operands = [(x, own)]
    labels.dims.result = own[:dim] + (labels.new(1, fixed=True),) + own[dim:]


def _expand(node, labels: _Labels):
    x = node.args[0]
    shape = shape_of(node)
    result = labels.many(shape)
    offset = len(shape) - len(shape_of(x))
    labels.dims.result = result
    labels.dims.operands = [(x, tuple(result[offset + i] if _static(s) == _static(shape[offset + i])
                                      else labels.new(1, fixed=True) for i, s in enumerate(shape_of(x))))]


def _embedding(node, labels: _Labels):
    """embedding(weight [V, H], ids [...]) -> [..., H]: V split is a masked lookup summed over devices."""
    weight, ids = node.args[:2]
    vocab, hidden = labels.many(shape_of(weight))
    index = labels.many(shape_of(ids))
    labels.dims.operands = [(weight, (vocab, hidden)), (ids, index)]
    labels.dims.result = (*index, hidden)


def _layer_norm(node, labels: _Labels):
    """layer_norm(x, normalized_shape, weight, bias): the normalized (last) dims whole, the others shared."""
    x, normalized = node.args[0], node.args[1]
    own = labels.many(shape_of(x))
    inner = own[len(own) - len(normalized):]
    labels.fix(*inner)
    labels.dims.result = own
    labels.dims.operands = [(x, own)] + [(w, inner) for w in node.args[2:4] if isinstance(w, torch.fx.Node)]


def _grouped_mm(node, labels: _Labels):
    """Experts' products, ``x [rows, in] x weights [experts, in, out] -> [rows, out]`` with each row's expert
    given by the cumulative group ends ``offs [experts]``: lowered as each expert's product over all rows (the
    rows of other experts masked to zeros) summed over experts, so the experts and the inputs are contracted:
    experts split is expert parallelism (one all-reduce), ``out`` split is Megatron's colwise, ``in`` rowwise."""
    x, weights = node.args[:2]
    offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    rows, inner = labels.many(shape_of(x))
    experts = labels.new(shape_of(weights)[0])
    labels.share(inner, shape_of(weights)[1])
    out = labels.new(shape_of(weights)[2])
    labels.dims.result = (rows, out)
    labels.dims.operands = [(x, (rows, inner)), (weights, (experts, inner, out))]
    if isinstance(offs, torch.fx.Node):
        labels.dims.operands.append((offs, (experts,)))
    labels.dims.flops = 2.0 * math.prod(_sizes(shape_of(x))) * math.prod(_sizes(shape_of(weights))[::2])


def _piece(node, labels: _Labels):
    """getitem of a chunk or split along ``dim``: every dim of the source shared but the one cut."""
    source, index = node.args
    if not (isinstance(source, torch.fx.Node) and source.target in _CUTS and isinstance(index, int)):
        return False
    x = source.args[0]
    shape = shape_of(x)
    dim = (source.args[2] if len(source.args) > 2 else source.kwargs.get("dim", 0)) % len(shape)
    own = labels.many(shape)
    labels.fix(own[dim])
    labels.dims.operands = [(x, own)]
    labels.dims.result = tuple(r if i != dim else labels.new(1, fixed=True) for i, r in enumerate(own))


def _index(node, labels: _Labels):
    """x[..., idx, ...] with one index tensor: the indexed dim's rows gathered (fixed), the other dims shared."""
    x, indices = node.args[:2]
    at = [i for i, index in enumerate(indices) if index is not None]
    if len(at) != 1 or shape_of(indices[at[0]]) is None:
        return False
    own = labels.many(shape_of(x))
    labels.fix(own[at[0]])
    picked = labels.many(shape_of(indices[at[0]]), fixed=True)
    labels.dims.operands = [(x, own), (indices[at[0]], picked)]
    labels.dims.result = own[:at[0]] + picked + own[at[0] + 1:]


def _indexed_along(node, labels: _Labels):
    """index_select(x, dim, index) and index_copy(x, dim, index, source) (a decode step's reads and writes of its
    cache and tokens at a column): the rows along ``dim`` picked or written (fixed), the other dims shared by
    ``x``, ``source`` and the result."""
    x, dim, index = node.args[:3]
    own = labels.many(shape_of(x))
    dim %= len(own)
    labels.fix(own[dim])
    picked = own[:dim] + (labels.new(shape_of(index)[0], fixed=True),) + own[dim + 1:]
    labels.dims.operands = [(x, own), (index, labels.many(shape_of(index), fixed=True))]
    if node.target is aten.index_copy.default:
        labels.dims.operands.append((node.args[3], picked))
        labels.dims.result = own
    else:
        labels.dims.result = picked


def _arg_extreme(node, labels: _Labels):
    """argmax/argmin along a dim: as a select of it (the dim whole); over every element: no rule."""
    if len(node.args) < 2 or node.args[1] is None:
        return False
    return _along_dim(node, labels)


def _sizes(shape) -> list[int]:
    return [_static(d) or 1 for d in shape]


_RULES: dict[object, Callable] = {
    aten.linear.default: _linear, aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.addmm.default: _matmul,
    aten.scaled_dot_product_attention.default: _attention,
    aten.mean.dim: _reduction, aten.sum.dim_IntList: _reduction, aten.amax.default: _reduction,
    aten.amin.default: _reduction, aten.sum.default: _reduction, aten.mean.default: _reduction,
    aten._softmax.default: _along_dim, aten.softmax.int: _along_dim, aten._log_softmax.default: _along_dim,
    aten.slice.Tensor: _along_dim, aten.select.int: _along_dim, aten.cumsum.default: _along_dim,
    aten.narrow.default: _along_dim,
    aten.cat.default: _cat,
    aten.transpose.int: _permute, aten.permute.default: _permute, aten.t.default: _permute,
    aten.view.default: _reshape, aten.reshape.default: _reshape, aten._unsafe_view.default: _reshape,
    aten.unsqueeze.default: _unsqueeze, aten.expand.default: _expand, aten.embedding.default: _embedding,
    aten.clone.default: _pointwise, aten._to_copy.default: _pointwise, aten.alias.default: _pointwise,
    aten.contiguous.default: _pointwise, aten.detach.default: _pointwise,
    torch.ops.torch_stablehlo.mark_sharding.default: _pointwise,
    aten.to.dtype: _pointwise, aten.to.dtype_layout: _pointwise, aten.to.device: _pointwise,
    aten.dropout.default: _pointwise, aten.layer_norm.default: _layer_norm,
    aten._grouped_mm.default: _grouped_mm, operator.getitem: _piece, aten.index.Tensor: _index,
    aten.index_select.default: _indexed_along, aten.index_copy.default: _indexed_along,
    aten.argmax.default: _arg_extreme, aten.argmin.default: _arg_extreme,
}
_NAMED_RULES: dict[str, Callable] = {"transformers.grouped_mm_fallback.default": _grouped_mm}  # another library's op
_CUTS = {aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default}
CONTRACTIONS = {aten.linear.default, aten.mm.default, aten.bmm.default, aten.addmm.default,
                aten.scaled_dot_product_attention.default, aten.embedding.default, aten._grouped_mm.default}


def is_contraction(node: torch.fx.Node) -> bool:
    """A product (whose result layout a plan constrains)."""
    return node.target in CONTRACTIONS or str(node.target) in _NAMED_RULES
