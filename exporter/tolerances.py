"""How far a converted program's results may be from eager torch's: the one tolerance table, per dtype, that the
divergence bisect (per op) and the golden zoo (per model output, with the CLI's ``verify``) read.

A result agrees when ``max |ours - eager| <= atol + rtol * max |eager|`` over the whole tensor: ``rtol`` is
relative to the output's scale (its largest magnitude), not to each element. Integer results are exact.
"""
from __future__ import annotations

import torch

TOLERANCES = {  # dtype -> (rtol, atol)
    torch.float64: (1e-9, 1e-12), torch.complex128: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-6), torch.complex64: (1e-4, 1e-6),
    torch.float16: (1e-2, 1e-3), torch.bfloat16: (4e-2, 1e-2),
}
F32_TOLERANCE = TOLERANCES[torch.float32][0]
"""A float32 golden model's default: max |error| <= this x max |golden|, per output."""


def disagreement(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None where ``actual`` agrees with ``expected`` by the table (same shape and dtype, NaNs in the same places;
    integers and bools exactly), else what differs."""
    if (actual.shape, actual.dtype) != (expected.shape, expected.dtype):
        return f"{actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
    if expected.dtype not in TOLERANCES:
        return None if torch.equal(actual, expected) else "integers differ"
    rtol, atol = TOLERANCES[expected.dtype]
    wide = torch.complex128 if expected.is_complex() else torch.float64
    actual, expected = actual.detach().to(wide), expected.detach().to(wide)
    if not torch.equal(actual.isnan(), expected.isnan()):
        return "NaNs in other places"
    kept = ~expected.isnan()
    if not kept.any():
        return None
    error, scale = (actual - expected)[kept].abs().max().item(), expected[kept].abs().max().item()
    return None if error <= atol + rtol * scale else f"max |error| {error:.3g} > {atol:g} + {rtol:g} x {scale:.3g}"
