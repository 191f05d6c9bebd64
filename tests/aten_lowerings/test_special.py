"""special.py against eager torch: fmax/fmin, hypot, shifts, copysign/signbit, gcd/lcm, nextafter, frexp, angle."""
from __future__ import annotations

import pytest
import torch

from tests.support import FLOATS, INTS, assert_lowers, assert_table_lowers, make

aten = torch.ops.aten

FLOAT_BINARY = {
    "fmax": (aten.fmax.default, torch.fmax),
    "fmin": (aten.fmin.default, torch.fmin),
    "hypot": (aten.hypot.default, torch.hypot),
    "copysign": (aten.copysign.Tensor, torch.copysign),
    "nextafter": (aten.nextafter.default, torch.nextafter),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_binary(dtype):
    a, b = make((3, 4), dtype), make((4,), dtype, seed=1)
    a[0, 0], b[1], a[1, 2] = float("nan"), float("nan"), 0.0
    assert_table_lowers(FLOAT_BINARY, a, b)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_binary(dtype):
    ops = {"gcd": (aten.gcd.default, torch.gcd), "lcm": (aten.lcm.default, torch.lcm),
           "fmax": (aten.fmax.default, torch.fmax),
           "lshift": (aten.bitwise_left_shift.Tensor, torch.bitwise_left_shift),
           "rshift": (aten.bitwise_right_shift.Tensor, torch.bitwise_right_shift)}
    shifts = torch.tensor([-1, 0, 3, 31, 64, 100], dtype=dtype)  # torch: 0 (left) or sign fill (right) past the width
    assert_table_lowers(ops, make((6,), dtype, -50, 50), shifts)
    assert_table_lowers({"gcd": ops["gcd"], "lcm": ops["lcm"]}, make((4, 5), dtype, -30, 30),
                        make((5,), dtype, -30, 30, seed=1))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary(dtype):
    x = make((3, 4), dtype, -1e3, 1e3)
    x[0, :3] = torch.tensor([0.0, float("nan"), float("inf")])
    assert_lowers({aten.frexp.Tensor, aten.angle.default, aten.signbit.default},
                  lambda x: (*torch.frexp(x), torch.angle(x), torch.signbit(-x)), x)
