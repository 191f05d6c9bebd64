"""Creation and identity-like lowerings against eager torch: arange, full/zeros/ones/empty and their new_*/*_like
forms, dtype casts, identities, eval-mode dropout, fill and copy."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import (FunctionModule, assert_lowers_with_symbolic_batch, assert_matches_eager,
                           assert_named_in_locations, assert_registered_and_exported, assert_table_lowers, make, table)

aten = torch.ops.aten

ARANGES = {
    "end": (aten.arange.default, lambda x: torch.arange(5)),
    "start_end": (aten.arange.start, lambda x: torch.arange(-2, 5)),
    "step": (aten.arange.start_step, lambda x: torch.arange(1, 10, 3)),
    "negative_step": (aten.arange.start_step, lambda x: torch.arange(5, -5, -2)),
    "float_step": (aten.arange.start_step, lambda x: torch.arange(0, 1, 0.1)),
    "float_negative_step": (aten.arange.start_step, lambda x: torch.arange(1.5, -1, -0.25)),
    "float_end": (aten.arange.default, lambda x: torch.arange(4.5)),
    "float16": (aten.arange.start_step, lambda x: torch.arange(0, 6, 0.5, dtype=torch.float16)),
    "bfloat16": (aten.arange.start, lambda x: torch.arange(-3, 3, dtype=torch.bfloat16)),
    "int32": (aten.arange.start_step, lambda x: torch.arange(0, 12, 4, dtype=torch.int32)),
    "float32_of_ints": (aten.arange.default, lambda x: torch.arange(6, dtype=torch.float32)),
}


def test_arange():
    assert_table_lowers(ARANGES, make((2,), torch.float32))


FILLS = {
    "full": (aten.full.default, lambda x: torch.full((2, 3), 1.5)),
    "full_int": (aten.full.default, lambda x: torch.full((2,), 7)),
    "full_bool": (aten.full.default, lambda x: torch.full((2,), True)),
    "full_dtype": (aten.full.default, lambda x: torch.full((3,), 2.5, dtype=torch.bfloat16)),
    "zeros": (aten.zeros.default, lambda x: torch.zeros(2, 3, dtype=torch.int32)),
    "ones": (aten.ones.default, lambda x: torch.ones(3)),
    "new_ones": (aten.new_ones.default, lambda x: x.new_ones(2, 3)),
    "new_zeros": (aten.new_zeros.default, lambda x: x.new_zeros(4)),
    "new_full": (aten.new_full.default, lambda x: x.new_full((2,), 3)),
    "new_full_dtype": (aten.new_full.default, lambda x: x.new_full((2,), 3, dtype=torch.float16)),
    "zeros_like": (aten.zeros_like.default, torch.zeros_like),
    "ones_like": (aten.ones_like.default, lambda x: torch.ones_like(x, dtype=torch.int64)),
    "full_like": (aten.full_like.default, lambda x: torch.full_like(x, 2)),
    "scalar_tensor": (aten.scalar_tensor.default, lambda x: aten.scalar_tensor(2.5)),
    "scalar_tensor_dtype": (aten.scalar_tensor.default, lambda x: aten.scalar_tensor(3, dtype=torch.int32)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_fills(dtype):
    """new_* and *_like take the input's dtype unless told otherwise."""
    assert_table_lowers(FILLS, make((2, 3), dtype))


EMPTIES = {
    "empty": (aten.empty.memory_format, lambda x: torch.empty(2, 3)),
    "empty_int": (aten.empty.memory_format, lambda x: torch.empty(4, dtype=torch.int32)),
    "empty_like": (aten.empty_like.default, torch.empty_like),
    "new_empty": (aten.new_empty.default, lambda x: x.new_empty(3, 2)),
    "empty_strided": (aten.empty_strided.default, lambda x: torch.empty_strided((2, 3), (3, 1))),
    "new_empty_strided": (aten.new_empty_strided.default, lambda x: x.new_empty_strided((2, 2), (2, 1))),
    "empty_permuted": (aten.empty_permuted.default, lambda x: torch.empty_permuted((2, 3, 4), (2, 0, 1))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_empties_have_torch_shapes_and_dtypes(dtype):
    """Eager ``empty`` holds garbage, so only shapes and dtypes are compared (ours are zeros)."""
    x = make((2, 3), dtype)
    artifact = export_to_stablehlo(FunctionModule(table(EMPTIES)), (x,))
    actual, expected = artifact(x), table(EMPTIES)(x)
    assert {k: (v.shape, v.dtype) for k, v in actual.items()} == {k: (v.shape, v.dtype) for k, v in expected.items()}
    assert all(not value.any() for value in actual.values())
    assert_named_in_locations({op for op, _ in EMPTIES.values()}, artifact.stablehlo_text)


CAST_TARGETS = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_casts(source):
    """Floats to ints truncate toward zero, anything to bool tests for nonzero, as in torch."""
    ops = {f"to_{str(target)[6:]}": (aten.to.dtype, lambda x, target=target: x.to(target))
           for target in CAST_TARGETS if target != source}
    ops |= {"to_device": (aten.to.device, lambda x: x.to("cpu", torch.float16)),
            "_to_copy": (aten._to_copy.default, lambda x: aten._to_copy(x, dtype=torch.int32)),
            "type_as": (aten.type_as.default, lambda x: x.type_as(torch.zeros((), dtype=torch.float64)))}
    values = torch.tensor([-2.7, -1.0, -0.5, 0.0, 0.25, 1.5, 3.9, 100.2]).to(source)
    assert_table_lowers(ops, values)
    assert_registered_and_exported({aten._assert_tensor_metadata.default}, table(ops), values)


IDENTITIES = {
    "clone": (aten.clone.default, lambda x: x.clone()),
    "clone_format": (aten.clone.default, lambda x: x.clone(memory_format=torch.contiguous_format)),
    "alias": (aten.alias.default, aten.alias),
    "detach": (aten.detach.default, lambda x: x.detach()),
    "contiguous": (aten.contiguous.default, aten.contiguous),
    "to_same_dtype": (aten.to.dtype, lambda x: x.to(x.dtype, copy=True)),
    "to_same_device": (aten.to.dtype_layout, lambda x: x.to("cpu")),
    "constant": (aten.lift_fresh_copy.default, lambda x: torch.tensor([1.0, 2.0]) * 2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_identities(dtype):
    """These emit no op (values are never aliased or laid out in StableHLO): checked in the graph instead."""
    x = make((3, 4), dtype)
    assert_registered_and_exported({op for op, _ in IDENTITIES.values()}, table(IDENTITIES), x)
    assert_matches_eager(table(IDENTITIES), x)


DROPOUTS = {
    "dropout": (aten.dropout.default, lambda x: F.dropout(x, 0.5, training=False)),
    "module": (aten.dropout.default, nn.Dropout(0.3).eval()),
    "feature_dropout": (aten.feature_dropout.default, nn.Dropout2d(0.2).eval()),
    "alpha_dropout": (aten.alpha_dropout.default, nn.AlphaDropout(0.2).eval()),
    "feature_alpha_dropout": (aten.feature_alpha_dropout.default, nn.FeatureAlphaDropout(0.2).eval()),
    "native_dropout": (aten.native_dropout.default, lambda x: aten.native_dropout(x, 0.5, False)),
}


def test_dropout_in_eval_mode_is_the_identity():
    """native_dropout also returns its mask, all true."""
    x = make((2, 3, 4, 4), torch.float32)
    assert_registered_and_exported({op for op, _ in DROPOUTS.values()}, table(DROPOUTS), x)
    assert_matches_eager(table(DROPOUTS), x)


FILLS_AND_COPIES = {
    "fill_": (aten.fill.Scalar, lambda x, y, s: x.clone().fill_(2.5)),
    "fill_scalar": (aten.fill.Scalar, lambda x, y, s: aten.fill.Scalar(x, -1)),
    "fill_tensor": (aten.fill.Tensor, lambda x, y, s: aten.fill.Tensor(x, s)),
    "copy_": (aten.copy.default, lambda x, y, s: x.clone().copy_(y)),
    "copy": (aten.copy.default, lambda x, y, s: aten.copy(x, y)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_fill_and_copy_broadcast_and_convert(dtype):
    """``copy`` takes self's shape and dtype: ``y`` (int32, one row) is broadcast and converted."""
    assert_table_lowers(FILLS_AND_COPIES, make((3, 4), dtype), make((4,), torch.int32, seed=2),
                        torch.tensor(7, dtype=torch.int32))


SYMBOLIC = {
    "arange": lambda x: torch.arange(x.shape[0]),
    "arange_step": lambda x: torch.arange(1, x.shape[0] + 1, 2),
    "full": lambda x: torch.full((x.shape[0], 2), 2.0),
    "full_of_a_size": lambda x: torch.full((3,), x.shape[0]),
    "new_zeros": lambda x: x.new_zeros(x.shape[0], 2),
    "ones_like": torch.ones_like,
    "empty": lambda x: torch.empty(x.shape[0]).fill_(3),
}


@pytest.mark.parametrize("name", list(SYMBOLIC))
def test_symbolic_sizes_are_read_at_run_time(name):
    assert_lowers_with_symbolic_batch(SYMBOLIC[name], make((4, 3), torch.float32))
