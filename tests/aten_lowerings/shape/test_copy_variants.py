"""The ``*_copy`` variants of view ops (what edge and functional graphs hold, e.g. PyTorch/XLA's core-op tests)
called directly in a program, against eager torch: each is lowered by its view op's own rule."""
from __future__ import annotations

import pytest
import torch

from tests.support import assert_lowers, assert_matches_eager, assert_registered_and_exported, make

aten = torch.ops.aten

X = (3, 4, 5)

# name -> (overload, function of the inputs, input shapes)
CASES = {
    "select_copy": (aten.select_copy.int, lambda x: aten.select_copy.int(x, 1, 2), [X]),
    "select_copy_negative": (aten.select_copy.int, lambda x: aten.select_copy.int(x, -1, -2), [X]),
    "slice_copy": (aten.slice_copy.Tensor, lambda x: aten.slice_copy.Tensor(x, 1, 1, 3), [X]),
    "slice_copy_step": (aten.slice_copy.Tensor, lambda x: aten.slice_copy.Tensor(x, 2, 0, 5, 2), [X]),
    "split_copy": (aten.split_copy.Tensor, lambda x: aten.split_copy.Tensor(x, 2, 1), [X]),
    "split_copy_uneven": (aten.split_copy.Tensor, lambda x: aten.split_copy.Tensor(x, 2, -1), [X]),
    "split_with_sizes_copy": (aten.split_with_sizes_copy.default,
                              lambda x: aten.split_with_sizes_copy.default(x, [1, 3], 1), [X]),
    "unbind_copy": (aten.unbind_copy.int, lambda x: aten.unbind_copy.int(x, 1), [X]),
    "narrow_copy": (aten.narrow_copy.default, lambda x: aten.narrow_copy.default(x, 2, 1, 3), [X]),
    "transpose_copy": (aten.transpose_copy.int, lambda x: aten.transpose_copy.int(x, 0, -1), [X]),
    "permute_copy": (aten.permute_copy.default, lambda x: aten.permute_copy.default(x, [2, 0, 1]), [X]),
    "t_copy": (aten.t_copy.default, lambda x: aten.t_copy.default(x), [(4, 5)]),
    "view_copy": (aten.view_copy.default, lambda x: aten.view_copy.default(x, [12, -1]), [X]),
    "reshape_copy": (aten._reshape_copy.default, lambda x: aten._reshape_copy.default(x, [5, 12]), [X]),
    "reshape_alias_copy": (aten._reshape_alias_copy.default,
                           lambda x: aten._reshape_alias_copy.default(x, [12, 5], [5, 1]), [X]),
    "unsqueeze_copy": (aten.unsqueeze_copy.default, lambda x: aten.unsqueeze_copy.default(x, -1), [X]),
    "squeeze_copy": (aten.squeeze_copy.default, lambda x: aten.squeeze_copy.default(x), [(1, 4, 1)]),
    "squeeze_copy_dim": (aten.squeeze_copy.dim, lambda x: aten.squeeze_copy.dim(x, 2), [(1, 4, 1)]),
    "squeeze_copy_dims": (aten.squeeze_copy.dims, lambda x: aten.squeeze_copy.dims(x, [0, 2]), [(1, 4, 1)]),
    "expand_copy": (aten.expand_copy.default, lambda x: aten.expand_copy.default(x, [2, 4, -1]), [(4, 1)]),
    "unfold_copy": (aten.unfold_copy.default, lambda x: aten.unfold_copy.default(x, 1, 2, 1), [X]),
    "unfold_copy_step": (aten.unfold_copy.default, lambda x: aten.unfold_copy.default(x, -1, 2, 3), [X]),
    "diagonal_copy": (aten.diagonal_copy.default, lambda x: aten.diagonal_copy.default(x, 1, 1, 2), [X]),
    "as_strided_copy": (aten.as_strided_copy.default,
                        lambda x: aten.as_strided_copy.default(x, [2, 3], [5, 2], 1), [X]),
    "neg_view_copy": (aten._neg_view_copy.default, lambda x: aten._neg_view_copy.default(x), [X]),
    "view_copy_dtype_same_width": (aten.view_copy.dtype, lambda x: aten.view_copy.dtype(x, torch.int32), [X]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_copy_variant_matches_eager(name):
    op, function, shapes = CASES[name]
    assert_lowers({op}, function, *(make(s, seed=i) for i, s in enumerate(shapes)))


IDENTITIES = {  # rules that emit no op here
    "alias_copy": (aten.alias_copy.default, lambda x: aten.alias_copy.default(x)),
    "detach_copy": (aten.detach_copy.default, lambda x: aten.detach_copy.default(x)),
    "slice_copy_whole": (aten.slice_copy.Tensor, lambda x: aten.slice_copy.Tensor(x)),
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
def test_identity_copy_variant_matches_eager(name):
    op, function = IDENTITIES[name]
    assert_registered_and_exported({op}, function, make(X))
    assert_matches_eager(function, make(X))


COMPLEX = {
    "view_as_real_copy": (aten.view_as_real_copy.default, lambda c: aten.view_as_real_copy.default(c)),
    "conj_copy": (aten._conj_copy.default, lambda c: aten._conj_copy.default(c)),
    "view_as_complex_copy": (aten.view_as_complex_copy.default,
                             lambda c: aten.view_as_complex_copy.default(torch.view_as_real(c) * 2)),
}


@pytest.mark.parametrize("name", sorted(COMPLEX))
def test_complex_copy_variant_matches_eager(name):
    op, function = COMPLEX[name]
    assert_lowers({op}, function, torch.complex(make((3, 4)), make((3, 4), seed=1)))


@pytest.mark.parametrize("source, target", [(torch.float32, torch.int32), (torch.float32, torch.uint8),
                                            (torch.int8, torch.float16), (torch.int16, torch.bfloat16),
                                            (torch.uint8, torch.bool), (torch.bool, torch.int8),
                                            (torch.int64, torch.float64)])
def test_view_copy_dtype_reads_the_same_bytes(source, target):
    """Narrower dtypes split each element along the last dim, wider ones join runs of it (little-endian)."""
    x = make((3, 8), source, low=0 if source in (torch.uint8, torch.bool) else -100, high=100)
    assert_lowers({aten.view_copy.dtype}, lambda x: aten.view_copy.dtype(x, target), x)


# -- a symbolic dim: one artifact, run at several sizes -----------------------------------------------------

DYNAMIC = {
    "select_copy": lambda x: aten.select_copy.int(x, 1, 2),
    "slice_copy": lambda x: aten.slice_copy.Tensor(x, 0, 1),
    "split_copy": lambda x: aten.split_copy.Tensor(x, 2, 1),
    "transpose_copy": lambda x: aten.transpose_copy.int(x, 0, 2),
    "view_copy": lambda x: aten.view_copy.default(x, [x.shape[0], 20]),
    "unbind_copy": lambda x: aten.unbind_copy.int(x, 2),
    "unfold_copy": lambda x: aten.unfold_copy.default(x, 0, 2, 1),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_copy_variant_with_a_symbolic_dim(name):
    batch = torch.export.Dim("batch", min=3, max=16)
    artifact = assert_matches_eager(DYNAMIC[name], make(X), dynamic_shapes=(({0: batch},),))
    assert "?x" in artifact.stablehlo_text
    for size in (3, 7, 16):
        x = make((size, 4, 5), seed=size)
        torch.testing.assert_close(artifact(x), DYNAMIC[name](x))


def test_the_core_op_tests_failing_ops_in_one_program():
    """select_copy, slice_copy and split_copy together, as a functional graph holds them."""
    def function(x):
        first, second = aten.split_copy.Tensor(aten.slice_copy.Tensor(x, 2, 0, 4), 2, 2)
        return aten.select_copy.int(first, 0, 1) + aten.select_copy.int(second, 0, -1)

    assert_lowers({aten.select_copy.int, aten.slice_copy.Tensor, aten.split_copy.Tensor}, function, make(X))
