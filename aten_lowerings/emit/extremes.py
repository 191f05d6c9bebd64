"""Extremes: the identities of max and min per dtype, and the NaN-aware elementwise maximum and minimum (torch's
``maximum``, NaN wins, and ``fmax``, NaN loses)."""
from __future__ import annotations

import math

import torch
from jaxlib.mlir.dialects import stablehlo

from ..values import dtype_of
from .elementwise import compare


def lowest(dtype: torch.dtype):
    """The identity of max over ``dtype``: -inf, the smallest integer, or False."""
    if dtype == torch.bool:
        return False
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def highest(dtype: torch.dtype):
    """The identity of min over ``dtype``: inf, the largest integer, or True."""
    if dtype == torch.bool:
        return True
    return math.inf if dtype.is_floating_point else torch.iinfo(dtype).max


def is_nan(x):
    return compare(x, x, "NE")


def _nan_aware(op, nan_wins: bool):
    """``op`` (stablehlo maximum or minimum) with torch's NaN rule for float operands: a NaN operand is the
    result (``nan_wins``, torch.maximum) or the other operand is (torch.fmax); XLA's CPU max and min return
    the other operand when the second one is NaN."""

    def apply(a, b):
        result = op(a, b)
        if not dtype_of(a).is_floating_point:
            return result
        a_nan_gives, b_nan_gives = (a, b) if nan_wins else (b, a)
        return stablehlo.select(is_nan(a), a_nan_gives, stablehlo.select(is_nan(b), b_nan_gives, result))

    return apply


maximum = _nan_aware(stablehlo.maximum, nan_wins=True)
minimum = _nan_aware(stablehlo.minimum, nan_wins=True)
fmax = _nan_aware(stablehlo.maximum, nan_wins=False)
fmin = _nan_aware(stablehlo.minimum, nan_wins=False)
