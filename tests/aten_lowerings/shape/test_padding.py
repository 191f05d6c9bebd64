"""Padding against eager torch: constant (negative pads crop), reflection, replication and circular padding."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FLOATS, INTS, FunctionModule, assert_lowers, assert_lowers_with_symbolic_batch, make

aten = torch.ops.aten

# F.pad exports as aten.pad, lowered by its own rule in every mode (no decomposition, no re-trace).
CONSTANT_CASES = [  # (input shape, pad, value)
    ((4, 6), (1, 2), 0.0),
    ((2, 3, 5, 6), (1, 2, 0, 3), 1.5),
    ((2, 3, 5, 6), (-1, 2, 3, -2), -2.0),  # negative pads crop
    ((2, 3, 4, 5), (1, 1, 1, 1, 1, 1), 0.0),  # pads three dims
    ((3, 4), (0, 0, 2, 0), 7.0),
]


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
@pytest.mark.parametrize("shape, pad, value", CONSTANT_CASES)
def test_constant_pad(shape, pad, value, dtype):
    value = bool(value) if dtype == torch.bool else value
    assert_lowers([aten.pad.default], lambda x: F.pad(x, pad, value=value),
                  make(shape, dtype, -10, 10, normal=True))


EDGE_CASES = [  # (n, input shape, pad)
    (1, (2, 3, 6), (2, 3)),
    (1, (3, 6), (1, 0)),  # unbatched
    (1, (2, 3, 6), (-2, 3)),  # the high piece still mirrors the uncropped end
    (2, (2, 3, 5, 6), (1, 2, 3, 4)),
    (2, (2, 3, 5, 6), (0, 5, 4, -1)),
    (3, (1, 2, 4, 5, 6), (1, 2, 3, 0, 2, 1)),
    (3, (2, 4, 5, 6), (2, 1, -1, 3, 3, 2)),  # unbatched
]
MODES = ["reflect", "replicate", "circular"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n, shape, pad", EDGE_CASES)
def test_edge_pad(n, shape, pad, mode):
    assert_lowers([aten.pad.default], lambda x: F.pad(x, pad, mode=mode), make(shape, normal=True))


@pytest.mark.parametrize("dtype", FLOATS[1:] + INTS)
@pytest.mark.parametrize("mode", MODES)
def test_edge_pad_dtypes(mode, dtype):
    assert_lowers([aten.pad.default], lambda x: F.pad(x, (2, 1, 1, 3), mode=mode), make((2, 3, 5, 6), dtype, -10, 10))


@pytest.mark.parametrize("op, shape, pad", [
    (aten.reflection_pad1d.default, (2, 3, 6), [3, 1]),
    (aten.replication_pad2d.default, (2, 3, 5, 6), [0, 2, 3, 1]),
    (aten.reflection_pad3d.default, (2, 3, 4, 5, 6), [1, 1, 0, 2, 1, 0]),
    (aten.replication_pad3d.default, (2, 3, 4, 5, 6), [2, 0, 1, 1, 0, 3]),
    (aten._pad_circular.default, (2, 3, 5, 6), [1, 2, -1, 3]),
    (aten.constant_pad_nd.default, (2, 3, 4), [1, -1, 0, 2, 1, 1]),
])
def test_aten_ops_directly(op, shape, pad):
    assert_lowers([op], lambda x: op(x, pad), make(shape, normal=True))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_symbolic_batch(mode):
    assert_lowers_with_symbolic_batch(lambda x: F.pad(x, (1, 2, 2, 1), mode=mode), make((4, 3, 5, 6)),
                                      reads_size=mode != "constant")


def test_pad_by_a_symbolic_amount():
    """Mamba2 pads the sequence to whole chunks: the pad is a size expression, computed at run time."""
    def to_chunks(x):
        return F.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4), value=-1.0)

    sequence = torch.export.Dim("sequence", min=2, max=64)
    program = torch.export.export(FunctionModule(to_chunks), (make((2, 8, 3)),),
                                  dynamic_shapes=(({1: sequence},),))
    artifact = export_to_stablehlo(program)
    assert "stablehlo.dynamic_pad" in artifact.stablehlo_text
    for length in (5, 8, 11):
        x = make((2, length, 3), seed=length)
        torch.testing.assert_close(artifact(x), to_chunks(x), rtol=0, atol=0)
