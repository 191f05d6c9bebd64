"""Indexing ops against eager torch: advanced indexing, embedding, index_select, gather, scatter*, index_put, masks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torch_stablehlo.aten_lowerings.shape.indexing import index as index_rule
from tests.support import assert_lowers_with_symbolic_batch, assert_matches_eager, make

aten = torch.ops.aten

I = torch.tensor([0, 2, -1])         # noqa: E741  (int64, with a negative index)
J = torch.tensor([[1, -2], [0, 3]])  # 2-d, broadcasts against I[:2]
UNIQUE = torch.argsort(torch.rand(4, 6, 5, generator=torch.Generator().manual_seed(0)), dim=1)[:, :3]  # no repeats
REPEATS = torch.randint(0, 6, (3, 2, 4), generator=torch.Generator().manual_seed(1))  # smaller than x, with repeats


def data(shape, seed=1):
    """An input in the case's data dtype."""
    return lambda dtype: make(shape, dtype, -10, 10, seed, normal=True)


def mask(shape):
    return lambda dtype: make(shape, torch.bool, seed=2)


def on_x(*rest, shape=(4, 6, 5)):
    """Inputs builder: x of ``shape`` in the data dtype, then ``rest`` (tensors, or builders taking the dtype)."""
    return lambda dtype: [make(shape, dtype, -10, 10, normal=True)] + [r(dtype) if callable(r) else r for r in rest]


def _assign(x, key, value):
    y = x.clone()
    y[key] = value
    return y


# name -> (function, inputs builder taking the data dtype)
CASES = {
    # index.Tensor
    "index_first": (lambda x, i: x[i], on_x(I)),
    "index_second_int32": (lambda x, i: x[:, i], on_x(I.int())),
    "index_2d_index": (lambda x, j: x[j], on_x(J)),
    "index_broadcast_pair": (lambda x, i, j: x[i[:2], j], on_x(I, J)),
    "index_adjacent_middle": (lambda x, i, j: x[:, j, i[:2]], on_x(I, J)),
    "index_non_adjacent_to_front": (lambda x, i: x[i, :, i], on_x(I)),
    "index_non_adjacent_broadcast": (lambda x, i, j: x[j, :, i[:2]], on_x(I, J)),
    "index_none_then_index": (lambda x, i: x[:, None, i], on_x(I)),
    "index_aten_none_entry": (lambda x, i: aten.index.Tensor(x, [None, None, i]), on_x(I)),
    "index_mask_pattern_q": (lambda x, b, q: x[b[:, None, None, None], q[None, None, :, None]],
                             on_x(torch.arange(2), torch.arange(8), shape=(2, 8))),
    "index_mask_pattern_kv": (lambda x, b, k: x[b[:, None, None, None], k[None, None, None, :]],
                              on_x(torch.arange(2), torch.arange(8), shape=(2, 8))),
    # index_select / embedding
    "index_select": (lambda x, i: x.index_select(1, i.abs()), on_x(I)),
    "index_select_neg_dim_int32": (lambda x, i: x.index_select(-1, i), on_x(I.abs().int())),
    "index_select_0d_index": (lambda x, i: x.index_select(0, i), on_x(torch.tensor(2))),
    "embedding": (lambda w, ids: torch.nn.functional.embedding(ids, w), on_x(J.abs(), shape=(10, 4))),
    "embedding_padding_idx": (lambda w, ids: torch.nn.functional.embedding(ids, w, padding_idx=0),
                              on_x(torch.tensor([[0, 3, 9], [9, 0, 1]]), shape=(10, 4))),
    "embedding_gpt2_view": (lambda w, ids: torch.nn.functional.embedding(ids.view(-1, 4), w),
                            on_x(torch.randint(0, 10, (2, 4)), shape=(10, 4))),
    # gather / scatter along a dim
    "gather": (lambda x, g: x.gather(1, g), on_x(UNIQUE)),
    "gather_smaller_index": (lambda x, g: x.gather(-2, g), on_x(REPEATS)),
    "scatter_src": (lambda x, g, s: x.scatter(1, g, s), on_x(UNIQUE, data((4, 6, 5)))),
    "scatter_value": (lambda x, g: x.scatter(1, g, 3), on_x(UNIQUE)),
    "scatter_add": (lambda x, g, s: x.scatter_add(1, g, s), on_x(REPEATS, data((4, 6, 5)))),
    # index_put and friends
    "index_put": (lambda x, i, v: x.index_put((i,), v), on_x(I, data((3, 6, 5)))),
    "index_put_broadcast_value": (lambda x, i, v: x.index_put((i, i), v), on_x(I, data(()))),
    "index_put_with_none": (lambda x, i, j, v: aten.index_put.default(x, [None, j, i[:2]], v), on_x(I, J, data((2,)))),
    "index_put_accumulate": (lambda x, i, v: x.index_put((i,), v, accumulate=True),
                             on_x(torch.tensor([1, 1, -1, 3]), data((4, 6, 5)))),
    "index_copy": (lambda x, i, s: x.index_copy(1, i, s), on_x(torch.tensor([4, 0, 2]), data((4, 3, 5)))),
    "setitem_index": (lambda x, i, v: _assign(x, (slice(None), i), v), on_x(I, data(()))),
    # select_scatter / slice_scatter (what export makes of slice and select assignments)
    "select_scatter": (lambda x, s: aten.select_scatter(x, s, 1, -2), on_x(data((4, 5)))),
    "slice_scatter": (lambda x, s: aten.slice_scatter(x, s, 1, 1, 4), on_x(data((4, 3, 5)))),
    "slice_scatter_step": (lambda x, s: aten.slice_scatter(x, s, 1, 1, None, 2), on_x(data((4, 3, 5)))),
    "slice_scatter_negative": (lambda x, s: aten.slice_scatter(x, s, -1, -3, 100), on_x(data((4, 6, 3)))),
    "setitem_slice": (lambda x, v: _assign(x, (slice(None), slice(1, 3)), v), on_x(data((4, 2, 5)))),
    "setitem_select": (lambda x, v: _assign(x, (slice(None), -1), v), on_x(data(()))),
    # masks
    "masked_fill_scalar": (lambda x, m: x.masked_fill(m, 1), on_x(mask((6, 5)))),
    "masked_fill_tensor": (lambda x, m, v: x.masked_fill(m, v), on_x(mask((4, 1, 5)), data(()))),
}

DTYPE_CASES = ["index_first", "index_non_adjacent_broadcast", "embedding", "gather_smaller_index", "scatter_add",
               "index_put_accumulate", "slice_scatter_step", "masked_fill_tensor"]


@pytest.mark.parametrize("name", list(CASES))
def test_float32(name):
    function, inputs = CASES[name]
    assert_matches_eager(function, *inputs(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("name", DTYPE_CASES)
def test_other_dtypes(name, dtype):
    function, inputs = CASES[name]
    assert_matches_eager(function, *inputs(dtype))


def test_negative_indices_wrap():
    x = make((5, 3), normal=True)
    artifact = assert_matches_eager(lambda x, i: x[i], x, torch.tensor([-1, -5, 4]))
    torch.testing.assert_close(artifact(x, torch.tensor([-2, 0, -3])), x[[3, 0, 2]])


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x, src = make((4, 6, 5), normal=True), make((4, 6, 5), seed=1, normal=True)
    assert_matches_eager(lambda x, g, s: x.scatter_reduce(1, g, s, reduce, include_self=include_self), x, REPEATS, src)


@pytest.mark.parametrize("reduce", ["sum", "amax", "mean"])
def test_scatter_reduce_int64(reduce):
    """Integer ``mean`` rounds down (-4 / 3 is -2), as torch does."""
    x = torch.tensor([[0, 0, 5]])
    index, src = torch.tensor([[0, 0, 1, 1]]), torch.tensor([[-1, -3, 1, 3]])
    assert_matches_eager(lambda x, g, s: x.scatter_reduce(1, g, s, reduce, include_self=False), x, index, src)
    assert_matches_eager(lambda x, g, s: x.scatter_reduce(1, g, s, reduce),
                         make((4, 6, 5), torch.int64, -10, 10), REPEATS, make((4, 6, 5), torch.int64, -10, 10, seed=1))


def test_index_add_with_alpha():
    x, source = make((4, 6, 5), normal=True), make((4, 3, 5), seed=1, normal=True)
    assert_matches_eager(lambda x, i, s: x.index_add(1, i, s, alpha=2), x, torch.tensor([1, 1, 5]), source)


def test_accumulating_setitem():
    def add_at(x, i, v):
        y = x.clone()
        y[:, i] += v
        return y

    assert_matches_eager(add_at, make((4, 6, 5), normal=True), torch.tensor([1, 1, 2]), make((), seed=1, normal=True))


def test_boolean_mask_index_past_the_leading_dims_is_not_implemented():
    """A mask over leading dims is padded (tests/conformance/test_unbacked.py); one after a full slice is refused
    by the rule instead of lowering something wrong."""
    mask_node = SimpleNamespace(meta={"val": torch.empty(2, dtype=torch.bool)})
    ctx = SimpleNamespace(node=SimpleNamespace(args=(None, [None, mask_node])), arg_meta=lambda i: torch.empty(3, 2))
    with pytest.raises(NotImplementedError, match="boolean mask"):
        index_rule(ctx, object(), [None, object()])


DYNAMIC_CASES = {
    "index_second": (lambda x, i: x[:, i], I),
    "index_first": (lambda x, i: x[i, :, i], I),
    "gather": (lambda x, i: x.gather(1, (x[:, :3] > 0).long()), I),
    "scatter_add": (lambda x, i: x.scatter_add(1, (x[:, :3] > 0).long(), x), I),
    "index_put": (lambda x, i: aten.index_put(x, [None, i], x[:, :1], True), I),
    "slice_scatter_step": (lambda x, i: aten.slice_scatter(x, x[:, ::2] * 2, 1, 0, None, 2), I),
    "select_scatter": (lambda x, i: aten.select_scatter(x, x[0] * 3, 0, -1), I),
    "masked_fill": (lambda x, i: x.masked_fill(x > 0, 2.0), I),
}


@pytest.mark.parametrize("name", list(DYNAMIC_CASES))
def test_symbolic_batch_lowers_to_dynamic_ops(name):
    function, index = DYNAMIC_CASES[name]
    assert_lowers_with_symbolic_batch(function, make((4, 6, 5), normal=True), index)


def test_embedding_of_symbolic_length_ids():
    """One gather with static slice sizes: the ids' symbolic length is the result's, no size is read."""
    assert_lowers_with_symbolic_batch(lambda ids, w: torch.nn.functional.embedding(ids, w),
                                      torch.randint(0, 10, (4, 3)), make((10, 4), normal=True), reads_size=False)



@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("ids_shape", [(2, 5), ()])
def test_embedding_takes_rows_without_wrapping(ids_shape, ids_dtype):
    """torch's embedding rejects negative ids, so the module is one gather: no compare/select wrapping them
    (index_select and advanced indexing, which take negatives, keep theirs)."""
    embedding = torch.nn.Embedding(10, 4, padding_idx=0)
    text = assert_matches_eager(embedding, make(ids_shape, ids_dtype, 0, 10)).stablehlo_text
    assert "stablehlo.gather" in text
    assert "stablehlo.compare" not in text and "stablehlo.select" not in text

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("mask_shape, source_shape", [((4, 5), (25,)), ((1, 5), (3, 9)), ((4, 5), (7,))])
def test_masked_scatter(mask_shape, source_shape, dtype):
    x, source = make((4, 5), dtype, -10, 10), make(source_shape, dtype, -10, 10, seed=2)
    artifact = assert_matches_eager(lambda x, m, s: x.masked_scatter(m, s), x, make(mask_shape, torch.bool), source)
    assert "aten.masked_scatter.default" in artifact.stablehlo_text


@pytest.mark.parametrize("size, fill_value", [(3, -1), (12, -1), (30, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_nonzero_static(dtype, size, fill_value):
    x = make((4, 5), dtype, -1, 2, seed=3)
    assert_matches_eager(lambda x: torch.nonzero_static(x, size=size, fill_value=fill_value), x)


# -- 0-d operands, boolean-mask index_put, index_reduce ------------------------------------------

def test_one_dim_writes_on_0d_tensors():
    """torch treats a 0-d tensor as 1-d and a 0-d index as one element."""
    x, source, index = make((), torch.float32), make((), torch.float32, seed=1), torch.tensor([0])
    assert_matches_eager(lambda x, i, s, y: (x.index_add(0, i, s, alpha=2), x.index_copy(0, i, s),
                                             x.index_select(0, i), y.index_select(1, i[0])),
                         x, index, source, make((4, 3)))


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_boolean_mask(accumulate):
    mask = torch.tensor([True, False, True, False, True])
    assert_matches_eager(lambda x, m, v: x.index_put((m,), v, accumulate=accumulate),
                         make((5, 4)), mask, make((4,), seed=1))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_index_reduce(reduce, dtype):
    x, source, index = make((5, 3), dtype), make((4, 3), dtype, seed=1), torch.tensor([0, 2, 0, 4])
    assert_matches_eager(lambda x, i, s: (x.index_reduce(0, i, s, reduce),
                                          x.index_reduce(0, i, s, reduce, include_self=False)),
                         x, index, source)


def test_arange_indices_are_not_wrapped():
    """Indices made by arange (through a widening cast, a sum, a broadcast) are known non-negative: no compare
    and select wraps them; an arange shifted below zero still wraps, as torch does."""
    plain = assert_matches_eager(lambda x: x[torch.arange(3, dtype=torch.int32) + 1, torch.arange(4)[:, None]],
                                 make((5, 6)))
    assert "stablehlo.compare" not in plain.stablehlo_text
    shifted = assert_matches_eager(lambda x: x[torch.arange(3) - 1], make((5, 6)))
    assert "stablehlo.compare" in shifted.stablehlo_text


def _range_writes(x, start, values, one):
    """Writes at consecutive positions (arange plus a number, one element) and at scattered ones."""
    positions = torch.arange(3) + start[0]
    return (x.index_copy(1, positions, values), aten.index_put(x, [None, positions], values),
            x.index_copy(2, start, one), x.index_put((start,), values[0, 0]),
            x.index_copy(1, torch.tensor([4, 0, 2]), values))


@pytest.mark.parametrize("start", [0, 2, 3])
def test_writes_at_a_range_are_dynamic_update_slices(start):
    """A range of positions (a KV cache's ``arange(n) + cumulative_length``) or one position is written with
    ``dynamic_update_slice``; scattered positions, and an index_put range whose start may be negative (torch
    wraps each position on its own), with ``scatter``. A range that would not fit is dropped, never clamped:
    start 4 is out of range for 3 positions in 6 (torch raises there)."""
    x, values, one = make((4, 6, 5)), make((4, 3, 5), seed=1), make((4, 6, 1), seed=2)
    artifact = assert_matches_eager(_range_writes, x, torch.tensor([start]), values, one)
    text = artifact.stablehlo_text
    assert text.count("stablehlo.dynamic_update_slice") == 3 and text.count('"stablehlo.scatter"(') == 2, text
    kept = artifact(x, torch.tensor([4]), values, one)[0]
    torch.testing.assert_close(kept, x)
