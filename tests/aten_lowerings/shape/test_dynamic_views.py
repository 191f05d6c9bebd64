"""Views, reshapes, flattens and unflattens of tensors with symbolic dims, to sizes that are expressions of those
dims, against eager at several sizes. A type such as ``tensor<?x?xf32>`` does not say which sizes a value has:
``?x?`` to ``?x?`` may move elements between the dims, so such a reshape must be emitted (it once was dropped).

Random programs: the input's dims are factors kept in order and grouped into the current tensor's dims; each
step regroups them (view, flatten, unflatten, reshape with a -1) or swaps two groups (transpose, after which
views are reshapes). A fixed sample runs by default; ``--full-sweep`` runs more programs."""
import math
import random

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo

from ...conftest import sampled
from ...support import make

SIZES = [(2, 3, 5), (4, 7, 5), (9, 2, 5)]  # (a, b, 5) with a and b symbolic; the first is the export example
SAMPLE = [0, 1, 2, 32, 36, 37]  # the last three once came back with their input's ?x? sizes (the reshape dropped)


def pytest_generate_tests(metafunc):
    if "program" in metafunc.fixturenames:
        sampled(metafunc, "program", range(40), SAMPLE)


def _regroup(rng: random.Random, count: int) -> list[int]:
    """A random split of ``count`` factors into consecutive groups: each group's length."""
    cuts = sorted(rng.sample(range(1, count), rng.randint(0, count - 1)))
    return [end - start for start, end in zip([0, *cuts], [*cuts, count])]


def random_steps(seed: int) -> list[tuple]:
    """Steps over factor groups: ("view", order, lengths, where -1 goes or None) to the factors in ``order``
    (a permutation of them reinterprets the elements, it moves none), ("flatten", start, end), ("unflatten", dim)
    or ("transpose", i, j)."""
    rng = random.Random(seed)
    groups = [1, 1, 1]  # each group's number of factors
    steps = []
    while len(steps) < 3:
        kind = rng.choice(["view", "flatten", "unflatten", "transpose"])
        if kind == "view":
            groups = _regroup(rng, 3)
            steps.append(("view", rng.sample(range(3), 3), groups, rng.choice([None, *range(len(groups))])))
        elif kind == "flatten":
            start = rng.randrange(len(groups))
            end = rng.randrange(start, len(groups))
            steps.append(("flatten", start, end))
            groups = [*groups[:start], sum(groups[start:end + 1]), *groups[end + 1:]]
        elif kind == "unflatten" and max(groups) > 1:
            dim = groups.index(max(groups))
            steps.append(("unflatten", dim))
            groups = [*groups[:dim], *[1] * groups[dim], *groups[dim + 1:]]
        elif kind == "transpose" and len(groups) > 1:
            steps.append(("transpose", *rng.sample(range(len(groups)), 2)))
    return steps


class Views(torch.nn.Module):
    """Runs ``steps`` (``random_steps``) on its input; every size is an expression of the input's sizes."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x):
        factors = list(x.shape)
        groups = [[0], [1], [2]]  # the factors each dim of ``x`` holds
        contiguous = True
        for step in self.steps:
            if step[0] == "view":
                _, order, lengths, inferred = step
                starts = [sum(lengths[:i]) for i in range(len(lengths))]
                groups = [order[s:s + n] for s, n in zip(starts, lengths)]
                sizes = [-1 if i == inferred else math.prod(factors[f] for f in g) for i, g in enumerate(groups)]
                x = x.view(*sizes) if contiguous else x.reshape(*sizes)
                contiguous = True
            elif step[0] == "flatten":
                _, start, end = step
                x = x.flatten(start, end) if contiguous else x.reshape(*x.shape[:start], -1, *x.shape[end + 1:])
                groups = [*groups[:start], [f for g in groups[start:end + 1] for f in g], *groups[end + 1:]]
            elif step[0] == "unflatten":
                _, dim = step
                x = x.unflatten(dim, [factors[f] for f in groups[dim]])
                groups = [*groups[:dim], *[[f] for f in groups[dim]], *groups[dim + 1:]]
            else:
                _, i, j = step
                x = x.transpose(i, j)
                groups[i], groups[j] = groups[j], groups[i]
                contiguous = False
        return x * 2


def test_random_views_of_symbolic_dims_match_eager(program):
    steps = random_steps(program)
    model = Views(steps)
    dynamic = {"x": {0: Dim("a", min=2, max=64), 1: Dim("b", min=2, max=64)}}
    # torch guards such views (a view to (5, a*b) makes it ask a != 5); deferred, they are asserts in the graph
    ep = torch.export.export(model, (make(SIZES[0], seed=program),), dynamic_shapes=dynamic,
                             prefer_deferred_runtime_asserts_over_guards=True)
    artifact = export_to_stablehlo(ep)
    for sizes in SIZES:
        x = make(sizes, seed=program)
        torch.testing.assert_close(artifact(x), model(x), rtol=0, atol=0, msg=lambda m: f"{steps} at {sizes}: {m}")


class ComputedView(torch.nn.Module):
    def forward(self, x):
        return x.view(x.shape[0] - 1, -1)


def test_view_to_a_size_computed_from_symbolic_dims():
    """``x.view(x.shape[0] - 1, -1)`` (torch's test_export_mod_constraints): the result is (a - 1, a*b // (a - 1));
    it was returned with the input's shape, both being ``?x?``."""
    dynamic = {"x": (Dim("dim0_x", min=3), Dim("dim1_x", max=8000))}
    ep = torch.export.export(ComputedView(), (torch.randn(3, 4),), dynamic_shapes=dynamic,
                             prefer_deferred_runtime_asserts_over_guards=True)
    artifact = export_to_stablehlo(ep)
    for sizes in [(3, 4), (4, 3), (5, 8), (7, 12)]:
        x = make(sizes)
        torch.testing.assert_close(artifact(x), ep.module()(x), rtol=0, atol=0)
