"""The tensors of a safetensors file whose bytes are in memory (read, or mapped), each a view of those bytes (no
copy): the bytes a bundle's checksum was checked on are the bytes its weights are.

safetensors' own readers take a path (opened again: maybe another file than the one checked) or copy every tensor
out of the bytes (twice the memory, and more than twice the time of a load); the format is small enough to read here: an
8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, the data.
Everything in the header is checked before it is used; a file that does not fit is a BundleError naming it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..errors import BundleError
from .manifest_schema import bounded_int, described

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool, "C64": torch.complex64}
"""safetensors' dtype codes of the dtypes a bundle's weights may have."""


def stored_tensors(data, file: Path) -> dict[str, torch.Tensor]:
    """Name -> tensor for every tensor of the safetensors file ``file`` whose bytes are ``data`` (a writable buffer:
    a bytearray or a copy-on-write mapping; the tensors are views of it)."""
    length = int.from_bytes(data[:8], "little")
    if len(data) < 8 or length > len(data) - 8:
        raise BundleError(f"{file} is not a readable safetensors file: its header does not fit in its "
                          f"{len(data)} bytes")
    try:
        header = json.loads(memoryview(data)[8:8 + length].tobytes(), parse_int=bounded_int)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise BundleError(f"{file} is not a readable safetensors file: its header is not valid JSON ({error})") \
            from None
    if not isinstance(header, dict):
        raise BundleError(f"{file} is not a readable safetensors file: its header is {described(header)}")
    start = 8 + length
    return {name: _tensor(data, start, name, entry, file) for name, entry in header.items() if name != "__metadata__"}


def _tensor(data, start: int, name: str, entry, file: Path) -> torch.Tensor:
    try:
        dtype, shape, (first, end) = DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        fits = (all(isinstance(d, int) and d >= 0 for d in shape) and isinstance(first, int)
                and isinstance(end, int) and 0 <= first <= end <= len(data) - start
                and end - first == math.prod(shape) * dtype.itemsize)
    except (TypeError, KeyError, ValueError):
        fits = False
    if not fits:
        raise BundleError(f"{file} is not a readable safetensors file: the header's entry for {name!r} is no "
                          f"tensor inside the file ({described(entry)})")
    if first == end:
        return torch.empty(shape, dtype=dtype)
    offset = start + first
    if offset % dtype.itemsize:  # unaligned (no writer of ours puts it there): a copy of its own
        return torch.frombuffer(bytearray(data[offset:start + end]), dtype=dtype).reshape(shape)
    return torch.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
