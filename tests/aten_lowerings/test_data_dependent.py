"""Ops whose output size depends on the data, against eager torch: nonzero, argwhere, masked_select, unique,
unique_consecutive (padded to a static bound, returned at their true size), ops on their results (or, for ops
that cannot take padding, sizes given by the call), and the clear errors for what can be neither."""
from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.errors import LoweringError
from tests.support import FLOATS, INTS, assert_lowers, assert_matches_eager, make

aten = torch.ops.aten


def sparse(shape, dtype, seed=0):
    """About half the elements zero."""
    values = make(shape, torch.float32, -2, 3, seed=seed).round()
    return values.clamp(min=0).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4)])
def test_nonzero(shape, dtype):
    assert_lowers({aten.nonzero.default}, torch.nonzero, sparse(shape, dtype))


@pytest.mark.parametrize("x", [torch.zeros(3, 4), torch.ones(3, 4), torch.tensor(2.0), torch.tensor(0.0),
                               torch.zeros(0, 3)], ids=["none", "all", "scalar", "scalar_zero", "empty"])
def test_nonzero_edges(x):
    assert_matches_eager(torch.nonzero, x)


def test_nonzero_as_tuple_and_argwhere():
    x = sparse((3, 5), torch.float32)
    assert_matches_eager(lambda x: torch.nonzero(x, as_tuple=True), x)
    assert_matches_eager(torch.argwhere, x)


def test_elementwise_and_layout_ops_on_the_result():
    x = sparse((4, 5), torch.float32)
    assert_matches_eager(lambda x: (torch.nonzero(x).t() * 2 + 1).float().sigmoid(), x)
    assert_matches_eager(lambda x: torch.stack([torch.nonzero(x)[:, 1], torch.nonzero(x)[:, 0]], 1), x)
    # the *_copy variants of the views, as functional graphs hold them
    assert_matches_eager(lambda x: aten.t_copy.default(aten.select_copy.int(torch.nonzero(x), 1, -1)[None]), x)


def test_indexing_by_the_result():
    x = sparse((4, 5), torch.float32)
    assert_matches_eager(lambda x: x[torch.nonzero(x, as_tuple=True)], x)
    assert_matches_eager(lambda x: x.flatten().index_select(0, torch.nonzero(x.flatten())[:, 0]), x)
    assert_matches_eager(lambda x: torch.gather(x, 0, torch.nonzero(x)[:, :1]), x)


def test_true_size_as_a_value():
    x = sparse((4, 5), torch.float32)
    assert_matches_eager(lambda x: (torch.nonzero(x), x * torch.nonzero(x).shape[0]), x)


def test_nonzero_with_a_symbolic_dim():
    x = sparse((6, 3), torch.float32)
    artifact = assert_matches_eager(_Function(torch.nonzero), x, dynamic_shapes={"x": {0: Dim("n", min=2, max=32)}})
    other = sparse((9, 3), torch.float32, seed=3)
    torch.testing.assert_close(artifact(other), torch.nonzero(other))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_masked_select(dtype):
    x = make((3, 4), dtype, -4, 5)
    mask = make((3, 4), torch.bool, seed=2)
    assert_lowers({aten.masked_select.default}, torch.masked_select, x, mask)
    assert_matches_eager(torch.masked_select, x, make((4,), torch.bool, seed=3))  # broadcast mask
    assert_matches_eager(torch.masked_select, x, torch.zeros(3, 4, dtype=torch.bool))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("counts", [False, True])
def test_unique(dtype, inverse, counts):
    x = make((4, 5), dtype, -3, 3, seed=1)
    if dtype.is_floating_point:
        x = x.round()
    assert_lowers({aten._unique2.default},
                  lambda x: torch.unique(x, return_inverse=inverse, return_counts=counts), x)


def test_unique_edges():
    nans = torch.tensor([3.0, float("nan"), 1, float("nan"), 3, 2, 1])  # each NaN is its own value, as in torch
    assert_matches_eager(lambda x: torch.unique(x, return_inverse=True, return_counts=True), nans)
    assert_matches_eager(lambda x: torch.unique_consecutive(x, return_counts=True), nans)
    assert_matches_eager(lambda x: torch.unique(x, sorted=False, return_inverse=True), nans.nan_to_num())
    assert_matches_eager(lambda x: torch.unique(x, return_inverse=True, return_counts=True), torch.zeros(0))
    assert_matches_eager(lambda x: torch.unique(x, return_counts=True), torch.full((3, 2), 7))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_unique_consecutive(dtype):
    x = make((12,), dtype, -2, 2, seed=4)
    if dtype.is_floating_point:
        x = x.round()
    assert_lowers({aten.unique_consecutive.default},
                  lambda x: torch.unique_consecutive(x, return_inverse=True, return_counts=True), x)
    assert_matches_eager(torch.unique_consecutive, x.reshape(3, 4))


def test_repeat_interleave_with_output_size():
    repeats = torch.tensor([2, 0, 3, 1])
    assert_lowers({aten.repeat_interleave.Tensor}, lambda r: torch.repeat_interleave(r, output_size=6), repeats)


def test_leading_dim_reshapes_keep_the_padding():
    """Padding rows that are the tail of the elements stay the tail through a reshape of the leading dim."""
    x = sparse((3, 4), torch.float32)
    assert_matches_eager(lambda x: (torch.nonzero(x).reshape(-1), torch.nonzero(x).view(-1, 1, 2) * 3), x)


@pytest.mark.full_sweep_only  # make test samples sizes given by the call in tests/conformance/test_unbacked.py
def test_bincount_and_repeat_interleave_sizes_are_given_by_the_call():
    """Sizes with no bound (``emit.padded.call_time_sizes``): the artifact finds them first, then runs with them."""
    assert_matches_eager(lambda x: (torch.bincount(x), torch.bincount(x, x.double(), 9), torch.repeat_interleave(x)),
                         torch.tensor([1, 3, 0, 2, 2]))


def test_reductions_with_an_identity_take_padded_tensors():
    """The padding rows are filled with the reduction's identity first (``emit.padded.padding_filled``)."""
    assert_matches_eager(lambda x: (torch.nonzero(x).sum(0), x[x > 0].amax(), x[x != 0].prod()),
                         sparse((3, 4), torch.float32))


def test_ops_that_cannot_take_padding_get_the_size_from_the_call():
    """A mean, a sort, a reshape across the padded dim: nonzero's and masked_select's sizes are then given by the
    call (``emit.padded.call_time_sizes``), exact, as an unbounded ``.item()`` is."""
    assert_matches_eager(lambda x: (torch.nonzero(x).float().mean(), torch.nonzero(x).t().reshape(-1),
                                    x.masked_select(x > 0).sort(descending=True).values), sparse((3, 4), torch.float32))


@pytest.mark.parametrize("function, message", [
    (lambda x: torch.nonzero(x).float().mean() + torch.rand(()), r"aten\.mean\.\w+ at .* takes \w+, whose size "
     r"is data-dependent"),
    (lambda x: torch.unique(x)[torch.tensor([-1])], r"takes getitem\w*, whose size is data-dependent"),
], ids=["reduction_in_a_random_program", "index_into"])
def test_unsupported_uses_raise_clearly(function, message):
    x = sparse((3, 4), torch.float32)
    with pytest.raises(LoweringError, match=message):
        export_to_stablehlo(_Function(function), (x,))


class _Function(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


def test_saved_bundle_keeps_the_sizes(tmp_path):
    from torch_stablehlo.exporter import load_artifact

    x = sparse((3, 4), torch.float32)
    artifact = assert_matches_eager(lambda x: (torch.unique(x, return_counts=True), torch.nonzero(x)), x)
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert loaded.signature.sizes == artifact.signature.sizes
    torch.testing.assert_close(loaded(x), artifact(x))
    with pytest.raises(NotImplementedError, match="data-dependent sizes"):
        artifact.to_jax()
