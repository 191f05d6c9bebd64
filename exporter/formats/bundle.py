"""The bundle folder: a portable StableHLO module, its weights, and a manifest that checks them.

    manifest.json        format and versions; the signature (names, dtypes, shapes with symbolic
                         dims and their ranges, pytree specs, the platforms the module is lowered for);
                         the weights index; size and sha256 per file
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
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.stablehlo_ir.bytecode_check import read_in_child
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.refine import main_function
from torch_stablehlo.stablehlo_ir.passes import portable_artifact
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME, dtype_name

from ..errors import BundleError, BundleVersionError
from .folders import recover_interrupted_swap, staged_folder
from ..terminal import progress
from ..conversion.signature import Signature
from ..conversion.trees import TreeSpecError
from .manifest_schema import check_manifest, check_slots, plain_file_name
from .versions import DEFAULT_TARGET, check_readable, producer_versions, resolve_target_version
from .weights import alias_map, has_data, nbytes, placeholder

FORMAT = "torch-stablehlo-bundle"
FORMAT_VERSION = 3  # 3: state slots (kind "state", their exported values stored with the weights) donated by @main
MANIFEST, MODULE_PORTABLE, MODULE_TEXT = "manifest.json", "module.mlirbc", "module.mlir"
DEFAULT_SHARD_BYTES = 2 * 1024 ** 3
_REQUIRED = ("stablehlo_version", "signature", "weights", "weight_aliases", "files")
_READABLE: set[str] = set()
"""The sha256 of each portable artifact this process wrote, or read in a child process without harm."""


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

    def stored_like(self) -> torch.Tensor:
        """An empty tensor of the stored weight's dtype, in the stored shape (read from the file's header)."""
        with safetensors.safe_open(str(self.file), framework="pt") as handle:
            part = handle.get_slice(self.name)
            shape = part.get_shape()
            empty = part[tuple(slice(0, 0) for _ in shape)] if shape else handle.get_tensor(self.name)
        return torch.empty(shape, dtype=empty.dtype, device="meta")

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
    with staged_folder(path, "an artifact folder", bundle_files) as staging:
        portable = portable_artifact(stablehlo_text, version)
        (staging / MODULE_PORTABLE).write_bytes(portable)
        _READABLE.add(hashlib.sha256(portable).hexdigest())
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


def bundle_files(folder: Path) -> set[str] | None:
    """The files of the bundle at ``folder`` that its manifest lists (with the manifest); None if it is not one."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return None
    return {MANIFEST, *manifest["files"]}


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


def load_bundle(path: str | os.PathLike, *, local_shards: bool = False, trusted: bool = False) -> Bundle:
    """Read a bundle, after checking its format, StableHLO version, manifest schema and every file's place (inside
    the folder, no link), size and checksum. ``local_shards``: the weights stay in their files (placeholders of
    their shape and dtype, checked against the files), each with a ``SliceReader``. ``trusted``: the caller vouches
    for the module's bytes, which are then read in-process without a check in a child process first (see
    ``_read_module``). A check that fails while a save swapped a new folder in is tried once more, on the new one."""
    path = Path(path)
    folder = _folder_id(path)
    try:
        return _load_bundle(path, local_shards, trusted)
    except BundleError:
        if folder is None or _folder_id(path) in (None, folder):
            raise
    return _load_bundle(path, local_shards, trusted)


def _folder_id(path: Path) -> tuple | None:
    """Which folder stands at ``path`` now (a save's swap puts another one there); None if none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _load_bundle(path: Path, local_shards: bool, trusted: bool) -> Bundle:
    manifest = load_manifest(path)
    for name in sorted(set(manifest["files"]) | _weight_files(manifest)):
        checked_file(path, manifest, name)
    (module, main_shapes), signature = _read_module(path / MODULE_PORTABLE, trusted), _signature(path, manifest)
    _check_main(path, signature, main_shapes)
    if not local_shards:
        return Bundle(module, signature, _read_weights(path, manifest), manifest)
    records = {name: manifest["weights"][manifest["weight_aliases"].get(name, name)]
               for name in [*manifest["weights"], *manifest["weight_aliases"]]}
    weights = {name: placeholder(r["shape"], DTYPES_BY_NAME[r["dtype"]]) for name, r in records.items()}
    readers = {name: SliceReader(path / r["file"], manifest["weight_aliases"].get(name, name), r["shape"])
               for name, r in records.items() if r["file"] is not None}
    for name, reader in readers.items():
        try:
            stored = reader.stored_like()
        except safetensors.SafetensorError as error:
            raise BundleError(f"{reader.file}: cannot read weight {reader.name!r}: {error}") from None
        _check_stored(reader.file, reader.name, stored, weights[name])
    return Bundle(module, signature, weights, manifest, readers)


def _signature(path: Path, manifest: dict) -> Signature:
    """The manifest's signature, its pytree specs read (see ``conversion.trees``) and matching its slots."""
    signature = Signature.from_json(manifest["signature"])
    check_slots(manifest, signature, str(path / MANIFEST))
    for which in ("in_spec", "out_spec"):
        try:
            signature.tree(which)
        except TreeSpecError as error:
            raise BundleError(f"{path / MANIFEST} is invalid: manifest field signature.{which}: {error}") from None
    in_spec, out_spec = signature.tree("in_spec"), signature.tree("out_spec")
    inputs, outputs = len(signature.user_inputs), len(signature.user_outputs)
    if in_spec.type is not tuple or in_spec.num_children != 2 or in_spec.num_leaves != inputs:
        raise BundleError(f"{path / MANIFEST} is invalid: signature.in_spec: expected (args, kwargs) with {inputs} "
                          f"leaves, got {in_spec.num_leaves} leaves under {in_spec.type}")
    if out_spec.num_leaves != outputs:
        raise BundleError(f"{path / MANIFEST} is invalid: signature.out_spec: expected {outputs} leaves (the user "
                          f"outputs), got {out_spec.num_leaves}")
    return signature


def load_manifest(path: str | os.PathLike) -> dict:
    """The bundle's manifest, once its format and StableHLO version are known to be readable here."""
    path = Path(path)
    file = path / MANIFEST
    if not path.is_dir() and recover_interrupted_swap(path):
        warnings.warn(f"{path} was missing after an interrupted save; its previous copy was put back")
    if not path.is_dir():
        raise BundleError(f"{path}: no such bundle folder")
    if not file.is_file():
        raise BundleError(f"{path} is not a bundle: {MANIFEST} is missing")
    inside(path, MANIFEST)
    try:
        manifest = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{file} is corrupt: not valid JSON ({error})") from None
    except RecursionError:
        raise BundleError(f"{file} is corrupt: nested too deeply") from None
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
    check_manifest(manifest, str(file))
    return manifest


def checked_file(path: Path, manifest: dict, name: str) -> Path:
    """``path / name`` once its size and sha256 match the manifest."""
    record = manifest["files"].get(name)
    if record is None:
        raise BundleError(f"{path}: the manifest lists no file {name}")
    file = inside(path, name)
    size = file.stat().st_size
    if size < record["bytes"]:
        raise BundleError(f"{file} is truncated: {size} of {record['bytes']} bytes")
    if size != record["bytes"]:
        raise BundleError(f"{file} is corrupt: {size} bytes, the manifest says {record['bytes']}")
    if _sha256(file) != record["sha256"]:
        raise BundleError(f"{file} is corrupt: its sha256 differs from the manifest's")
    return file


def inside(path: Path, name: str) -> Path:
    """``path / name`` once it is known to be a regular file (not a link) right inside the folder ``path``; checked
    before the file is opened. ``name`` is a manifest's: the schema allows plain names only, checked again here."""
    file = path / name
    if not plain_file_name(name) or file.parent != path:
        raise BundleError(f"{path}: the manifest names the file {name!r}; a bundle's files are plain names inside it")
    try:
        mode = os.lstat(file).st_mode
    except FileNotFoundError:
        raise BundleError(f"{path}: {name} is missing") from None
    if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
        raise BundleError(f"{path}: {name} is {'a link' if stat.S_ISLNK(mode) else 'not a regular file'}; a "
                          "bundle's files are regular files inside its folder")
    return file


def load_module_text(path: Path, manifest: dict) -> str:
    """The module, read from the portable artifact (checked against the manifest)."""
    return _read_module(checked_file(path, manifest, MODULE_PORTABLE))[0]


def _read_module(file: Path, trusted: bool = False) -> tuple[str, tuple[list, list]]:
    """The module's text, and the shapes of ``@main``'s arguments and results. Unless ``trusted`` or this process wrote or checked the same bytes before, they are
    first read in a child process (``stablehlo_ir.bytecode_check``), so that crafted bytes cannot crash this one."""
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if not trusted and digest not in _READABLE:
        problem = read_in_child(data)
        if problem is not None:
            raise BundleError(f"{file} is not a readable StableHLO portable artifact: {problem}")
        _READABLE.add(digest)
    with make_context() as context:
        try:
            module = stablehlo.deserialize_portable_artifact(context, data)
        except Exception as error:  # noqa: BLE001  (MLIR raises plain errors; say which file)
            raise BundleError(f"{file} is not a readable StableHLO portable artifact: {error}") from None
        try:
            main = main_function(module)
        except ValueError as error:
            raise BundleError(f"{file}: {error}") from None
        types = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        shapes = tuple([_shape(t) for t in group] for group in (types.inputs, types.results))
        return module.operation.get_asm(enable_debug_info=True), shapes


def _shape(mlir_type) -> list | None:
    """A tensor type's dims (None where dynamic); None for a type that is no ranked tensor."""
    if mlir_type.typeid != ir.RankedTensorType.static_typeid:
        return None
    tensor = ir.RankedTensorType(mlir_type)
    return [None if ir.ShapedType.is_dynamic_size(d) else d for d in tensor.shape]


def _check_main(path: Path, signature: Signature, main_shapes: tuple[list, list]) -> None:
    """Raise BundleError unless the signature's ``@main`` arguments and results are the module's (count, rank and
    static dims; a symbolic dim where the module's is dynamic, a data-dependent one of any size)."""
    arguments = [s.tensor for s in signature.main_inputs]
    results = [s.tensor for s in signature.main_outputs] + [None] * len(signature.sizes)
    for what, specs, shapes in (("arguments", arguments, main_shapes[0]), ("results", results, main_shapes[1])):
        if len(specs) != len(shapes):
            raise BundleError(f"{path / MANIFEST} does not fit its module: the signature lists {len(specs)} @main "
                              f"{what}, the module has {len(shapes)}")
        for index, (spec, shape) in enumerate(zip(specs, shapes)):
            expected = None if spec is None else [d if isinstance(d, int) else None for d in spec.shape]
            if shape is not None and spec is not None and len(shape) == len(expected):
                # a data-dependent dim is held padded: static in the module, any size
                shape = [None if d in signature.sizes else s for d, s in zip(spec.shape, shape)]
            if shape is None or (spec is not None and expected != shape) or (spec is None and shape != []):
                raise BundleError(f"{path / MANIFEST} does not fit its module: @main's {what[:-1]} {index} is "
                                  f"{shape} in the module, {expected if spec else 'a 0-d size'} in the signature")


def _weight_files(manifest: dict) -> set[str]:
    return {record["file"] for record in manifest["weights"].values() if record["file"] is not None}


def _read_weights(path: Path, manifest: dict) -> dict[str, torch.Tensor]:
    """Every weight, read from its shard; a weight stored nowhere (a weightless bundle) is a meta
    tensor of its shape and dtype, to be attached."""
    weights: dict[str, torch.Tensor] = {}
    for name in sorted(_weight_files(manifest)):
        file = path / name
        try:
            stored = safetensors.torch.load_file(str(file))
        except safetensors.SafetensorError as error:
            raise BundleError(f"{file} is not a readable safetensors file: {error}") from None
        expected = {weight: record for weight, record in manifest["weights"].items() if record["file"] == name}
        for weight, tensor in stored.items():
            record = expected.get(weight)
            if record is None:
                raise BundleError(f"{file} holds {weight!r}, which the manifest does not place in it")
            _check_stored(file, weight, tensor, placeholder(record["shape"], DTYPES_BY_NAME[record["dtype"]]))
        weights.update(stored)
    weights.update({name: placeholder(record["shape"], DTYPES_BY_NAME[record["dtype"]])
                    for name, record in manifest["weights"].items() if record["file"] is None})
    absent = sorted(set(manifest["weights"]) - set(weights))
    if absent:
        raise BundleError(f"{path}: weights {absent[:5]} are listed in the manifest but not stored")
    weights.update({name: weights[target] for name, target in manifest["weight_aliases"].items()})
    return weights


def _check_stored(file: Path, name: str, stored: torch.Tensor, expected: torch.Tensor) -> None:
    """Raise BundleError if the weight ``name`` stored in ``file`` has another shape or dtype than the manifest's."""
    if stored.dtype != expected.dtype or tuple(stored.shape) != tuple(expected.shape):
        raise BundleError(f"{file}: weight {name!r} is stored as {dtype_name(stored.dtype)}{list(stored.shape)}; the "
                          f"manifest says {dtype_name(expected.dtype)}{list(expected.shape)}")


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
