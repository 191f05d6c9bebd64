"""elementwise/polynomials.py against eager torch: Chebyshev T/U/V/W (plain and shifted), Hermite H/He, Laguerre L,
Legendre P, with tensor degrees mixing every case of torch's kernels, and the scalar overloads."""
from __future__ import annotations

import pytest
import torch

from tests.support import assert_lowers_with_symbolic_batch, assert_matches_eager, assert_table_lowers, make

aten = torch.ops.aten

NAMES = [f"chebyshev_polynomial_{kind}" for kind in "tuvw"] + \
        [f"shifted_chebyshev_polynomial_{kind}" for kind in "tuvw"] + \
        ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


def ops(overload: str, wrap=lambda function: function):
    """name: (aten overload, eager function) for every polynomial."""
    return {name: (getattr(getattr(aten, f"special_{name}"), overload), wrap(getattr(torch.special, name)))
            for name in NAMES}


# the ends of [-1, 1] and [0, 1], points inside (closed forms above degree 4-8) and outside (recurrence only)
X = [-1.5, -1.0, -0.7, -0.2, 0.0, 1e-9, 0.3, 0.5, 0.9, 1.0, 1.2, 2.5]
DEGREES = [-2, 0, 1, 2, 3, 5, 6, 7, 9, 12, 20, 30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_mixed_degrees(dtype):
    x = torch.tensor(X, dtype=dtype)
    n = torch.tensor(DEGREES, dtype=dtype)[:, None]  # every degree at every point
    assert_table_lowers(ops("default"), x, n)


def test_random_points_and_fractional_degrees():
    x = make((5, 6), torch.float64, -2.0, 2.0)
    n = make((6,), torch.float64, -3.0, 25.0, seed=1)  # truncated towards zero, as torch casts to int64
    assert_table_lowers(ops("default"), x, n)


def test_integer_operands():
    """Integer degrees (and points) promote to the default float dtype."""
    x = torch.tensor([[-2], [-1], [0], [1], [3]], dtype=torch.int32)
    assert_table_lowers(ops("default"), x, torch.tensor([-1, 0, 1, 4, 8, 10, 17], dtype=torch.int64))
    assert_table_lowers(ops("default"), make((4,), torch.float32), torch.tensor([0, 3, 9, 15], dtype=torch.int64))


def test_degenerate_degrees():
    """NaN, infinite and too-large degrees count as negative; Hermite is NaN above its degree limit."""
    x = torch.tensor([0.5, -0.3, 1.0, 2.0, 0.5, 0.5, 0.5, 1.5])
    n = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, 128, 129, 200, 2.5])
    assert_table_lowers(ops("default"), x, n)
    hermite = {name: ops("default")[name] for name in ("hermite_polynomial_h", "hermite_polynomial_he")}
    assert_table_lowers(hermite, torch.tensor([0.5, 0.1]).double(), torch.tensor([512.0, 513.0]).double())


def test_scalar_overloads():
    n = torch.tensor([-1, 0, 1, 2, 7, 10, 25])
    assert_table_lowers(ops("x_scalar", lambda f: lambda n: f(0.25, n)), n)
    assert_table_lowers(ops("x_scalar", lambda f: lambda n: f(-1.0, n)), n.double())
    x = torch.tensor(X)
    assert_table_lowers(ops("n_scalar", lambda f: lambda x: f(x, 3)), x)
    assert_table_lowers(ops("n_scalar", lambda f: lambda x: f(x, 12.7)), x.double())


def test_symbolic_batch():
    text = assert_lowers_with_symbolic_batch(
        lambda x, n: torch.special.chebyshev_polynomial_u(x, n) + torch.special.legendre_polynomial_p(x, n),
        make((5, 3)), torch.tensor([2.0, 9.0, 15.0]))
    assert "stablehlo.while" in text
    batch = torch.export.Dim("batch", min=2, max=64)
    assert_matches_eager(lambda x, n: torch.special.hermite_polynomial_h(x, n), make((7, 3)),
                         torch.tensor([0.0, 4.0, 11.0]), dynamic_shapes=(({0: batch}, None),))
