"""Shape and view ops against eager torch: reshapes, permutations, joins, splits, slices, diff, repeat, flips."""
from __future__ import annotations

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import (FunctionModule, assert_lowers, assert_lowers_with_symbolic_batch, assert_matches_eager,
                           assert_named_in_locations, make)

aten = torch.ops.aten


# name -> (function, input shapes); every case runs in float32, DTYPE_CASES also in other dtypes.
CASES = {
    # reshapes
    "view_infer": (lambda x: x.view(-1, 5), [(4, 6, 5)]),
    "view_gpt2": (lambda x: x.view(2, 8, -1, 4), [(2, 8, 12)]),
    "reshape_after_transpose": (lambda x: x.transpose(0, 1).reshape(6, -1), [(4, 6, 5)]),
    "view_as": (lambda x, y: x.view_as(y), [(4, 6, 5), (6, 20)]),
    "unsqueeze_neg": (lambda x: x.unsqueeze(-1), [(4, 6)]),
    "squeeze_all": (lambda x: x.squeeze(), [(1, 4, 1, 5)]),
    "squeeze_dim": (lambda x: x.squeeze(2), [(1, 4, 1, 5)]),
    "squeeze_dim_not_one": (lambda x: x.squeeze(1), [(1, 4, 1, 5)]),
    "squeeze_dims": (lambda x: x.squeeze((0, -2)), [(1, 4, 1, 5)]),
    "flatten": (lambda x: x.flatten(1), [(2, 3, 4, 5)]),
    "flatten_all": (lambda x: x.flatten(), [(2, 3, 4)]),
    "unflatten": (lambda x: x.unflatten(1, (2, -1)), [(4, 6, 5)]),
    # broadcasts
    "expand_minus_one": (lambda x: x.expand(2, -1), [(1, 8)]),
    "expand_new_dims": (lambda x: x.expand(2, 3, -1, 5), [(4, 1)]),
    "expand_as": (lambda x, y: x.expand_as(y), [(1, 6, 1), (4, 6, 5)]),
    "repeat_kv": (lambda x: x[:, :, None].expand(2, 2, 3, 8, 4).reshape(2, 6, 8, 4), [(2, 2, 8, 4)]),
    # permutations
    "permute": (lambda x: x.permute(2, 0, 1), [(4, 6, 5)]),
    "permute_neg": (lambda x: x.permute(-1, 0, -2), [(4, 6, 5)]),
    "transpose": (lambda x: x.transpose(1, 2), [(2, 8, 3, 4)]),
    "transpose_neg": (lambda x: x.transpose(-1, 0), [(4, 6, 5)]),
    "t": (lambda x: x.t(), [(4, 6)]),
    "t_1d": (lambda x: x.t() * 2, [(4,)]),
    "numpy_T": (lambda x: x.T, [(4, 6)]),
    "mT": (lambda x: x.mT, [(2, 4, 6)]),
    "movedim": (lambda x: x.movedim(0, -1), [(4, 6, 5)]),
    "movedim_list": (lambda x: x.movedim((0, 1), (-1, 0)), [(2, 3, 4, 5)]),
    "swapaxes": (lambda x: x.swapaxes(0, 2), [(4, 6, 5)]),
    # joins
    "cat": (lambda x, y: torch.cat([x, y, x], 1), [(4, 2, 5), (4, 3, 5)]),
    "cat_neg_dim": (lambda x, y: torch.cat([y, x], -1), [(2, 4, 8, 8), (2, 4, 8, 8)]),
    "cat_drops_1d_empty": (lambda x, e: torch.cat([e, x, e], 1), [(4, 6, 5), (0,)]),
    "cat_empty_along_dim": (lambda x, e: torch.cat([x, e], 1), [(4, 6, 5), (4, 0, 5)]),
    "stack": (lambda x, y: torch.stack([x, y]), [(4, 6), (4, 6)]),
    "stack_neg_dim": (lambda x, y: torch.stack([x, y, x], -1), [(4, 6), (4, 6)]),
    "stack_middle": (lambda x, y: torch.stack([x, y], 1), [(4, 6), (4, 6)]),
    # splits (several outputs)
    "split_gpt2": (lambda x: x.split(4, dim=2), [(2, 8, 12)]),
    "split_uneven": (lambda x: x.split(4, 1), [(4, 6, 5)]),
    "split_with_sizes": (lambda x: x.split([1, 3, 2], -2), [(4, 6, 5)]),
    "chunk": (lambda x: x.chunk(4, 1), [(4, 6, 5)]),
    "unbind": (lambda x: x.unbind(-1), [(4, 6, 3)]),
    "unbind_first": (lambda x: x.unbind(), [(3, 6, 5)]),
    "tensor_split": (lambda x: x.tensor_split([1, 4], 1), [(4, 6, 5)]),
    # slices
    "slice": (lambda x: x[:, 1:4], [(4, 6, 5)]),
    "slice_negative": (lambda x: x[:, -3:-1], [(4, 6, 5)]),
    "slice_end_clamps": (lambda x: x[:, 2:100], [(4, 6, 5)]),
    "slice_start_clamps": (lambda x: x[-100:2], [(4, 6, 5)]),
    "slice_empty": (lambda x: x[:, 4:2], [(4, 6, 5)]),
    "slice_step": (lambda x: x[:, ::2], [(4, 6, 5)]),
    "slice_start_step": (lambda x: x[:, 1::4, 1:5:3], [(4, 6, 5)]),
    "slice_llama_rotate": (lambda x: torch.cat([-x[..., 8:], x[..., :8]], -1), [(2, 4, 8, 16)]),
    "slice_aten_max_end": (lambda x: aten.slice.Tensor(x, 3, 8, 9223372036854775807), [(2, 4, 8, 16)]),
    "slice_aten_none": (lambda x: aten.slice.Tensor(x, 1, None, -2), [(4, 6, 5)]),
    "select": (lambda x: x[:, -1], [(4, 6, 5)]),
    "select_last_dim": (lambda x: x[..., 0], [(4, 6, 5)]),
    "narrow": (lambda x: x.narrow(1, 1, 3), [(4, 6, 5)]),
    "narrow_negative": (lambda x: x.narrow(-1, -3, 2), [(4, 6, 5)]),
    # differences
    "diff": (lambda x: torch.diff(x), [(4, 6)]),
    "diff_n2_dim0": (lambda x: torch.diff(x, n=2, dim=0), [(5, 6)]),
    "diff_prepend_append": (lambda x, p, a: torch.diff(x, dim=1, prepend=p, append=a), [(4, 6), (4, 2), (4, 1)]),
    "diff_n_beyond_length": (lambda x: torch.diff(x, n=5, dim=0), [(3, 4)]),
    "diff_transformers": (lambda p: torch.diff(p, prepend=p[:, :1] - 1, dim=-1), [(2, 8)]),
    # tiling, flips, rolls
    "repeat": (lambda x: x.repeat(2, 1, 3), [(4, 6, 5)]),
    "repeat_more_dims": (lambda x: x.repeat(2, 1, 1, 2), [(4, 6, 5)]),
    "tile_fewer_dims": (lambda x: x.tile(3,), [(2, 4)]),
    "repeat_interleave": (lambda x: x.repeat_interleave(3, dim=1), [(2, 4, 5)]),
    "repeat_interleave_last": (lambda x: x.repeat_interleave(2, dim=-1), [(2, 3)]),
    "repeat_interleave_flat": (lambda x: x.repeat_interleave(2), [(2, 3)]),
    "repeat_interleave_scalar": (lambda x: x.repeat_interleave(4), [()]),
    "flip": (lambda x: x.flip(0, -1), [(4, 6, 5)]),
    "roll": (lambda x: x.roll(2, 1), [(4, 6, 5)]),
    "roll_several": (lambda x: x.roll((1, -2), (0, 2)), [(4, 6, 5)]),
    "roll_beyond_size": (lambda x: x.roll(13, -1), [(4, 6, 5)]),
    "roll_flat": (lambda x: x.roll(-7), [(4, 6, 5)]),
    # triangles
    "tril": (lambda x: x.tril(), [(5, 5)]),
    "tril_diagonal": (lambda x: x.tril(1), [(2, 4, 6)]),
    "triu_negative_diagonal": (lambda x: x.triu(-1), [(2, 6, 4)]),
    "triu_causal_mask": (lambda x: x.triu(1), [(8, 8)]),
}

DTYPE_CASES = ["permute", "expand_new_dims", "cat", "split_uneven", "slice_step", "select", "diff_prepend_append",
               "repeat", "repeat_interleave", "roll_several", "tril_diagonal"]


def _run(name, dtype):
    function, shapes = CASES[name]
    inputs = [make(shape, dtype, -10, 10, seed, normal=True) for seed, shape in enumerate(shapes)]
    assert_matches_eager(function, *inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_float32(name):
    _run(name, torch.float32)


def test_repeat_interleave_with_int_repeats_has_its_own_rule():
    """No decomposition (which would re-trace the whole program): repeats of an int are a broadcast."""
    assert_lowers({torch.ops.aten.repeat_interleave.self_int}, lambda x: x.repeat_interleave(3, dim=1),
                  make((2, 4, 5), normal=True))


def test_broadcast_to_has_its_own_rule():
    """torch.export keeps ``broadcast_to`` (WavLM's attention calls it): lowered as ``expand``, no re-trace."""
    assert_lowers({torch.ops.aten.broadcast_to.default}, lambda x: torch.broadcast_to(x, (2, 4, 3, 5)),
                  make((4, 1, 5), normal=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("name", DTYPE_CASES)
def test_other_dtypes(name, dtype):
    _run(name, dtype)


@pytest.mark.parametrize("dtypes, expected", [
    ((torch.float32, torch.int64), torch.float32),
    ((torch.int32, torch.bool), torch.int32),
    ((torch.float16, torch.bfloat16), torch.float32),
    ((torch.int64, torch.float16), torch.float16),
])
def test_cat_promotes_mixed_dtypes(dtypes, expected):
    x, y = make((2, 3), dtypes[0], -10, 10, 0, normal=True), make((2, 4), dtypes[1], -10, 10, 1, normal=True)
    artifact = assert_matches_eager(lambda a, b: torch.cat([a, b], -1), x, y)
    assert artifact(x, y).dtype == expected


def test_diff_of_bool_is_inequality():
    x = torch.tensor([[True, True, False, True, False, False]])
    assert_matches_eager(lambda x: torch.diff(x), x)


def test_split_outputs_have_torch_shapes():
    x = make((4, 7, 3), normal=True)
    pieces = assert_matches_eager(lambda x: x.split(3, 1), x)(x)
    assert [tuple(p.shape) for p in pieces] == [(4, 3, 3), (4, 3, 3), (4, 1, 3)]


# -- symbolic sizes: the rules emit dynamic ops whose result types keep torch's symbolic dims ----------

DYNAMIC_CASES = {
    "view": lambda x: x.view(-1, 5),
    "expand": lambda x: x[:, :1].expand(-1, 3, -1),
    "slice": lambda x: x[1:, 1:5:2],
    "select_negative": lambda x: x[-1],
    "split": lambda x: x.split([1, x.shape[0] - 1]),
    "unbind": lambda x: x.unbind(1),
    "cat_stack": lambda x: torch.stack([torch.cat([x, x[:1]]), torch.cat([x[:1], x])]),
    "diff": lambda x: torch.diff(x, dim=0, prepend=x[:1]),
    "repeat": lambda x: x.repeat(2, 1, 1),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=0),
    "repeat_interleave_flat": lambda x: x.repeat_interleave(3),
    "roll": lambda x: x.roll(-2, 0),
    "roll_flat": lambda x: x.roll(3),
    "tril": lambda x: x.transpose(0, 2).tril(1),
}


@pytest.mark.parametrize("name", list(DYNAMIC_CASES))
def test_symbolic_batch_lowers_to_dynamic_ops(name):
    assert_lowers_with_symbolic_batch(DYNAMIC_CASES[name], make((4, 6, 5), normal=True))


# -- diagonal, as_strided, resize ----------------------------------------------------------------------------

DIAGONAL_CASES = [  # (input shape, offset, dim1, dim2)
    ((5, 5), 0, 0, 1),
    ((4, 6), 2, 0, 1),
    ((4, 6), -3, 0, 1),
    ((4, 6), 7, 0, 1),  # beyond the matrix: empty
    ((3, 4, 5), 1, 0, 2),
    ((3, 4, 5), -1, 2, 0),
    ((2, 3, 4, 5), 0, -1, 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("shape, offset, dim1, dim2", DIAGONAL_CASES)
def test_diagonal(shape, offset, dim1, dim2, dtype):
    assert_lowers([aten.diagonal.default], lambda x: torch.diagonal(x, offset, dim1, dim2),
                  make(shape, dtype, -10, 10, normal=True))


AS_STRIDED_CASES = [  # (input shape, size, stride, storage_offset)
    ((3, 4), (2, 3), (1, 2), 1),
    ((3, 4), (4, 3), (1, 4), 0),  # a transpose
    ((12,), (3, 3), (3, 1), 2),
    ((2, 3, 4), (4, 2, 2), (4, 1, 8), None),  # overlapping windows
    ((3, 4), (3, 4), (0, 1), 0),  # a broadcast row
    ((2, 5), (), (), 7),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("shape, size, stride, offset", AS_STRIDED_CASES)
def test_as_strided(shape, size, stride, offset, dtype):
    assert_lowers([aten.as_strided.default], lambda x: torch.as_strided(x, size, stride, offset),
                  make(shape, dtype, -10, 10, normal=True))


@pytest.mark.parametrize("shape, dim, size, step", [((3, 4, 5), 2, 2, 1), ((3, 4, 5), -1, 2, 2), ((3, 4, 5), 0, 3, 1),
                                                     ((7,), 0, 3, 2), ((4, 6), 1, 6, 1), ((4, 6), 1, 1, 3), ((), 0, 1, 1)])
def test_unfold(shape, dim, size, step):
    """Windows of ``size`` every ``step``, as one gather (no as_strided decomposition)."""
    assert_lowers([aten.unfold.default], lambda x: x.unfold(dim, size, step) * 1, make(shape, normal=True))


def test_shrinking_resize_functionalises_to_as_strided():
    assert_lowers([aten.as_strided.default], lambda x: x.clone().resize_(2, 5) + 1, make((3, 4), normal=True))


@pytest.mark.parametrize("size", [(4, 4), (2, 3, 5)])
def test_growing_resize_keeps_the_old_elements(size):
    """A growing ``resize_`` functionalises to ``aten.resize``; torch leaves the new elements uninitialised,
    so only the old ones are compared."""
    x = make((3, 4), normal=True)
    function = FunctionModule(lambda x: x.clone().resize_(*size) * 2)
    artifact = export_to_stablehlo(function, (x,))
    assert_named_in_locations([aten.resize.default], artifact.stablehlo_text)
    torch.testing.assert_close(artifact(x).flatten()[:12], function(x).flatten()[:12])


@pytest.mark.parametrize("function", [
    lambda x: torch.diagonal(x, 1, 1, 2),
    lambda x: torch.as_strided(x[:2], (2, 6), (1, 2), 3),
])
def test_views_with_symbolic_batch(function):
    assert_lowers_with_symbolic_batch(function, make((4, 6, 5), normal=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_tensor_split_at_tensor_indices_reads_a_storage_offset(dtype):
    """Splitting at a tensor of indices slices at data-dependent offsets: the graph asks each piece's storage
    offset (``aten.sym_storage_offset``, 0 here: values are not views). The OpInfo sample reaches the size queries
    through this test, not through the tensor_split entry (``tools.coverage.SIZE_QUERIES``)."""
    def split(x, indices):
        return torch.tensor_split(x, indices, dim=1)

    x, indices = (torch.randn(3, 7) * 4).to(dtype), torch.tensor([2, 5])
    program = torch.export.export(FunctionModule(split), (x, indices))
    assert torch.ops.aten.sym_storage_offset.default in {node.target for node in program.graph.nodes}
    assert_matches_eager(split, x, indices)
