"""The dtypes a program's tensors may have: the StableHLO element type of each (the one table, read both ways by
``aten_lowerings.mlir_types``, and by name in ``specs``), the ones carried in a wider type, and torch <-> numpy
conversion for every dtype PJRT takes (bf16 through ml_dtypes); results in host memory (PJRT CPU) become torch
tensors without a copy (DLPack)."""
from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import torch
import torch.utils.dlpack
from jaxlib import _jax

_BIT_VIEWS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
CARRIED = {torch.complex32: torch.complex64}
"""dtypes without a PJRT type, carried in a wider one that holds their values exactly."""

ELEMENT_TYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16", torch.bool: "i1",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "ui8", torch.uint16: "ui16", torch.uint32: "ui32", torch.uint64: "ui64",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
}
"""Each torch dtype and its StableHLO element type as MLIR writes it (signless ints, ``ui*`` for unsigned, ``i1``
for bool); a carried dtype has its carrier's."""
ELEMENT_TYPES.update({dtype: ELEMENT_TYPES[carrier] for dtype, carrier in CARRIED.items()})

PYTHON_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}
"""The dtype a Python scalar has as a 0-d tensor: a graph's ``.item()`` and size results, a loop's counter, a
model's scalar output."""
SYMBOLIC_SCALARS = {torch.SymBool: bool, torch.SymInt: int, torch.SymFloat: float}
SCALAR_DTYPES = {**PYTHON_SCALAR_DTYPES, **{sym: PYTHON_SCALAR_DTYPES[py] for sym, py in SYMBOLIC_SCALARS.items()}}
"""The same for a Python scalar's type or a symbolic scalar's."""


def scalar_type(value) -> type | None:
    """``bool``, ``int`` or ``float`` for a Python or symbolic scalar, None for anything else."""
    kind = type(value)
    return SYMBOLIC_SCALARS.get(kind, kind if kind in PYTHON_SCALAR_DTYPES else None)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype in CARRIED:
        tensor = tensor.to(CARRIED[tensor.dtype])
    if tensor.dtype in _BIT_VIEWS:
        carrier, numpy_dtype = _BIT_VIEWS[tensor.dtype]
        return tensor.view(carrier).numpy().view(numpy_dtype)
    return tensor.numpy()


_SHARED_BY_DLPACK = {np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int8, np.int16,
                                              np.int32, np.int64, np.uint8, np.bool_, np.complex64, np.complex128)}
"""dtypes that torch takes over DLPack (wider unsigned ints, fp8 and sub-byte types go through numpy)."""


def to_torch(array) -> torch.Tensor:
    """A numpy array, or a ``jax.Array`` result, as a torch tensor; a result in host memory (PJRT CPU) is shared,
    not copied (a 200 MB logits tensor costs no copy). Shared buffers are never written by XLA again: each
    result is a buffer of its own."""
    if isinstance(array, jax.Array) and array.dtype in _SHARED_BY_DLPACK and array.device.platform == "cpu":
        # the capsule straight from the buffer: torch.from_dlpack(array) asks jax's __dlpack__, a few times slower
        return torch.utils.dlpack.from_dlpack(_jax.buffer_to_dlpack_managed_tensor(array, stream=None))
    array = np.asarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def uncarried(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result back in its own dtype if it came back in its carrier (``CARRIED``)."""
    return tensor.to(dtype) if CARRIED.get(dtype) == tensor.dtype else tensor
