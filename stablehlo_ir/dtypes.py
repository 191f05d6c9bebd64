"""torch <-> numpy conversion for every dtype PJRT takes (bf16 through ml_dtypes)."""
from __future__ import annotations

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


def to_torch(array: np.ndarray) -> torch.Tensor:
    array = np.asarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def uncarried(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result back in its own dtype if it came back in its carrier (``CARRIED``)."""
    return tensor.to(dtype) if CARRIED.get(dtype) == tensor.dtype else tensor
