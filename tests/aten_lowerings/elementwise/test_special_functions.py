"""elementwise/special_functions.py against eager torch: polygamma and Hurwitz zeta (torch's algorithm, negative
arguments included), and the functions borrowed from JAX through emit.jax_functions.call_jax (static and dynamic
dims)."""
from __future__ import annotations

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FLOATS, assert_lowers, assert_matches_eager, export_with_symbolic_batch, make

aten = torch.ops.aten

# Away from the poles at 0, -1, -2, ... (where both torch and we give huge values of no meaning).
NEGATIVE_AND_POSITIVE = torch.tensor([-8.4784, -7.9506, -3.0337, -0.3, 1e-3, 0.5, 1.0, 3.0, 12.5, 40.0])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
def test_polygamma(n):
    assert_lowers({aten.polygamma.default}, lambda x: torch.polygamma(n, x), NEGATIVE_AND_POSITIVE)


def test_digamma_poles():
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, 1.0, 2.5, -2.5, 1e-8, 30.0])  # -inf, +inf, NaN, NaN like torch
    assert_lowers({aten.digamma.default}, torch.digamma, x)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_polygamma_low_precision(dtype):
    assert_matches_eager(lambda x: torch.special.polygamma(2, x), make((4, 5), dtype, 0.1, 9.0))


def test_zeta():
    s = torch.tensor([2.0, 3.0, 4.5, 1.0, 0.5, 2.0, 2.5, 3.0])
    q = torch.tensor([1.0, 0.5, 7.0, 2.0, 2.0, -2.0, -1.5, -1.5])  # poles, s = 1, s < 1, fractional s with q < 0
    assert_lowers({aten.special_zeta.default}, torch.special.zeta, s, q)
    assert_lowers({aten.special_zeta.other_scalar}, lambda x: torch.special.zeta(x, 2.0), make((3, 4), low=1.5, high=6))


JAX_UNARY = {
    "i0": (aten.i0.default, torch.i0),
    "i0e": (aten.special_i0e.default, torch.special.i0e),
    "i1": (aten.special_i1.default, torch.special.i1),
    "i1e": (aten.special_i1e.default, torch.special.i1e),
    "ndtri": (aten.special_ndtri.default, torch.special.ndtri),
    "log_ndtr": (aten.special_log_ndtr.default, torch.special.log_ndtr),
    "erfcx": (aten.special_erfcx.default, torch.special.erfcx),
    "spherical_bessel_j0": (aten.special_spherical_bessel_j0.default, torch.special.spherical_bessel_j0),
}


@pytest.mark.parametrize("name", sorted(JAX_UNARY))
def test_unary(name):
    op, function = JAX_UNARY[name]
    x = make((4, 6), low=-9, high=9) if name != "ndtri" else make((4, 6), low=0, high=1)
    assert_lowers({op}, function, x)
    assert_matches_eager(function, torch.zeros(0, 3))  # JAX's module keeps an argument it does not read
    assert_matches_eager(function, make((3, 2), torch.int64, -4, 4))


def test_incomplete_gamma():
    a, x = make((3, 5), low=0.1, high=6), make((3, 5), low=0, high=8, seed=1)
    assert_lowers({aten.igamma.default}, torch.igamma, a, x)
    assert_lowers({aten.igammac.default}, torch.igammac, a, x)


def test_jax_function_with_a_dynamic_dim_runs_at_several_sizes():
    artifact = export_to_stablehlo(export_with_symbolic_batch(
        lambda x, y: torch.special.i0e(x) + torch.igamma(x.abs() + 0.1, y), make((4, 3)), make((3,), low=0, seed=1)))
    y = make((3,), low=0, seed=1)
    for batch in (3, 7):
        x = make((batch, 3), seed=batch)
        torch.testing.assert_close(artifact(x, y), torch.special.i0e(x) + torch.igamma(x.abs() + 0.1, y))


def test_calls_with_different_symbolic_sizes_get_their_own_copy():
    """Shape refinement specialises each function once: x and x[1:] have the same ``?`` types, other sizes."""
    function = lambda x: torch.special.i0e(x).sum() + torch.special.i0e(x[1:]).sum()  # noqa: E731
    artifact = export_to_stablehlo(export_with_symbolic_batch(function, make((5, 3))))
    assert artifact.stablehlo_text.count("func.func private @jax_i0e") == 2
    for batch in (3, 6):
        x = make((batch, 3), seed=batch)
        torch.testing.assert_close(artifact(x), function(x))


def test_one_private_function_per_jax_function_and_type():
    text = assert_matches_eager(lambda x, y: torch.special.i0e(x) * torch.special.i0e(y) + torch.special.i0e(x[0]),
                                make((2, 3)), make((2, 3), seed=1)).stablehlo_text
    assert text.count("func.func private @jax_i0e") == 2  # (2, 3) and (3,)
