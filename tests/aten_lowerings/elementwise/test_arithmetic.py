"""Elementwise lowerings against eager torch: arithmetic, math, comparisons, logic, float classes, where, clamp;
fmax/fmin, hypot, shifts, copysign/signbit, gcd/lcm, nextafter, frexp, angle.

Each case converts one program that applies a table of ops (a dict of results,
so a mismatch names its op) to inputs of one dtype.
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.support import (FLOATS, INTS, FunctionModule, assert_lowers, assert_lowers_with_symbolic_batch,
                           assert_matches_eager, assert_registered_and_exported, assert_table_lowers, make, table)

aten = torch.ops.aten


def nonzero(shape, dtype, seed=1):
    """Divisors: magnitudes in [1, 4) with random signs."""
    magnitude = make(shape, torch.float32, 1, 4, seed)
    return (magnitude * make(shape, torch.float32, -1, 1, seed + 1).sign()).to(dtype)


# -- binary arithmetic ------------------------------------------------------------

BINARY = {
    "add": (aten.add.Tensor, lambda a, b: a + b),
    "add_alpha": (aten.add.Tensor, lambda a, b: torch.add(a, b, alpha=2)),
    "sub_alpha": (aten.sub.Tensor, lambda a, b: torch.sub(a, b, alpha=3)),
    "rsub": (aten.rsub.Tensor, lambda a, b: torch.rsub(a, b)),
    "mul": (aten.mul.Tensor, lambda a, b: a * b),
    "div": (aten.div.Tensor, lambda a, b: a / b),
    "true_divide": (aten.true_divide.Tensor, torch.true_divide),
    "div_trunc": (aten.div.Tensor_mode, lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    "div_floor": (aten.div.Tensor_mode, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "floor_divide": (aten.floor_divide.default, lambda a, b: a // b),
    "remainder": (aten.remainder.Tensor, lambda a, b: a % b),
    "fmod": (aten.fmod.Tensor, torch.fmod),
    "maximum": (aten.maximum.default, torch.maximum),
    "minimum": (aten.minimum.default, torch.minimum),
    "max_other": (aten.max.other, torch.max),
    "min_other": (aten.min.other, torch.min),
    "pow": (aten.pow.Tensor_Tensor, lambda a, b: a.abs() ** b.abs()),
    "float_power": (aten.float_power.Tensor_Tensor, lambda a, b: torch.float_power(a.abs(), b)),
}


@pytest.mark.parametrize("dtype, shapes", [(dtype, ((2, 3, 4), (3, 1))) for dtype in FLOATS + INTS]
                         + [(dtype, ((5,), ())) for dtype in (torch.float32, torch.int64)], ids=str)
def test_binary(dtype, shapes):
    assert_table_lowers(BINARY, make(shapes[0], dtype), nonzero(shapes[1], dtype))


def test_bool_arithmetic():
    """bool + bool is logical or in torch, bool * bool logical and; max/min stay bool."""
    ops = {name: BINARY[name] for name in ["add", "mul", "maximum", "minimum"]}
    assert_table_lowers(ops, make((3, 4), torch.bool), make((4,), torch.bool, seed=2))


def test_uint8_images():
    """Unsigned bytes compare, promote and convert as unsigned."""
    ops = {"scale": BINARY["div"], "gt": COMPARISONS["gt"], "add": BINARY["add"], "max": BINARY["maximum"]}
    x = torch.arange(0, 240, 20, dtype=torch.uint8).reshape(3, 4)
    assert_table_lowers(ops, x, torch.full((4,), 130, dtype=torch.uint8))


def test_atan2():
    assert_table_lowers({"atan2": (aten.atan2.default, torch.atan2)},
                        make((3, 4), torch.float32), make((3, 4), torch.float32, seed=2))


@pytest.mark.parametrize("dtypes", [(torch.int32, torch.float32), (torch.int64, torch.int32),
                                    (torch.float16, torch.float32), (torch.bool, torch.int64)], ids=str)
def test_mixed_dtypes_promote(dtypes):
    ops = {"add": BINARY["add"], "mul": BINARY["mul"], "div": BINARY["div"]}
    assert_table_lowers(ops, make((3, 4), dtypes[0]), make((4,), dtypes[1], 1, 3))


def test_floor_division_is_exact_where_the_rounded_quotient_is_not():
    """1 // 0.1 is 9 (0.1f is a bit more than 1/10), though 1 / 0.1f rounds to 10; signs and zeros as in torch."""
    a = torch.tensor([1.0, -1.0, 7.0, -7.0, 0.0, 5.5, -0.0, 3.0, 1.0])
    b = torch.tensor([0.1, 0.1, 2.0, 2.0, -3.0, -0.5, 2.0, 0.0, -0.0])
    assert_table_lowers({"div_floor": BINARY["div_floor"], "remainder": BINARY["remainder"]}, a, b)


SCALAR_OVERLOADS = {
    "add": (aten.add.Scalar, lambda x: aten.add.Scalar(x, 2, alpha=2)),
    "sub": (aten.sub.Scalar, lambda x: aten.sub.Scalar(x, 1.5)),
    "rsub": (aten.rsub.Scalar, lambda x: 1 - x),
    "mul": (aten.mul.Scalar, lambda x: aten.mul.Scalar(x, 3)),
    "div": (aten.div.Scalar, lambda x: aten.div.Scalar(x, 4)),
    "true_divide": (aten.true_divide.Scalar, lambda x: aten.true_divide.Scalar(x, 4)),
    "div_mode": (aten.div.Scalar_mode, lambda x: aten.div.Scalar_mode(x, -2, rounding_mode="floor")),
    "floor_divide": (aten.floor_divide.Scalar, lambda x: aten.floor_divide.Scalar(x, 2)),
    "remainder": (aten.remainder.Scalar, lambda x: x % 2),
    "remainder_scalar_tensor": (aten.remainder.Scalar_Tensor, lambda x: torch.remainder(5, x.abs() + 1)),
    "fmod": (aten.fmod.Scalar, lambda x: torch.fmod(x, 2)),
    "cube": (aten.pow.Tensor_Scalar, lambda x: x ** 3),
    "square": (aten.pow.Tensor_Scalar, lambda x: x ** 2),
    "exponent_tensor": (aten.pow.Scalar, lambda x: 2 ** x.abs()),
    "square_op": (aten.square.default, torch.square),
    "float_power": (aten.float_power.Tensor_Scalar, lambda x: torch.float_power(x, 2)),
    "float_power_of_scalar": (aten.float_power.Scalar, lambda x: torch.float_power(3, x)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_scalar_overloads(dtype):
    assert_table_lowers(SCALAR_OVERLOADS, make((3, 4), dtype))


# -- unary math ------------------------------------------------------------------------

UNARY_ANYWHERE = {
    "neg": (aten.neg.default, torch.neg), "abs": (aten.abs.default, torch.abs),
    "exp": (aten.exp.default, torch.exp), "exp2": (aten.exp2.default, torch.exp2),
    "expm1": (aten.expm1.default, torch.expm1), "sin": (aten.sin.default, torch.sin),
    "cos": (aten.cos.default, torch.cos), "tanh": (aten.tanh.default, torch.tanh),
    "atan": (aten.atan.default, torch.atan), "sinh": (aten.sinh.default, torch.sinh),
    "cosh": (aten.cosh.default, torch.cosh), "asinh": (aten.asinh.default, torch.asinh),
    "sigmoid": (aten.sigmoid.default, torch.sigmoid), "expit": (aten.special_expit.default, torch.special.expit),
    "erf": (aten.erf.default, torch.erf), "erfc": (aten.erfc.default, torch.erfc),
    "sign": (aten.sign.default, torch.sign), "sgn": (aten.sgn.default, torch.sgn),
    "floor": (aten.floor.default, torch.floor), "ceil": (aten.ceil.default, torch.ceil),
    "round": (aten.round.default, torch.round), "trunc": (aten.trunc.default, torch.trunc),
    "fix": (aten.fix.default, torch.fix), "frac": (aten.frac.default, torch.frac),
}
UNARY_POSITIVE = {
    "log": (aten.log.default, torch.log), "log2": (aten.log2.default, torch.log2),
    "log10": (aten.log10.default, torch.log10), "sqrt": (aten.sqrt.default, torch.sqrt),
    "rsqrt": (aten.rsqrt.default, torch.rsqrt), "reciprocal": (aten.reciprocal.default, torch.reciprocal),
    "lgamma": (aten.lgamma.default, torch.lgamma),
}
UNARY_UNIT = {
    "log1p": (aten.log1p.default, torch.log1p), "tan": (aten.tan.default, torch.tan),
    "asin": (aten.asin.default, torch.asin), "acos": (aten.acos.default, torch.acos),
    "atanh": (aten.atanh.default, torch.atanh), "erfinv": (aten.erfinv.default, torch.erfinv),
}
UNARY_ABOVE_ONE = {"acosh": (aten.acosh.default, torch.acosh), "digamma": (aten.digamma.default, torch.digamma)}
UNARY_DOMAINS = {"anywhere": (UNARY_ANYWHERE, -3, 3), "positive": (UNARY_POSITIVE, 0.1, 4),
                 "unit": (UNARY_UNIT, -0.9, 0.9), "above_one": (UNARY_ABOVE_ONE, 1.1, 4)}


@pytest.mark.parametrize("domain", list(UNARY_DOMAINS))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary(dtype, domain):
    ops, low, high = UNARY_DOMAINS[domain]
    assert_table_lowers(ops, make((2, 3, 5), dtype, low, high))


def test_unary_of_integers():
    """Float functions promote to float32; sign keeps the integer dtype and rounding is the identity."""
    names = ["neg", "abs", "sign", "exp", "sin", "sigmoid"]
    ops = {name: UNARY_ANYWHERE[name] for name in names} | {"sqrt": UNARY_POSITIVE["sqrt"]}
    x = make((2, 3, 5), torch.int32, 0, 5)
    assert_table_lowers(ops, x)
    rounding = {name: UNARY_ANYWHERE[name] for name in ["floor", "ceil", "round", "trunc"]}
    assert_registered_and_exported({op for op, _ in rounding.values()}, table(rounding), x)
    assert_matches_eager(table(rounding), x)


def test_round_ties_go_to_even():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 2.51])
    assert_table_lowers({"round": UNARY_ANYWHERE["round"]}, x)


@pytest.mark.parametrize("decimals", [2, 0, -1])
def test_round_decimals(decimals):
    ops = {"round": (aten.round.decimals, lambda x: torch.round(x, decimals=decimals))}
    assert_table_lowers(ops, make((4, 5), torch.float32, -300, 300))


def test_sign_keeps_the_dtype():
    assert_table_lowers({"sign": UNARY_ANYWHERE["sign"]}, make((3, 4), torch.int64))
    assert_registered_and_exported({aten.sign.default}, torch.sign, make((3, 4), torch.bool))
    assert_matches_eager(torch.sign, make((3, 4), torch.bool))


# -- comparisons and logic ---------------------------------------------------------------

COMPARISONS = {name: (getattr(aten, name).Tensor, getattr(torch, name)) for name in ["eq", "ne", "lt", "le", "gt", "ge"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool], ids=str)
def test_compare_tensors(dtype):
    assert_table_lowers(COMPARISONS, make((3, 4), dtype, -2, 2), make((4,), dtype, -2, 2, seed=3))


def test_compare_with_a_scalar_promotes():
    """An int tensor against a float scalar compares in float: 1 < 1.5, which a cast to int would lose."""
    ops = {name: (getattr(aten, name).Scalar, lambda t, f=f: f(t, 1.5)) for name, (_, f) in COMPARISONS.items()}
    assert_table_lowers(ops, make((3, 4), torch.int64, -2, 3))


LOGICAL = {name: (getattr(aten, name).default, getattr(torch, name))
           for name in ["logical_and", "logical_or", "logical_xor"]}
LOGICAL["logical_not"] = (aten.logical_not.default, lambda a, b: torch.logical_not(a))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float32], ids=str)
def test_logical(dtype):
    assert_table_lowers(LOGICAL, make((3, 4), dtype, -1, 2), make((3, 4), dtype, -1, 2, seed=4))


BITWISE = {
    "and": (aten.bitwise_and.Tensor, torch.bitwise_and), "or": (aten.bitwise_or.Tensor, torch.bitwise_or),
    "xor": (aten.bitwise_xor.Tensor, torch.bitwise_xor), "&": (aten.__and__.Tensor, lambda a, b: a & b),
    "|": (aten.__or__.Tensor, lambda a, b: a | b), "^": (aten.__xor__.Tensor, lambda a, b: a ^ b),
    "and_scalar": (aten.bitwise_and.Scalar, lambda a, b: aten.bitwise_and.Scalar(a, 6)),
    "or_scalar": (aten.bitwise_or.Scalar, lambda a, b: aten.bitwise_or.Scalar(a, 1)),
    "xor_scalar": (aten.bitwise_xor.Scalar, lambda a, b: aten.bitwise_xor.Scalar(a, 3)),
    "&_scalar": (aten.__and__.Scalar, lambda a, b: aten.__and__.Scalar(a, 1)),
    "|_scalar": (aten.__or__.Scalar, lambda a, b: aten.__or__.Scalar(a, 0)),
    "^_scalar": (aten.__xor__.Scalar, lambda a, b: aten.__xor__.Scalar(a, 1)),
    "not": (aten.bitwise_not.default, lambda a, b: ~a),
}


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64], ids=str)
def test_bitwise(dtype):
    assert_table_lowers(BITWISE, make((3, 4), dtype, -8, 8), make((3, 4), dtype, -8, 8, seed=5))


FLOAT_CLASSES = {name: (getattr(aten, name).default, getattr(torch, name))
                 for name in ["isnan", "isinf", "isfinite", "isposinf", "isneginf"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_float_classes(dtype):
    special = torch.tensor([0.0, -1.5, math.inf, -math.inf, math.nan, 3e38, -0.0, 1e-40])
    assert_table_lowers(FLOAT_CLASSES, special.to(dtype) if dtype.is_floating_point else make((3, 4), dtype))


# -- selection and clamping -------------------------------------------------------------------

WHERE = {
    "self": (aten.where.self, lambda c, a, b: torch.where(c, a, b)),
    "scalar_self": (aten.where.ScalarSelf, lambda c, a, b: torch.where(c, 2, b)),
    "scalar_other": (aten.where.ScalarOther, lambda c, a, b: torch.where(c, a, -1)),
    "scalars": (aten.where.Scalar, lambda c, a, b: torch.where(c, 1.0, 0.0)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_where(dtype):
    assert_table_lowers(WHERE, make((3, 1), torch.bool), make((3, 4), dtype), make((4,), dtype, seed=6))


CLAMPS = {
    "both": (aten.clamp.default, lambda x, lo, hi: x.clamp(-1, 2)),
    "min_only": (aten.clamp.default, lambda x, lo, hi: x.clamp(min=0)),
    "max_only": (aten.clamp.default, lambda x, lo, hi: x.clamp(max=1)),
    "tensors": (aten.clamp.Tensor, lambda x, lo, hi: x.clamp(lo, hi)),
    "tensor_min_only": (aten.clamp.Tensor, lambda x, lo, hi: x.clamp(min=lo)),
    "clamp_min": (aten.clamp_min.default, lambda x, lo, hi: torch.clamp_min(x, -1)),
    "clamp_max": (aten.clamp_max.default, lambda x, lo, hi: torch.clamp_max(x, 1)),
    "clamp_min_tensor": (aten.clamp_min.Tensor, lambda x, lo, hi: torch.clamp_min(x, lo)),
    "clamp_max_tensor": (aten.clamp_max.Tensor, lambda x, lo, hi: torch.clamp_max(x, hi)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_clamp(dtype):
    assert_table_lowers(CLAMPS, make((3, 4), dtype), make((4,), dtype, -2, 0), make((3, 1), dtype, 0, 2))


def test_clamp_of_an_int_tensor_with_float_bounds_promotes():
    assert_table_lowers({"clamp": (aten.clamp.default, lambda x: x.clamp(-0.5, 1.5))}, make((3, 4), torch.int64))


def test_nan_propagates_through_max_min_and_clamp():
    """NaN in either operand wins, in either position (XLA's own CPU max/min do not guarantee this)."""
    ops = {"maximum": BINARY["maximum"], "minimum": (aten.minimum.default, lambda a, b: torch.minimum(b, a)),
           "clamp": (aten.clamp.default, lambda a, b: a.clamp(-1, 1)),
           "clamp_tensor": (aten.clamp.Tensor, lambda a, b: b.clamp(a, a + 1))}
    a = torch.tensor([math.nan, 1.0, -2.0, math.nan, 0.5])
    b = torch.tensor([0.0, math.nan, -3.0, math.nan, 0.25])
    assert_table_lowers(ops, a, b)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_lerp(dtype):
    ops = {"scalar_weight": (aten.lerp.Scalar, lambda a, b, w: torch.lerp(a, b, 0.75)),
           "tensor_weight": (aten.lerp.Tensor, torch.lerp)}
    assert_table_lowers(ops, make((3, 4), dtype), make((3, 4), dtype, seed=8), make((4,), dtype, 0, 1, seed=7))


SYMBOLIC = {
    "add_row": lambda x: x + x.amax(0), "scalar_alpha": lambda x: torch.sub(x, 1.5, alpha=2),
    "floor_divide": lambda x: x // 0.7, "remainder": lambda x: x % 2, "clamp": lambda x: x.clamp(-1, 1),
    "where_scalar": lambda x: torch.where(x > 0, x, 0.0), "lerp": lambda x: torch.lerp(x, x * 2, 0.25),
    "isinf_of_int": lambda x: torch.isinf(x.int()), "times_size": lambda x: x * x.shape[0],
}


@pytest.mark.parametrize("name", list(SYMBOLIC))
def test_symbolic_batch_lowers_to_dynamic_ops(name):
    """Constants and broadcasts take the symbolic size from the input at run time."""
    assert_lowers_with_symbolic_batch(SYMBOLIC[name], make((4, 6), torch.float32))


def test_atan2_out_lowers_like_atan2():
    """A graph holding atan2.out (export functionalises it away, other producers may not) computes atan2."""
    from torch_stablehlo.exporter.conversion.graph_lowering import GraphLowering
    from torch_stablehlo.exporter.conversion.inplace import InPlaceWrites
    from torch_stablehlo.exporter.conversion.signature import signature_of
    from torch_stablehlo.stablehlo_ir.mlir_context import make_context

    program = torch.export.export(FunctionModule(torch.atan2), (make((3, 4)), make((3, 4), seed=1)))
    node = next(n for n in program.graph.nodes if n.target is aten.atan2.default)
    node.target = aten.atan2.out
    writes = InPlaceWrites.of_program(program)
    signature = signature_of(program, writes.kinds)
    text = str(GraphLowering(program.graph_module, signature, writes.functional).lower(make_context()))
    assert "stablehlo.atan2" in text


def test_item_and_scalar_arithmetic():
    """``.item()`` becomes a 0-d value; Python arithmetic and comparisons on it, and asserts, lower too."""
    def function(x, n):
        k = n.item()
        torch._check(k >= 0)
        return x * (k * 2 + 1) + x.sum().item() - (k // 2) + (k % 3), torch.full((2,), k > 1)

    x = make((3, 4))
    for n in (torch.tensor(5), torch.tensor(0)):
        assert_matches_eager(function, x, n)
    assert_matches_eager(lambda x: x / x.shape[0] + x.flatten().shape[0] // 5, x)


# -- fmax/fmin, hypot, shifts, copysign/signbit, gcd/lcm, nextafter, frexp, angle ---------------------------

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
def test_float_bits_unary(dtype):
    x = make((3, 4), dtype, -1e3, 1e3)
    x[0, :3] = torch.tensor([0.0, float("nan"), float("inf")])
    assert_lowers({aten.frexp.Tensor, aten.angle.default, aten.signbit.default},
                  lambda x: (*torch.frexp(x), torch.angle(x), torch.signbit(-x)), x)
