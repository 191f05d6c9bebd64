"""Our own set of torch.export programs of the kinds torch.export's public documentation shows (dynamic and
derived dims, control flow, data-dependent sizes, mutations, pytrees, int inputs), each with the inputs it is
compared on (``runner.Case``). Written for this suite; none is copied from PyTorch."""
import torch
import torch.nn.functional as F
from torch.export import Dim

from ..support import make
from .runner import Case


class LinearRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x, y):
        return F.relu(self.linear(x)) + self.conv(y).mean()


class Derived(torch.nn.Module):
    """Inputs whose sizes are related: one is twice the other, one is one longer."""

    def forward(self, x, y, z):
        return x[::2] + y, z[1:] * 2


class Branch(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() - 1, (x,))


class MapRows(torch.nn.Module):
    def forward(self, xs, y):
        return torch._higher_order_ops.map(lambda row, other: row * other + 1, xs, y)


class Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0), (x > 0).sum()


class ItemSized(torch.nn.Module):
    def forward(self, lengths, x):
        n = lengths.max().item()
        torch._check(n >= 0)
        torch._check(n <= 8)
        return torch.ones(n, 3) * x.sum()


class IntInput(torch.nn.Module):
    def forward(self, x, steps):
        return x * steps + x.shape[0]


class InputMutation(torch.nn.Module):
    def forward(self, x, y):
        x.add_(y)
        y[0] = 7.0
        return x * 2


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.count += 1
        self.total.add_(x.sum(0))
        return self.total / self.count


class TrainingBatchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(x)


class Pytrees(torch.nn.Module):
    def forward(self, inputs, *, scale=2.0):
        a, (b, c) = inputs["a"], inputs["pair"]
        return {"sum": a + b * scale, "list": [c.t(), a.shape[0]], "none": None}


class ComputedView(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[1], x.shape[0], -1).transpose(0, 1).flatten(1)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Constants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.arange(12.0).reshape(3, 4)  # a plain tensor attribute: a lifted constant

    def forward(self, idx):
        return self.table[idx], torch.tensor([1.0, 2.0]).sum()


class Loop(torch.nn.Module):
    def forward(self, x):
        def cond(i, value):
            return i < 4

        def body(i, value):
            return i + 1, value * 2 + i

        return torch._higher_order_ops.while_loop(cond, body, (torch.tensor(0), x))


class Vmapped(torch.nn.Module):
    """torch.vmap: the program keeps its batching markers until the converter retraces it."""

    def forward(self, x, y):
        return torch.vmap(lambda a, b: (a * b + 1).sum(dim=0))(x, y).sum(dim=0)


class CachePrefixAttention(torch.nn.Module):
    """Attention over a cache's first ``position + 1`` rows, ``position`` read from data with a bound: attention
    cannot take the rows padded to the bound, so the call gives the size."""

    def forward(self, query, cache, position):
        end = position.item()
        torch._check(end >= 0)
        torch._check(end < cache.shape[1])
        keys = cache[:, :end + 1].transpose(1, 2)
        return F.scaled_dot_product_attention(query.transpose(1, 2), keys, keys)


batch, length = Dim("batch", min=2, max=64), Dim("length", min=2, max=64)
CASES = [
    Case("linear_relu", LinearRelu(), (make((2, 6)), make((1, 3, 5, 5))), dynamic_shapes=({0: batch}, None),
         extra_args=[(make((7, 6), seed=1), make((1, 3, 5, 5), seed=2))]),
    Case("derived_dims", Derived(), (make(8), make(4), make(5)),
         dynamic_shapes=({0: 2 * length}, {0: length}, {0: length + 1}),
         extra_args=[(make(12, seed=1), make(6, seed=2), make(7, seed=3))]),
    Case("cond", Branch(), (make((3, 4)),), extra_args=[(-make((3, 4)).abs(),)]),
    Case("map", MapRows(), (make((4, 3)), make(3)), dynamic_shapes=({0: batch}, None),
         extra_args=[(make((6, 3), seed=1), make(3, seed=2))]),
    Case("nonzero", Nonzero(), (make((4, 5)),), extra_args=[(make((4, 5), seed=3),)]),
    Case("item_size", ItemSized(), (torch.tensor([2, 5, 1]), make(2)),
         extra_args=[(torch.tensor([0, 0, 0]), make(2)), (torch.tensor([8, 1, 2]), make(2, seed=1))]),
    Case("int_input", IntInput(), (make((3, 2)), 4), dynamic_shapes=({0: batch}, Dim.DYNAMIC(min=0, max=100)),
         extra_args=[(make((5, 2), seed=1), 9), (make((2, 2), seed=2), 0)]),
    Case("input_mutation", InputMutation(), (make(3), make(3, seed=1))),
    Case("buffer_mutation", Counter(), (make((2, 3)),), extra_args=[(make((2, 3), seed=1),), (make((2, 3), seed=2),)]),
    Case("batch_norm_training", TrainingBatchNorm().train(), (make((5, 4)),),
         extra_args=[(make((5, 4), seed=1),)]),
    Case("pytrees", Pytrees(), ({"a": make(3), "pair": (make(3, seed=1), make((2, 3), seed=2))},), {"scale": 3.0}),
    Case("computed_view", ComputedView(), (make((3, 4, 2)),), dynamic_shapes=({0: batch, 1: length, 2: None},),
         extra_args=[(make((5, 2, 2), seed=1),), (make((2, 7, 2), seed=2),)]),
    Case("attention", Attention(), (make((1, 2, 5, 8)), make((1, 2, 5, 8), seed=1), make((1, 2, 5, 8), seed=2)),
         dynamic_shapes=({2: length}, {2: length}, {2: length}),
         extra_args=[(make((1, 2, 9, 8)), make((1, 2, 9, 8), seed=1), make((1, 2, 9, 8), seed=2))]),
    Case("constants", Constants(), (torch.tensor([2, 0]),)),
    Case("while_loop", Loop(), (make(3),)),
    Case("cache_prefix_attention", CachePrefixAttention(), (make((1, 1, 2, 4)), make((1, 6, 2, 4), seed=1),
                                                            torch.tensor([2])),
         extra_args=[(make((1, 1, 2, 4)), make((1, 6, 2, 4), seed=1), torch.tensor([5]))]),
    Case("vmap", Vmapped(), (make((3, 2)), make((3, 2), seed=1)), dynamic_shapes=({0: batch}, {0: batch}),
         extra_args=[(make((5, 2), seed=2), make((5, 2), seed=3))]),
]
