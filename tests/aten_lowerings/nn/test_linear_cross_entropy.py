"""F.linear_cross_entropy with chunking options (torch's ``torch_nn`` chunked custom ops) against eager torch:
reductions, bias, class weights, ignored targets, unbatched input, low precision; the precomputed gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support import FLOATS, assert_lowers, make

pytest.importorskip("torch.nn.modules.linear_cross_entropy_options")
from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions  # noqa: E402

CHUNKED = torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default
CHUNKED_NONE = torch.ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default
OPTIONS = LinearCrossEntropyOptions(batch_chunk_size=2)


def loss(reduction, **kwargs):
    return lambda x, w, t, *rest: F.linear_cross_entropy(
        x, w, t, **dict(zip(("linear_bias", "weight"), rest)), reduction=reduction, options=OPTIONS, **kwargs)


def inputs(dtype=torch.float32, batch=(7,), classes=5, features=4):
    target = make(batch, torch.int64, 0, classes, seed=2)
    return make((*batch, features), dtype, seed=0), make((classes, features), dtype, seed=1), target


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reductions(reduction, dtype):
    op = CHUNKED_NONE if reduction == "none" else CHUNKED
    assert_lowers({op}, loss(reduction), *inputs(dtype))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bias_and_class_weights(reduction):
    bias, class_weight = make((5,), seed=3), make((5,), low=0.5, high=2, seed=4)
    assert_lowers({CHUNKED_NONE if reduction == "none" else CHUNKED}, loss(reduction), *inputs(), bias, class_weight)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignored_targets(reduction):
    """Without class weights (torch's chunked kernel indexes them with the ignored target)."""
    x, w, target = inputs()
    target[1] = target[4] = -100
    assert_lowers({CHUNKED_NONE if reduction == "none" else CHUNKED}, loss(reduction), x, w, target,
                  make((5,), seed=3))
    target[1] = target[4] = 3
    assert_lowers({CHUNKED_NONE if reduction == "none" else CHUNKED}, loss(reduction, ignore_index=3), x, w, target)


def test_unbatched_input():
    x, w, target = inputs(batch=())
    assert_lowers({CHUNKED}, loss("mean"), x, w, target)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_precomputed_gradients(reduction):
    """With every compute_*_grad flag set, the op also returns d loss / d (input, linear weight, bias)."""
    x, w, target = inputs()
    target[2] = -100
    bias, class_weight = make((5,), seed=3), make((5,), low=0.5, high=2, seed=4)
    call = lambda x, w, t, b, cw: CHUNKED(x, w, t, b, cw, reduction, -100, 0.0, 2, "compact",  # noqa: E731
                                          torch.float32, True, True, True, True)
    assert_lowers({CHUNKED}, call, x, w, target, bias, class_weight)
