"""Weights shared by several names (tied weights): found once, stored and placed once.

A weight may also have no data (a model built on the meta device, or traced with fake
tensors): such an artifact is *weightless*; its weights are attached later by name
(``attach``), checked against the shapes and dtypes the module was exported with.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import safetensors
import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import WeightsError


def has_data(tensor: torch.Tensor) -> bool:
    """False for meta and fake tensors: a shape and a dtype, no values."""
    return not (tensor.is_meta or isinstance(tensor, FakeTensor))


def placeholder(shape, dtype: torch.dtype) -> torch.Tensor:
    """A weight known by its shape and dtype only (a weightless bundle's)."""
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def alias_map(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """Map each weight name to the first name holding the same tensor view (tied weights); weights
    without data are tied when they are the same tensor object."""
    first_by_view: dict[tuple, str] = {}
    result = {}
    for name, tensor in weights.items():
        if not has_data(tensor):
            view = ("no data", id(tensor))
        else:
            view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()), tensor.dtype)
        result[name] = first_by_view.setdefault(view, name)
    return result


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def missing_data(weights: dict[str, torch.Tensor]) -> list[str]:
    """The names of the weights that have no data yet."""
    return [name for name, tensor in weights.items() if not has_data(tensor)]


def attach(weights: dict[str, torch.Tensor], source) -> dict[str, torch.Tensor]:
    """``weights`` with every weight lacking data taken by name from ``source``: a safetensors file, a list
    of them, a folder of them (e.g. a sharded checkpoint), or a dict of tensors. Tied weights take the
    tensor of whichever of their names ``source`` has. Raises WeightsError naming every weight missing
    from ``source`` or found there with another shape or dtype; names ``source`` has beyond these are ignored.
    """
    available = _open(source)
    groups: dict[str, list[str]] = {}
    for name, target in alias_map(weights).items():
        groups.setdefault(target, []).append(name)
    result = dict(weights)
    missing, mismatched = [], []
    for names in groups.values():
        expected = weights[names[0]]
        if has_data(expected):
            continue
        found = next((n for n in names if n in available), None)
        if found is None:
            missing.append(" = ".join(names))
            continue
        value = available[found]() if callable(available[found]) else available[found]
        if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
            mismatched.append(f"{found}: expected {_describe(expected)}, got {_describe(value)}")
            continue
        value = value.detach()
        result.update({n: value for n in names})
    if missing or mismatched:
        lines = ([f"missing ({len(missing)}): {', '.join(missing)}"] if missing else []) + \
                ([f"wrong shape or dtype ({len(mismatched)}): {'; '.join(mismatched)}"] if mismatched else [])
        raise WeightsError(f"cannot attach weights from {_source_name(source)}: " + "; ".join(lines))
    return result


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def _source_name(source) -> str:
    return "a dict of tensors" if isinstance(source, dict) else str(source)


def _folder_files(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files of ``folder``, each a regular file right inside it (a link is refused, before
    anything is opened: a folder's files stay inside it). Files named one by one may be links: the caller chose them."""
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        mode = os.lstat(file).st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
            raise WeightsError(f"cannot attach weights from the folder {folder}: {file.name} is "
                               f"{'a link' if stat.S_ISLNK(mode) else 'not a regular file'}; name such a file "
                               "explicitly (a list of files) to use it")
    return files


def _open(source) -> dict:
    """Name -> tensor, or a function reading it (safetensors files are read one tensor at a time)."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        files = _folder_files(path) if path.is_dir() else [path]
    else:
        files = [Path(f) for f in source]
    readers = {}
    for file in files:
        if not file.is_file():
            raise WeightsError(f"cannot attach weights: {file} does not exist")
        try:
            handle = safetensors.safe_open(str(file), framework="pt")
        except Exception as error:  # noqa: BLE001  (safetensors raises plain errors; say which file)
            raise WeightsError(f"cannot attach weights: {file} is not a readable safetensors file: {error}") from None
        readers.update({name: (lambda h=handle, n=name: h.get_tensor(n)) for name in handle.keys()})
    return readers
