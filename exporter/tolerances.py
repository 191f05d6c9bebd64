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
