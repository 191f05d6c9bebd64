"""torch <-> numpy conversion for every dtype PJRT takes (bf16 through ml_dtypes); results in host memory
(PJRT CPU) become torch tensors without a copy (DLPack)."""
from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import torch

_BIT_VIEWS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
CARRIED = {torch.complex32: torch.complex64}
"""dtypes without a PJRT type, carried in a wider one that holds their values exactly."""


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
        return torch.from_dlpack(array)
    array = np.asarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def uncarried(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result back in its own dtype if it came back in its carrier (``CARRIED``)."""
    return tensor.to(dtype) if CARRIED.get(dtype) == tensor.dtype else tensor
