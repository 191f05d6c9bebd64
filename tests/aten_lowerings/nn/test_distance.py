"""Distances and embedding bags against eager torch: cdist, pdist, embedding_bag (all four outputs)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.support import assert_lowers, assert_matches_eager, make

aten = torch.ops.aten
F = torch.nn.functional

P_VALUES = [0.0, 1.0, 2.0, 3.0, 0.5, math.inf]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", P_VALUES)
def test_cdist(p, dtype):
    x1, x2 = make((2, 5, 4), dtype), make((2, 6, 4), dtype, seed=1)
    if p == 0:  # some equal coordinates, so that p=0 counts fewer than all
        x1, x2 = x1.round(), x2.round()
    assert_lowers({aten._cdist_forward.default}, lambda a, b: torch.cdist(a, b, p), x1, x2)


@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                                  "donot_use_mm_for_euclid_dist"])
@pytest.mark.parametrize("rows", [5, 30])
def test_cdist_compute_modes(rows, mode):
    x1, x2 = make((rows, 8)), make((7, 8), seed=1)
    assert_matches_eager(lambda a, b: torch.cdist(a, b, compute_mode=mode), x1, x2)


def test_cdist_broadcast_batch():
    x1, x2 = make((3, 4, 5)), make((2, 1, 6, 5), seed=1)
    assert_matches_eager(lambda a, b: torch.cdist(a, b, 1.0), x1, x2)
    assert_matches_eager(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), x1, x2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", P_VALUES)
def test_pdist(p, dtype):
    x = make((6, 4), dtype)
    if p == 0:
        x = x.round()
    assert_lowers({aten._pdist_forward.default}, lambda x: F.pdist(x, p), x)


WEIGHT = make((10, 3), normal=True)
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
OFFSETS = torch.tensor([0, 4, 4, 6])  # bag 1 is empty


@pytest.mark.parametrize("op", [aten._embedding_bag.default, aten._embedding_bag_forward_only.default])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_outputs(include_last_offset, padding_idx, mode, op):
    """All four outputs for mean and max. For sum, eager's CPU fast path returns bookkeeping tensors of other
    sizes than torch.export's (offset2bag empty, bag_size one longer), so only the bags themselves compare."""
    offsets = torch.cat([OFFSETS, torch.tensor([8])]) if include_last_offset else OFFSETS

    def bags(w, i, o):
        outputs = op(w, i, o, False, mode, False, None, include_last_offset, padding_idx)
        return outputs if mode else outputs[0]

    assert_lowers({op}, bags, WEIGHT, INDICES, offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_embedding_bag_per_sample_weights(dtype):
    weights = make((8,), dtype, seed=3)
    assert_matches_eager(lambda w, i, o, s: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=s),
                         WEIGHT.to(dtype), INDICES, OFFSETS, weights)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_functional(mode):
    """The public API, 1-d indices with offsets and 2-d indices (fixed-size bags)."""
    assert_matches_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), WEIGHT, INDICES, OFFSETS)
    assert_matches_eager(lambda w, i: F.embedding_bag(i, w, mode=mode), WEIGHT, INDICES.view(2, 4))
    module = torch.nn.EmbeddingBag(10, 3, mode=mode, padding_idx=4)
    assert_matches_eager(module, INDICES, OFFSETS)
