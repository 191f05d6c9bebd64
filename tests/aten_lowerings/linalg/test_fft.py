"""Fourier transforms against eager torch: rfft/irfft/fft/ifft and their n-d forms, norms, dims, Hermitian
inverses (ihfft*), a symbolic batch; complex views, polar, conj_physical, complex32."""
from __future__ import annotations

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.errors import LoweringError
from tests.support import FunctionModule, assert_lowers, assert_matches_eager, export_with_symbolic_batch, make

aten = torch.ops.aten
FLOAT_AND_COMPLEX = [(torch.float32, torch.complex64), (torch.float64, torch.complex128)]


def complex_input(shape, dtype=torch.complex64):
    return torch.complex(make(shape, torch.float64, normal=True),
                         make(shape, torch.float64, seed=1, normal=True)).to(dtype)


@pytest.mark.parametrize("dtypes", FLOAT_AND_COMPLEX)
@pytest.mark.parametrize("dim, norm", [(-1, None), (0, "forward"), (1, "ortho")])
def test_rfft_irfft(dim, norm, dtypes):
    real, complex_ = dtypes
    x, spectrum = make((6, 8, 5), real, normal=True), complex_input((6, 8, 5), complex_)
    assert_lowers({aten._fft_r2c.default}, lambda x: torch.fft.rfft(x, dim=dim, norm=norm), x)
    assert_lowers({aten._fft_c2r.default}, lambda x: torch.fft.irfft(x, dim=dim, norm=norm), spectrum)
    assert_matches_eager(lambda x: torch.fft.irfft(x, n=7, dim=dim, norm=norm), spectrum)


@pytest.mark.parametrize("dtypes, norm", [(FLOAT_AND_COMPLEX[0], None), (FLOAT_AND_COMPLEX[0], "forward"),
                                          (FLOAT_AND_COMPLEX[1], "ortho")])
def test_fft_ifft(norm, dtypes):
    real, complex_ = dtypes
    x = complex_input((4, 6), complex_)
    assert_lowers({aten._fft_c2c.default}, lambda x: torch.fft.fft(x, norm=norm), x)
    assert_matches_eager(lambda x: torch.fft.ifft(x, dim=0, norm=norm), x)
    assert_matches_eager(lambda x: torch.fft.fft(x, norm=norm), make((4, 6), real, normal=True))  # full r2c


@pytest.mark.parametrize("dims, norm", [((0, 1), None), ((-1, 0), "ortho"), ((0, 1, 2), "forward")])
def test_n_dimensional(dims, norm):
    x, spectrum = make((4, 6, 5), normal=True), complex_input((4, 6, 5))
    assert_matches_eager(lambda x: torch.fft.rfftn(x, dim=dims, norm=norm), x)
    assert_matches_eager(lambda x: torch.fft.irfftn(x, dim=dims, norm=norm), spectrum)
    assert_matches_eager(lambda x: torch.fft.fftn(x, dim=dims, norm=norm), spectrum)
    assert_matches_eager(lambda x: torch.fft.ifftn(x, dim=dims, norm=norm), spectrum)


def test_padded_and_cropped_lengths():
    x = make((4, 6), normal=True)
    assert_matches_eager(lambda x: torch.fft.rfft(x, n=9), x)
    assert_matches_eager(lambda x: torch.fft.rfft(x, n=4), x)
    assert_matches_eager(lambda x: torch.fft.fft2(x, s=(3, 3)), x)  # cropped only: padding a complex tensor
    # (constant_pad_nd with a complex zero) is not lowered yet


def test_complex_views():
    """What export makes of ``.real``, ``.imag`` and ``view_as_real`` on a spectrum, and of view_as_complex."""
    x = make((4, 8), normal=True)
    assert_lowers({aten.view_as_real.default}, lambda x: torch.view_as_real(torch.fft.rfft(x)), x)
    assert_matches_eager(lambda x: (torch.fft.rfft(x).real, torch.fft.rfft(x).imag), x)
    assert_lowers({aten.view_as_complex.default},
                  lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(4, 4, 2)) ** 2), x)
    assert_matches_eager(lambda x: torch.fft.irfft(torch.fft.rfft(x) * torch.fft.rfft(x)), x)


def test_zero_padded_transform_and_complex_scalar_arithmetic():
    """Padding a complex tensor and scaling it need complex constants."""
    assert_matches_eager(lambda x: torch.fft.fft2(x, s=(6, 6)) * 2 + 1, make((3, 4, 4)))


def test_complex_from_broadcast_parts():
    assert_lowers([torch.ops.aten.complex.default],
                  lambda re, im: torch.view_as_real(torch.complex(re, im)), make((3, 4)), make((4,), seed=1))


@pytest.mark.parametrize("function", [torch.fft.ihfft2, torch.fft.ihfftn])
def test_hermitian_inverse_transforms(function):
    """ihfft* conjugate a real-to-complex transform: export emits ``_conj_physical``."""
    assert_lowers({aten._conj_physical.default}, lambda x: torch.view_as_real(function(x)), make((3, 4, 6)))


def test_conj_physical_of_complex_and_real():
    assert_matches_eager(lambda x: (torch.view_as_real(torch.conj_physical(torch.fft.fft(x))),
                                    torch.conj_physical(x)), make((3, 4)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polar(dtype):
    magnitude, angle = make((3, 4), dtype, low=0, high=2), make((4,), dtype, seed=1)
    assert_lowers({aten.polar.default}, lambda r, a: torch.view_as_real(torch.polar(r, a)), magnitude, angle)


COMPLEX32 = {"complex": lambda x: torch.complex(x, 2 * x), "view_as_complex": torch.view_as_complex,
             "chalf": lambda x: x.chalf()}  # (eager has no float16 polar)


@pytest.mark.parametrize("name", sorted(COMPLEX32))
def test_complex32_is_carried_as_complex64(name):
    """StableHLO has no complex type with float16 parts: complex32 travels as complex64 whose parts are rounded
    to float16 values, and comes back to torch as complex32."""
    x = make((3, 2), torch.float16)
    artifact = assert_matches_eager(COMPLEX32[name], x)
    assert artifact(x).dtype == torch.complex32
    assert_matches_eager(lambda x: torch.view_as_real(COMPLEX32[name](x) * 3).float(), x)  # rounded after each op


def test_symbolic_batch_of_a_transform_over_other_dims():
    """Only the transformed dims need static sizes."""
    x = make((5, 4, 6))
    program = export_with_symbolic_batch(lambda x: torch.view_as_real(torch.fft.ihfft2(x)), x)
    artifact = export_to_stablehlo(program)
    for batch in (3, 7):
        x = make((batch, 4, 6), seed=batch)
        torch.testing.assert_close(artifact(x), torch.view_as_real(torch.fft.ihfft2(x)))
