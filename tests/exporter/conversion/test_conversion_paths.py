"""Which conversions re-trace: ops that used to send the whole program through ``run_decompositions`` (F.pad,
``detach_``, argsort, weight norm, in-place ops on temporaries and through their views, in-place cache writes) are lowered in the one graph walk, and
writes the walk cannot rebind (user inputs, aliases read after the write) still take the re-trace."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion import decomposition
from torch_stablehlo.exporter.conversion.inplace import functional_twin
from tests.support import FunctionModule, assert_matches_eager, make

aten = torch.ops.aten


@pytest.fixture
def no_retrace(monkeypatch):
    """A re-trace (``decomposition.retraced``) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the program was re-traced")

    monkeypatch.setattr(decomposition, "retraced", refuse)


@pytest.fixture
def retraces(monkeypatch):
    """Counts the re-traces (``decomposition.retraced``), each with its table."""
    calls = []
    original = decomposition.retraced

    def counted(program, table):
        calls.append((table,))
        return original(program, table)

    monkeypatch.setattr(decomposition, "retraced", counted)
    return calls


def _residual_add(x):
    y = x * 2
    y += torch.tanh(x)  # add_ on a temporary; the uses after it see the sum
    return y.relu() + y


def _detached(x):
    y = torch.exp(x)
    y.detach_()
    return y * 3


def _chained_writes(x):
    y = x + 1
    y.mul_(2).sub_(x)  # the second write reads the first one's result
    return y, y.sum()


def _fill_then_view(x):
    y = x.clone()
    y.copy_(x.flip(0))
    return y.view(-1)[:5]


def _normalised_top_k(x):
    values, indices = x.topk(2, -1)  # a mixture-of-experts router: the weights renormalised in place
    values /= values.sum(-1, keepdim=True)
    return values, indices


def _masked_prefix(x):
    mask = torch.ones_like(x)
    mask[:, :3] = 0  # a write through a view of a temporary read afterwards (ViT-MAE, SAM)
    return x * mask


def _scaled_column(x):
    y = x.clone()
    y[:, 1:, 0] = y[:, 1:, 0] * 2  # through a slice, then a select
    y.diagonal(dim1=1, dim2=2).zero_()
    return y + 1


class StaticCache(torch.nn.Module):
    """A decoder step writing a KV cache as transformers' StaticCache does: index_copy_ into a tensor that
    torch.export lifts as a constant, then attention over the whole cache."""

    def __init__(self):
        super().__init__()
        self.cache = torch.zeros(1, 2, 8, 4)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, position):
        written = self.cache.clone().index_copy_(2, position, self.proj(x))
        return torch.softmax(x @ written.transpose(-1, -2), -1) @ written


CASES = {
    "pad_constant": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), (make((2, 3, 5, 6)),)),
    "pad_reflect": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), (make((2, 3, 5, 6)),)),
    "pad_replicate": (lambda x: F.pad(x, (2, 1), mode="replicate"), (make((2, 3, 6)),)),
    "pad_circular": (lambda x: F.pad(x, (1, 2, 2, 1), mode="circular"), (make((2, 3, 5, 6)),)),
    "add_on_temporary": (_residual_add, (make((3, 4)),)),
    "detach_": (_detached, (make((3, 4)),)),
    "chained_writes": (_chained_writes, (make((3, 4)),)),
    "copy_": (_fill_then_view, (make((3, 4)),)),
    "write_through_a_view": (_masked_prefix, (make((2, 9)),)),
    "writes_through_views_of_views": (_scaled_column, (make((2, 4, 4)),)),
    "write_to_one_result_of_several": (_normalised_top_k, (make((3, 5)),)),
    "argsort": (lambda x: (torch.argsort(x, -1), torch.argsort(x, dim=0, stable=True, descending=True)),
                (make((3, 4)),)),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 2), (make((4, 3, 5)), make((1, 1, 5), low=0.5))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_converts_without_retrace(name, no_retrace):
    function, args = CASES[name]
    assert_matches_eager(function, *args)


def test_static_cache_write_without_retrace(no_retrace):
    x, position = make((1, 2, 3, 4)), torch.tensor([1, 4, 5])
    assert_matches_eager(StaticCache(), x, position)


class BufferCache(torch.nn.Module):
    """A decoder step's cache as a strict=True export keeps it: a buffer written in place (``copy_`` of the
    position, then ``index_copy_`` at ``arange(n) + position``, through a ``to`` that returns it), read after."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4), persistent=False)
        self.register_buffer("length", torch.tensor(0), persistent=False)

    def forward(self, x, position):
        self.length.copy_(position[0])
        at = torch.arange(x.shape[0]) + self.length.to(torch.int64)
        self.length.to(torch.int64).add_(x.shape[0])
        self.cache.index_copy_(0, at, x)
        return self.cache.sum(0) + self.length


@pytest.mark.parametrize("strict", [True, False])
def test_state_written_in_place_is_carried_without_retrace(strict, no_retrace):
    """Buffers written in place are the program's state: rebound by the walk (no run_decompositions), returned
    and carried to the next call, exactly as ep.module() carries them."""
    inputs = (torch.ones(2, 4), torch.tensor([0]))
    program = torch.export.export(BufferCache(), inputs, strict=strict)
    artifact = export_to_stablehlo(program)
    eager = program.module()
    for step in range(3):
        x, position = torch.full((2, 4), float(step + 1)), torch.tensor([2 * step])
        torch.testing.assert_close(artifact(x, position), eager(x, position))
    assert {s.name for s in artifact.signature.state} == {"cache", "length"}
    torch.testing.assert_close(artifact.state["cache"], eager.cache)
    torch.testing.assert_close(artifact.state["length"], eager.length)


def _write_to_input(x):
    x.add_(1)
    return x * 2


def _stale_view(x):
    y = x + 0
    row = y[0]  # a view made before the write and read after it: the write must reach it
    y.mul_(3)
    return row + 1


@pytest.mark.parametrize("function", [_write_to_input, _stale_view])
def test_writes_the_walk_cannot_rebind_still_retrace(function, retraces):
    x = make((3, 4))
    artifact = export_to_stablehlo(FunctionModule(function), (x.clone(),))
    assert retraces
    torch.testing.assert_close(artifact(x.clone()), function(x.clone()))


@pytest.mark.parametrize("op, twin", [(aten.add_.Tensor, aten.add.Tensor), (aten.index_copy_.default,
                                                                           aten.index_copy.default),
                                      (aten.detach_.default, aten.detach.default), (aten.copy_.default,
                                                                                    aten.copy.default),
                                      (aten.add.Tensor, None), (aten.add.out, None)])
def test_functional_twin(op, twin):
    assert functional_twin(op) is twin
