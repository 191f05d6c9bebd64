"""``stablehlo_ir.int8_products``: the module XLA compiles holds int8 products in the forms XLA's CPU backend runs
fast, with the numbers of the forms they replace (int8 x int8 exact, a float row within float32 rounding)."""
import numpy as np
import pytest

from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla

FLOAT_ROW = """func.func @main(%x: tensor<2x1x96xf32>, %w: tensor<96x40xi8>) -> tensor<2x1x40xf32> {
  %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<96x40xi8>) -> tensor<40x96xi8>
  %f = stablehlo.convert %t : (tensor<40x96xi8>) -> tensor<40x96xf32>
  %y = stablehlo.dot_general %x, %f, contracting_dims = [2] x [1] : (tensor<2x1x96xf32>, tensor<40x96xf32>) -> tensor<2x1x40xf32>
  return %y : tensor<2x1x40xf32>
}"""
INT8_ROW = """func.func @main(%x: tensor<1x96xi8>, %w: tensor<40x96xi8>) -> tensor<1x40xi32> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<1x96xi8>, tensor<40x96xi8>) -> tensor<1x40xi32>
  return %y : tensor<1x40xi32>
}"""


def _run(text: str, *inputs):
    executable = pjrt.Executable(text)
    (result,) = executable.execute(executable.put(list(inputs)))
    return np.asarray(result)


def test_float_rows_times_int8_weights_are_three_int8_digits():
    """Rows of very different magnitudes (and a row of zeros), the weight read through its transpose: within
    float32 rounding of the float64 product, as an int8 x int8 -> int32 product of 3 x 2 rows."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 1, 96)) * np.array([1e-3, 50.0])[:, None, None]).astype(np.float32)
    x[0, 0, :48] = 0
    w = rng.integers(-127, 128, (96, 40), dtype=np.int8)
    legal = prepare_for_xla(FLOAT_ROW)
    assert "tensor<6x96xi8>, tensor<96x40xi8>) -> tensor<6x40xi32>" in legal, legal
    expected = np.einsum("bik,kn->bin", x.astype(np.float64), w.astype(np.float64))
    bound = 2 ** -22 * np.einsum("bik,kn->bin", np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)))
    assert (np.abs(_run(FLOAT_ROW, x, w) - expected) <= bound).all()
    assert not _run(FLOAT_ROW, np.zeros_like(x), w).any()


def test_one_int8_row_is_padded_to_two():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 96), dtype=np.int8)
    w = rng.integers(-128, 128, (40, 96), dtype=np.int8)
    assert "(tensor<2x96xi8>, tensor<40x96xi8>) -> tensor<2x40xi32>" in prepare_for_xla(INT8_ROW)
    np.testing.assert_array_equal(_run(INT8_ROW, x, w), x.astype(np.int32) @ w.astype(np.int32).T)


def _uint8_rows(rows: int) -> str:
    return f"""func.func @main(%x: tensor<{rows}x96xui8>, %w: tensor<40x96xi8>) -> tensor<{rows}x40xi32> {{
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<{rows}x96xui8>, tensor<40x96xi8>) -> tensor<{rows}x40xi32>
  return %y : tensor<{rows}x40xi32>
}}"""


# torchao's _int_scaled_matmul_cpu on a CPU with VNNI and no AMX: int8 rows shifted into uint8, the product
# corrected by 128 times the weight's column sums (as our lowering of its graph writes it)
TORCHAO_UINT8 = """func.func @main(%s: tensor<ROWSx96xi8>, %w: tensor<40x96xi8>) -> tensor<ROWSx40xi32> {
  %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<40x96xi8>) -> tensor<96x40xi8>
  %wide = stablehlo.convert %s : (tensor<ROWSx96xi8>) -> tensor<ROWSx96xi32>
  %c = stablehlo.constant dense<128> : tensor<i32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<ROWSx96xi32>
  %shifted = stablehlo.add %wide, %cb : tensor<ROWSx96xi32>
  %u = stablehlo.convert %shifted : (tensor<ROWSx96xi32>) -> tensor<ROWSx96xui8>
  %p = stablehlo.dot_general %u, %t, contracting_dims = [1] x [0] : (tensor<ROWSx96xui8>, tensor<96x40xi8>) -> tensor<ROWSx40xi32>
  %tw = stablehlo.convert %t : (tensor<96x40xi8>) -> tensor<96x40xi32>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %sums = stablehlo.reduce(%tw init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<96x40xi32>, tensor<i32>) -> tensor<40xi32>
  %row = stablehlo.reshape %sums : (tensor<40xi32>) -> tensor<1x40xi32>
  %k = stablehlo.constant dense<128> : tensor<i32>
  %kb = stablehlo.broadcast_in_dim %k, dims = [] : (tensor<i32>) -> tensor<1x40xi32>
  %correction = stablehlo.multiply %row, %kb : tensor<1x40xi32>
  %wide_correction = stablehlo.broadcast_in_dim %correction, dims = [0, 1] : (tensor<1x40xi32>) -> tensor<ROWSx40xi32>
  %y = stablehlo.subtract %p, %wide_correction : tensor<ROWSx40xi32>
  return %y : tensor<ROWSx40xi32>
}"""


def _dot_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "stablehlo.dot_general" in line]


@pytest.mark.parametrize("rows", [1, 3])
def test_uint8_rows_are_int8_rows_shifted_back(rows):
    """Any uint8 x int8 product: the int8 x int8 product of the rows less 128 (one row padded to two) plus 128
    times the weight's column sums; exact, at the extremes 0 and 255 too."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (rows, 96), dtype=np.uint8)
    x[0, :2] = [0, 255]
    w = rng.integers(-128, 128, (40, 96), dtype=np.int8)
    text = _uint8_rows(rows)
    legal = _dot_lines(prepare_for_xla(text))
    assert legal and not any("ui8>" in line for line in legal), legal
    assert f"(tensor<{max(rows, 2)}x96xi8>, tensor<40x96xi8>) -> tensor<{max(rows, 2)}x40xi32>" in legal[0], legal
    np.testing.assert_array_equal(_run(text, x, w), x.astype(np.int32) @ w.astype(np.int32).T)


@pytest.mark.parametrize("rows", [1, 4])
def test_torchaos_shifted_rows_lose_shift_and_correction(rows):
    """torchao's uint8 form: the product of its int8 rows themselves, the correction's subtraction gone with the
    uint8 rows (its sums of the weight left unused, for XLA to drop); one row padded to two, the weight then read
    as stored; exact."""
    rng = np.random.default_rng(3)
    s = rng.integers(-128, 128, (rows, 96), dtype=np.int8)
    w = rng.integers(-128, 128, (40, 96), dtype=np.int8)
    text = TORCHAO_UINT8.replace("ROWS", str(rows))
    legal = prepare_for_xla(text)
    dots = _dot_lines(legal)
    operands = "(tensor<2x96xi8>, tensor<40x96xi8>)" if rows == 1 else f"(tensor<{rows}x96xi8>, tensor<96x40xi8>)"
    assert len(dots) == 1 and operands in dots[0], dots
    assert "= stablehlo.subtract" not in legal and "= stablehlo.add" not in legal.split("stablehlo.dot_general")[1]
    np.testing.assert_array_equal(_run(text, s, w), s.astype(np.int32) @ w.astype(np.int32).T)
