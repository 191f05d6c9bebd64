"""elementwise/bessel.py against eager torch: J0, J1, Y0, Y1, K0, K1 (plain and scaled) and Airy Ai over the real line."""
from __future__ import annotations

import pytest
import scipy.special
import torch

from tests.support import INTS, assert_lowers, assert_matches_eager, make

aten = torch.ops.aten

OPS = {
    "bessel_j0": (aten.special_bessel_j0.default, scipy.special.j0),
    "bessel_j1": (aten.special_bessel_j1.default, scipy.special.j1),
    "bessel_y0": (aten.special_bessel_y0.default, scipy.special.y0),
    "bessel_y1": (aten.special_bessel_y1.default, scipy.special.y1),
    "modified_bessel_k0": (aten.special_modified_bessel_k0.default, scipy.special.k0),
    "modified_bessel_k1": (aten.special_modified_bessel_k1.default, scipy.special.k1),
    "scaled_modified_bessel_k0": (aten.special_scaled_modified_bessel_k0.default, scipy.special.k0e),
    "scaled_modified_bessel_k1": (aten.special_scaled_modified_bessel_k1.default, scipy.special.k1e),
    "airy_ai": (aten.special_airy_ai.default, lambda x: scipy.special.airy(x)[0]),
}
# Where torch's float64 kernels are themselves off: their rational approximations switch at x = 5 for J and Y
# (errors up to 8e-7 there) and at x = -2.09 for Ai (up to 3e-6); we are within 1e-10 of the exact values
# (test_float64_is_exact), so float64 is compared with eager to these looser tolerances.
FLOAT64_VS_EAGER = {"atol": 5e-6, "rtol": 1e-6}
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e-8, 2.0, -2.0, 14.0, -7.0, 1e3, -1e3, 1e30, -1e30,
           float("inf"), float("-inf"), float("nan")]


def inputs(dtype):
    return torch.cat([torch.linspace(-50, 50, 1001, dtype=torch.float64), torch.tensor(SPECIAL, dtype=torch.float64),
                      -torch.logspace(3, 10, 30, dtype=torch.float64), torch.logspace(3, 10, 30, dtype=torch.float64)]
                     ).to(dtype)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_eager(name, dtype):
    op, _ = OPS[name]
    tolerances = FLOAT64_VS_EAGER if dtype == torch.float64 else {}
    assert_lowers({op}, getattr(torch.special, name), inputs(dtype), **tolerances)


@pytest.mark.parametrize("name", OPS)
def test_float64_is_exact(name):
    """Away from torch's inaccuracies, float64 results agree with scipy's to default tolerances."""
    x = torch.cat([torch.linspace(-50, 50, 1001, dtype=torch.float64), torch.tensor([1e-8, 2.0, 7.0, 14.0, 1e3])])
    actual = assert_matches_eager(getattr(torch.special, name), x, **FLOAT64_VS_EAGER)(x)
    expected = torch.from_numpy(OPS[name][1](x.numpy()))  # NaN for Y and K at x < 0, as torch
    torch.testing.assert_close(actual, expected, atol=1e-10, rtol=1e-10, equal_nan=True)


@pytest.mark.parametrize("dtype", INTS + [torch.bool], ids=str)
def test_integers_promote_to_float32(dtype):
    x = make((4, 5), dtype, -20, 20)
    assert_lowers({op for op, _ in OPS.values()},
                  lambda x: [getattr(torch.special, name)(x) for name in OPS], x)


def test_broadcast_and_symbolic_batch():
    x = make((6, 3), torch.float32, -30, 30)
    batch = torch.export.Dim("batch", min=2, max=64)
    assert_matches_eager(lambda x: torch.special.bessel_y1(x) + torch.special.airy_ai(x), x,
                         dynamic_shapes=(({0: batch},),))
