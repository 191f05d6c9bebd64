"""The bundle folder: a portable StableHLO module, its weights, and a manifest that checks them.

    manifest.json        format and versions; the signature (names, dtypes, shapes with symbolic
                         dims and their ranges, pytree specs); the weights index; size and sha256 per file
    module.mlirbc        the StableHLO portable artifact, at the chosen target version
    module.mlir          the readable module with source locations (optional)
    weights.safetensors  the weights; above the shard size: weights-00001-of-0000N.safetensors, ...
                         (none for a weightless bundle: its manifest lists each weight's name, shape and
                         dtype with ``"file": null``; ``load_artifact(path, weights=...)`` attaches them)

``save_bundle`` writes the folder atomically; ``load_bundle`` checks every file
against the manifest before it uses any of them. A bundle over a device mesh records it and each tensor's
sharding in the signature (and the mesh at the manifest's top level); ``load_bundle(local_shards=True)`` reads
no weight, but gives a reader per weight that reads only the slices asked for (a process's own shards).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.passes import portable_artifact
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME, dtype_name

from ..errors import BundleError, BundleVersionError
from .folders import staged_folder
from ..terminal import progress
from ..conversion.signature import Signature
from .versions import DEFAULT_TARGET, check_readable, producer_versions, resolve_target_version
from .weights import alias_map, has_data, nbytes, placeholder

FORMAT = "torch-stablehlo-bundle"
FORMAT_VERSION = 3  # 3: state slots (kind "state", their exported values stored with the weights) donated by @main
MANIFEST, MODULE_PORTABLE, MODULE_TEXT = "manifest.json", "module.mlirbc", "module.mlir"
DEFAULT_SHARD_BYTES = 2 * 1024 ** 3
_REQUIRED = ("stablehlo_version", "signature", "weights", "weight_aliases", "files")


@dataclass
class Bundle:
    stablehlo_text: str
    signature: Signature
    weights: dict[str, torch.Tensor]   # every weight name, aliases included
    manifest: dict
    readers: dict[str, "SliceReader"] = field(default_factory=dict)  # with local_shards: by weight name


class SliceReader:
    """One stored weight, read slice by slice (``reader[index]``, a tuple of slices, as numpy): only the parts
    of the file a process's devices hold are read."""

    def __init__(self, file: Path, name: str, shape):
        self.file, self.name, self.shape = file, name, tuple(shape)

    def __getitem__(self, index: tuple):
        with safetensors.safe_open(str(self.file), framework="pt") as handle:
            part = handle.get_slice(self.name)[index] if self.shape else handle.get_tensor(self.name)
        return to_numpy(part)


def save_bundle(path: str | os.PathLike, stablehlo_text: str, signature: Signature,
                weights: dict[str, torch.Tensor], *, target_version: str = DEFAULT_TARGET,
                shard_bytes: int = DEFAULT_SHARD_BYTES, include_text: bool = True) -> Path:
    """Write a bundle folder at ``path``; a failure leaves nothing there (see ``staged_folder``).

    Tied weights are stored once and listed as aliases; the weights are split into
    safetensors shards of at most ``shard_bytes`` of tensor data each (a larger tensor gets a shard
    of its own), written one shard at a time from the tensors as they are (no copy). Weights without
    data (meta or fake tensors) are listed in the manifest with ``"file": null`` and not stored.
    """
    version = resolve_target_version(target_version)
    if shard_bytes <= 0:
        raise ValueError(f"shard size must be positive, got {shard_bytes} bytes")
    aliases = alias_map(weights)
    unique = [name for name, target in aliases.items() if name == target]
    stored = {name: weights[name].detach().contiguous() for name in unique if has_data(weights[name])}
    absent = {name: weights[name] for name in unique if not has_data(weights[name])}
    with staged_folder(path, MANIFEST, "an artifact folder") as staging:
        (staging / MODULE_PORTABLE).write_bytes(portable_artifact(stablehlo_text, version))
        if include_text:
            (staging / MODULE_TEXT).write_text(stablehlo_text)
        index = {name: _record(None, tensor) for name, tensor in absent.items()}
        shards = _shards(stored, shard_bytes) if stored else {}
        with progress(desc="saving weights", unit="B", unit_scale=True,
                      total=sum(nbytes(t) for t in stored.values())) as bar:
            for file_name, names in shards.items():
                safetensors.torch.save_file({name: stored[name] for name in names}, str(staging / file_name))
                index.update({name: _record(file_name, stored[name]) for name in names})
                bar.update(sum(nbytes(stored[name]) for name in names))
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "stablehlo_version": version,
                    "stablehlo_target": target_version, **producer_versions(),
                    "signature": signature.to_json(), "mesh": signature.mesh, "weights": index,
                    "weight_aliases": {name: target for name, target in aliases.items() if name != target},
                    "files": {file.name: {"bytes": file.stat().st_size, "sha256": _sha256(file)}
                              for file in sorted(staging.iterdir())}}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return Path(path)


def _record(file_name: str | None, tensor: torch.Tensor) -> dict:
    return {"file": file_name, "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape),
            "bytes": nbytes(tensor)}


def _shards(tensors: dict[str, torch.Tensor], shard_bytes: int) -> dict[str, list[str]]:
    """File name -> tensor names, filled in order; one file ``weights.safetensors`` when all fit."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        if groups[-1] and size + nbytes(tensor) > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes(tensor)
    if len(groups) == 1:
        return {"weights.safetensors": groups[0]}
    return {f"weights-{i:05d}-of-{len(groups):05d}.safetensors": names for i, names in enumerate(groups, 1)}


def load_bundle(path: str | os.PathLike, *, local_shards: bool = False) -> Bundle:
    """Read a bundle, after checking its format, StableHLO version and every file's size and checksum.
    ``local_shards``: the weights stay in their files (placeholders of their shape and dtype), each with a
    ``SliceReader``."""
    path = Path(path)
    manifest = load_manifest(path)
    for name in sorted(set(manifest["files"]) | _weight_files(manifest)):
        checked_file(path, manifest, name)
    module, signature = _read_module(path / MODULE_PORTABLE), Signature.from_json(manifest["signature"])
    if not local_shards:
        return Bundle(module, signature, _read_weights(path, manifest), manifest)
    records = {name: manifest["weights"][manifest["weight_aliases"].get(name, name)]
               for name in [*manifest["weights"], *manifest["weight_aliases"]]}
    weights = {name: placeholder(r["shape"], DTYPES_BY_NAME[r["dtype"]]) for name, r in records.items()}
    readers = {name: SliceReader(path / r["file"], manifest["weight_aliases"].get(name, name), r["shape"])
               for name, r in records.items() if r["file"] is not None}
    return Bundle(module, signature, weights, manifest, readers)


def load_manifest(path: str | os.PathLike) -> dict:
    """The bundle's manifest, once its format and StableHLO version are known to be readable here."""
    path = Path(path)
    file = path / MANIFEST
    if not path.is_dir():
        raise BundleError(f"{path}: no such bundle folder")
    if not file.is_file():
        raise BundleError(f"{path} is not a bundle: {MANIFEST} is missing")
    try:
        manifest = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{file} is corrupt: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise BundleError(f"{file} is not a bundle manifest (no format_version)")
    if manifest["format_version"] != FORMAT_VERSION:
        newer = isinstance(manifest["format_version"], int) and manifest["format_version"] > FORMAT_VERSION
        raise BundleVersionError(
            f"{path}: bundle format {manifest['format_version']} is not readable by this exporter (it reads "
            f"format {FORMAT_VERSION}); " + ("upgrade torch-stablehlo-exporter" if newer else "re-export the model"))
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise BundleError(f"{file} is corrupt: it lacks {', '.join(missing)}")
    check_readable(manifest["stablehlo_version"], f"bundle {path}")
    return manifest


def checked_file(path: Path, manifest: dict, name: str) -> Path:
    """``path / name`` once its size and sha256 match the manifest."""
    record = manifest["files"].get(name)
    if record is None:
        raise BundleError(f"{path}: the manifest lists no file {name}")
    file = path / name
    if not file.is_file():
        raise BundleError(f"{path}: {name} is missing")
    size = file.stat().st_size
    if size < record["bytes"]:
        raise BundleError(f"{file} is truncated: {size} of {record['bytes']} bytes")
    if size != record["bytes"]:
        raise BundleError(f"{file} is corrupt: {size} bytes, the manifest says {record['bytes']}")
    if _sha256(file) != record["sha256"]:
        raise BundleError(f"{file} is corrupt: its sha256 differs from the manifest's")
    return file


def load_module_text(path: Path, manifest: dict) -> str:
    """The module, read from the portable artifact (checked against the manifest)."""
    return _read_module(checked_file(path, manifest, MODULE_PORTABLE))


def _read_module(file: Path) -> str:
    with make_context() as context:
        try:
            module = stablehlo.deserialize_portable_artifact(context, file.read_bytes())
        except Exception as error:  # noqa: BLE001  (MLIR raises plain errors; say which file)
            raise BundleError(f"{file} is not a readable StableHLO portable artifact: {error}") from None
        return module.operation.get_asm(enable_debug_info=True)


def _weight_files(manifest: dict) -> set[str]:
    return {record["file"] for record in manifest["weights"].values() if record["file"] is not None}


def _read_weights(path: Path, manifest: dict) -> dict[str, torch.Tensor]:
    """Every weight, read from its shard; a weight stored nowhere (a weightless bundle) is a meta
    tensor of its shape and dtype, to be attached."""
    weights: dict[str, torch.Tensor] = {}
    for name in sorted(_weight_files(manifest)):
        file = path / name
        try:
            weights.update(safetensors.torch.load_file(str(file)))
        except safetensors.SafetensorError as error:
            raise BundleError(f"{file} is not a readable safetensors file: {error}") from None
    weights.update({name: placeholder(record["shape"], DTYPES_BY_NAME[record["dtype"]])
                    for name, record in manifest["weights"].items() if record["file"] is None})
    absent = sorted(set(manifest["weights"]) - set(weights))
    if absent:
        raise BundleError(f"{path}: weights {absent[:5]} are listed in the manifest but not stored")
    weights.update({name: weights[target] for name, target in manifest["weight_aliases"].items()})
    return weights


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
