"""put/take, scatter with reduce strings, as_strided_scatter, diagonal_scatter, segment_reduce, bucketize,
hash_tensor and renorm against eager torch; and the fixes to scatter_reduce/index_reduce and data-dependent slices."""
from __future__ import annotations

import pytest
import torch

from tests.support import assert_lowers, assert_matches_eager, make

aten = torch.ops.aten
DYNAMIC = torch.export.Dim.DYNAMIC

X = make((3, 4))
FLAT = torch.tensor([[6, -4], [0, 11]])  # flat positions in X, one negative
REPEATED = torch.randint(0, 10, (5, 5), generator=torch.Generator().manual_seed(1))


def _dim0(*tensors):
    """``dynamic_shapes`` with dim 0 of every input symbolic (FunctionModule takes ``*args``)."""
    return (tuple({0: DYNAMIC} for _ in tensors),)


# name -> (overloads lowered by their own rules, function, inputs)
CASES = {
    "take": ({aten.take.default}, lambda x, i: torch.take(x, i), (X, FLAT)),
    "take_0d": ({aten.take.default}, lambda x, i: torch.take(x, i), (make(()), torch.tensor(0))),
    "put": ({aten.put.default}, lambda x, i, s: torch.put(x, i, s), (X, FLAT, make((2, 2), seed=1))),
    "put_accumulate": ({aten.put.default}, lambda x, i, s: torch.put(x, i, s, accumulate=True),
                       (X, torch.tensor([6, -6, 6]), make((3,), seed=1))),
    "scatter_add_string": ({aten.scatter.reduce}, lambda x, i, s: torch.scatter(x, 0, i, s, reduce="add"),
                           (make((10, 5)), REPEATED, make((6, 5), seed=2))),
    "scatter_multiply_value": ({aten.scatter.value_reduce},
                               lambda x, i: torch.scatter(x, 1, i, 1.5, reduce="multiply"),
                               (make((10, 5)), REPEATED[:, :3] % 5)),
    "as_strided_scatter": ({aten.as_strided_scatter.default},
                           lambda x, s: torch.as_strided_scatter(x, s, (2, 2), (1, 2), 1), (X, make((2, 2), seed=1))),
    "diagonal_scatter": ({aten.diagonal_scatter.default}, lambda x, s: torch.diagonal_scatter(x, s, -2),
                         (make((6, 6)), make((4,), seed=1))),
    "diagonal_scatter_3d": ({aten.diagonal_scatter.default},
                            lambda x, s: torch.diagonal_scatter(x, s, 1, 2, 0),
                            (make((4, 3, 5)), make((3, 3), seed=1))),
    "bucketize": ({aten.bucketize.Tensor}, lambda x, b: torch.bucketize(x, b),
                  (torch.tensor([[-1.0, 0.5, 1.0], [2.0, 9.0, float("nan")]]), torch.tensor([0.0, 1.0, 1.0, 2.0]))),
    "bucketize_right_int32": ({aten.bucketize.Tensor}, lambda x, b: torch.bucketize(x, b, out_int32=True, right=True),
                              (torch.tensor([-1.0, 0.5, 1.0, 2.0, 9.0]), torch.tensor([0.0, 1.0, 1.0, 2.0]))),
    "hash_tensor": ({aten.hash_tensor.default}, lambda x: torch.hash_tensor(x), (X,)),
    "hash_tensor_int_dim": ({aten.hash_tensor.default}, lambda x: torch.hash_tensor(x, [1], keepdim=True),
                            (make((3, 4), torch.int32, -100, 100),)),
    "renorm": ({aten.renorm.default}, lambda x: torch.renorm(x, 2, 1, 1.0), (make((4, 3, 5)),)),
    "renorm_inf_half": ({aten.renorm.default}, lambda x: torch.renorm(x, float("inf"), 0, 0.5),
                        (make((4, 5), torch.float16),)),
    "renorm_p3": ({aten.renorm.default}, lambda x: torch.renorm(x, 3, -1, 2.0), (make((4, 5)),)),
    "segment_max_lengths_initial": ({aten.segment_reduce.default},
                                    lambda x, n: torch.segment_reduce(x, "max", lengths=n, initial=1),
                                    (make((5,)), torch.tensor([0, 1, 2, 2]))),
    "segment_mean_lengths": ({aten.segment_reduce.default}, lambda x, n: torch.segment_reduce(x, "mean", lengths=n),
                             (make((5, 2)), torch.tensor([0, 1, 2, 2]))),
    "segment_sum_offsets": ({aten.segment_reduce.default},
                            lambda x, o: torch.segment_reduce(x, "sum", offsets=o, initial=2),
                            (make((5,)), torch.tensor([0, 0, 1, 3, 5]))),
    "segment_min_lengths_axis1": ({aten.segment_reduce.default},
                                  lambda x, n: torch.segment_reduce(x, "min", lengths=n, axis=1),
                                  (make((2, 5, 3)), torch.tensor([[2, 3, 0], [1, 1, 3]]))),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_eager(name):
    ops, function, inputs = CASES[name]
    assert_lowers(ops, function, *inputs)


@pytest.mark.parametrize("function, inputs", [
    (lambda x, i: torch.take(x, i), (make((4, 3)), torch.tensor([5, -1, 0]))),
    (lambda x, i, s: torch.put(x, i, s, accumulate=True), (make((4, 3)), torch.tensor([5, -1, 5]), make((3,)))),
    (lambda x, s: torch.diagonal_scatter(x, s, 1), (make((6, 6)), make((5,), seed=1))),
    (lambda x, b: torch.bucketize(x, b), (make((4, 3)), torch.sort(make((5,), seed=1)).values)),
    (lambda x: torch.renorm(x, 1, 1, 0.5), (make((4, 3, 5)),)),
    (lambda x, n: torch.segment_reduce(x, "mean", lengths=n, initial=2), (make((5,)), torch.tensor([0, 1, 2, 2]))),
], ids=["take", "put", "diagonal_scatter", "bucketize", "renorm", "segment_reduce"])
def test_symbolic_dim0(function, inputs):
    assert_matches_eager(function, *inputs, dynamic_shapes=_dim0(*inputs))


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_bool_without_self(reduce):
    x, src = make((10, 5), torch.bool), make((5, 5), torch.bool, seed=3)
    assert_matches_eager(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=False), x, REPEATED, src)


@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_integer_mean_of_0d(include_self):
    assert_matches_eager(lambda x, i, s: x.index_reduce(0, i, s, "mean", include_self=include_self),
                         torch.tensor(7), torch.tensor([0]), torch.tensor(-2))


@pytest.mark.parametrize("indices, dim", [([1, 2, 3], 1), ([1, 4, 9], 0), ([3, 1], 2), ([-2, 5], 0)])
def test_tensor_split_by_index_tensor(indices, dim):
    """Pieces whose sizes come from the index values: returned padded with their true sizes."""
    assert_matches_eager(lambda x, i: torch.tensor_split(x, i, dim), make((5, 5, 5)), torch.tensor(indices))
