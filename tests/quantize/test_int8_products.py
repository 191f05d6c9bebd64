"""``stablehlo_ir.int8_products``: the module XLA compiles holds int8 products in the forms XLA's CPU backend runs
fast, with the numbers of the forms they replace (int8 x int8 exact, a float row within float32 rounding)."""
import numpy as np

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
