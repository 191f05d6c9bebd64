"""Sorting ops against eager torch: sort (default, stable, descending, NaN), argsort, msort, topk."""
from __future__ import annotations

import pytest
import torch

from tests.support import FLOATS, INTS, assert_lowers, assert_matches_eager, make

aten = torch.ops.aten


def distinct(shape, dtype, seed=0):
    """A permutation of 0..n-1 (distinct values, exact in every dtype for small n), shuffled by ``seed``."""
    count = torch.Size(shape).numel()
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return (order - count // 2).reshape(shape).to(dtype)


def with_ties(shape, dtype):
    """Few distinct values, so many ties: stability decides the indices."""
    return make(shape, dtype, -2, 3, seed=1).round() if dtype.is_floating_point else make(shape, dtype, -2, 3, seed=1)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dim, descending, dtype):
    assert_lowers({aten.sort.default}, lambda x: torch.sort(x, dim, descending), distinct((4, 6, 5), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_ties(descending, dtype):
    x = with_ties((3, 40), dtype) if dtype != torch.bool else make((3, 40), torch.bool)
    assert_lowers({aten.sort.stable}, lambda x: torch.sort(x, dim=1, descending=descending, stable=True), x)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_is_largest(descending):
    x = torch.tensor([[1.0, float("nan"), -float("inf"), 0.0, float("inf"), -2.0, float("nan")]])
    assert_matches_eager(lambda x: torch.sort(x, descending=descending, stable=True), x)


def test_sort_0d():
    assert_matches_eager(lambda x: torch.sort(x), torch.tensor(3.0))


@pytest.mark.parametrize("descending", [False, True])
def test_argsort_and_msort(descending):
    x = distinct((5, 7), torch.float32)
    assert_matches_eager(lambda x: torch.argsort(x, dim=0, descending=descending), x)
    ties = with_ties((5, 7), torch.float32)
    assert_matches_eager(lambda x: torch.argsort(x, stable=True, descending=descending), ties)
    assert_matches_eager(torch.msort, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, -1])
def test_topk(dim, largest, dtype):
    assert_lowers({aten.topk.default}, lambda x: torch.topk(x, 3, dim, largest), distinct((6, 5, 4), dtype))


def test_topk_nan_is_largest():
    x = torch.tensor([1.0, float("nan"), 3.0, -1.0])
    assert_matches_eager(lambda x: torch.topk(x, 2), x)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_order_statistics(dtype):
    """Distinct values: the index is not ambiguous (torch's quickselect may name another tie than ours)."""
    x = distinct((4, 7), dtype)
    assert_lowers({aten.kthvalue.default}, lambda x: torch.kthvalue(x, 3, 1), x)
    assert_lowers({aten.median.dim, aten.median.default}, lambda x: (torch.median(x, 0, True), torch.median(x)), x)


def test_median_nan():
    x = torch.tensor([[3.0, 1, 3, 1, 2, 3, 1, 2], [5, float("nan"), 2, float("nan"), 0, 1, 1, 1]])
    assert_lowers({aten.median.dim, aten.nanmedian.dim}, lambda x: (torch.median(x, 1), torch.nanmedian(x, 1)), x)
    assert_lowers({aten.median.default, aten.nanmedian.default}, lambda x: (torch.median(x), torch.nanmedian(x)), x)


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_mode(dtype):
    assert_lowers({aten.mode.default}, lambda x: torch.mode(x, 1), with_ties((3, 12), dtype).to(dtype))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(right):
    boundaries, values = torch.sort(make((2, 6), seed=2))[0], make((2, 5), seed=3)
    assert_lowers({aten.searchsorted.Tensor}, lambda b, v: torch.searchsorted(b, v, right=right), boundaries, values)
    ties = torch.tensor([0, 1, 1, 2, 4])
    assert_lowers({aten.searchsorted.Tensor}, lambda b, v: torch.searchsorted(b, v, right=right),
                  ties, torch.tensor([[1, 3, -1], [4, 2, 9]]))


@pytest.mark.parametrize("bounds", [(0, 0), (-1, 2)])
def test_histc(bounds):
    assert_lowers({aten.histc.default}, lambda x: torch.histc(x, 7, *bounds), make((30,), torch.float32))
