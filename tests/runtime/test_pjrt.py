"""PJRT runtime: every dtype crosses intact, JAX's global config is left alone, one compile per module."""
import jax
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import pjrt

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


class PassAndCompare(torch.nn.Module):
    def forward(self, x, y):
        return x, x == y


def _sample(dtype):
    generator = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(3, 5, generator=generator) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(3, 5, generator=generator) * 1e3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (3, 5), generator=generator, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_round_trip_is_exact(dtype):
    x = _sample(dtype)
    y = x.clone()
    y[0] = x[1]
    passed, equal = export_to_stablehlo(PassAndCompare(), (x, y))(x, y)
    assert passed.dtype == dtype and torch.equal(passed, x)
    assert torch.equal(equal, x == y)


def test_64_bit_values_survive_without_touching_global_x64():
    before = jax.config.jax_enable_x64
    x = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    passed, _ = export_to_stablehlo(PassAndCompare(), (x, x))(x, x)
    assert torch.equal(passed, x)
    assert jax.config.jax_enable_x64 == before


def test_same_module_compiles_once():
    x = torch.randn(2, 3)
    first = export_to_stablehlo(PassAndCompare(), (x, x))
    first(x, x)
    count = pjrt.compiled_count()
    second = export_to_stablehlo(PassAndCompare(), (x, x))
    second(x, x)
    second(x, x)
    assert second.stablehlo_text == first.stablehlo_text
    assert pjrt.compiled_count() == count


def test_unknown_platform_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no PJRT client for platform 'nonesuch'"):
        pjrt.client("nonesuch")
