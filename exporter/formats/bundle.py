"""The bundle folder: a portable StableHLO module, its weights, and a manifest that checks them.

    manifest.json        format and versions; the signature (names, dtypes, shapes with symbolic
                         dims and their ranges, pytree specs, the platforms the module is lowered for);
                         the weights index; size and sha256 per file
    module.mlirbc        the StableHLO portable artifact, at the chosen target version
    module.mlir          the readable module with source locations (optional)
    weights.safetensors  the weights; above the shard size: weights-00001-of-0000N.safetensors, ...
                         (none for a weightless bundle: its manifest lists each weight's name, shape and
                         dtype with ``"file": null``; ``load_artifact(path, weights=...)`` attaches them)

``save_bundle`` writes the folder atomically; ``load_bundle`` reads one snapshot of it (``snapshot``: one version
whole, even while a save replaces it) and checks every file against the manifest before it uses it. A bundle over a device mesh records it and each tensor's
sharding in the signature (and the mesh at the manifest's top level); ``load_bundle(local_shards=True)`` reads
no weight, but gives a reader per weight that reads only the slices asked for (a process's own shards).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import safetensors
import safetensors.torch
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.runtime import settings
from torch_stablehlo.stablehlo_ir.bytecode_check import read_in_child
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.refine import main_function
from torch_stablehlo.stablehlo_ir.passes import portable_artifact
from torch_stablehlo.stablehlo_ir.dtypes import ELEMENT_TYPES, to_numpy
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME, dtype_name

from ..errors import BundleError, BundleVersionError
from .folders import recover_interrupted_swap, staged_folder
from ..terminal import progress
from ..conversion.signature import Signature
from ..conversion.trees import TreeSpecError
from .manifest_schema import bounded_int, check_manifest, check_slots, described, signature_from_json, signature_json
from .snapshot import FolderSnapshot, check_stream, checked_bytes, checked_mapping, handle_path
from .stored_tensors import stored_tensors
from .versions import DEFAULT_TARGET, check_readable, producer_versions, resolve_target_version
from .weights import alias_map, has_data, nbytes, placeholder

FORMAT = "torch-stablehlo-bundle"
FORMAT_VERSION = 3  # 3: state slots (kind "state", their exported values stored with the weights) donated by @main
MANIFEST, MODULE_PORTABLE, MODULE_TEXT = "manifest.json", "module.mlirbc", "module.mlir"
DEFAULT_SHARD_BYTES = 2 * 1024 ** 3
SNAPSHOT_TRIES = 5
"""Reads of a bundle started over because a save replaced its folder meanwhile, before the last failure is raised."""
SIZE_DTYPE = "int64"
"""The dtype of ``@main``'s data-dependent size results (``Signature.sizes``)."""
T = TypeVar("T")
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
    of the file a process's devices hold are read, from the very file the load checked (``handle``, held open)."""

    def __init__(self, handle, file: Path, name: str, shape):
        self.handle, self.file, self.name, self.shape = handle, file, name, tuple(shape)

    def stored_like(self) -> torch.Tensor:
        """An empty tensor of the stored weight's dtype, in the stored shape (read from the file's header)."""
        with safetensors.safe_open(handle_path(self.handle), framework="pt") as handle:
            part = handle.get_slice(self.name)
            shape = part.get_shape()
            empty = part[tuple(slice(0, 0) for _ in shape)] if shape else handle.get_tensor(self.name)
        return torch.empty(shape, dtype=empty.dtype, device="meta")

    def __getitem__(self, index: tuple):
        with safetensors.safe_open(handle_path(self.handle), framework="pt") as handle:
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
    with staged_folder(path, "an artifact folder", bundle_files) as staging:
        write_module(staging / MODULE_PORTABLE, stablehlo_text, version)
        if include_text:
            (staging / MODULE_TEXT).write_text(stablehlo_text)
        index, aliases = write_weights(staging, weights, shard_bytes)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "stablehlo_version": version,
                    "stablehlo_target": target_version, **producer_versions(),
                    "signature": signature_json(signature), "mesh": signature.mesh, "weights": index,
                    "weight_aliases": aliases, "files": file_records(staging)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return Path(path)


def write_module(file: Path, stablehlo_text: str, version: str) -> None:
    """The module as a portable artifact of StableHLO ``version`` at ``file`` (known readable by this process)."""
    portable = portable_artifact(stablehlo_text, version)
    file.write_bytes(portable)
    _READABLE.add(hashlib.sha256(portable).hexdigest())


def write_weights(staging: Path, weights: dict[str, torch.Tensor], shard_bytes: int) -> tuple[dict, dict]:
    """The weights written into ``staging`` (each stored once, in shards of at most ``shard_bytes``; one without
    data listed only), and the manifest's ``weights`` index and ``weight_aliases`` of them."""
    aliases = alias_map(weights)
    unique = [name for name, target in aliases.items() if name == target]
    stored = {name: weights[name].detach().contiguous() for name in unique if has_data(weights[name])}
    index = {name: _record(None, weights[name]) for name in unique if not has_data(weights[name])}
    shards = _shards(stored, shard_bytes) if stored else {}
    with progress(desc="saving weights", unit="B", unit_scale=True,
                  total=sum(nbytes(t) for t in stored.values())) as bar:
        for file_name, names in shards.items():
            safetensors.torch.save_file({name: stored[name] for name in names}, str(staging / file_name))
            index.update({name: _record(file_name, stored[name]) for name in names})
            bar.update(sum(nbytes(stored[name]) for name in names))
    return index, {name: target for name, target in aliases.items() if name != target}


def file_records(staging: Path) -> dict:
    """The manifest's ``files``: size and sha256 of each file in ``staging``."""
    return {file.name: {"bytes": file.stat().st_size, "sha256": _sha256(file)} for file in sorted(staging.iterdir())}


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
    ``read_module``). Every file comes from one snapshot of the folder (see ``one_snapshot``)."""
    return one_snapshot(Path(path), lambda folder: _load_bundle(folder, local_shards, trusted))


def inspect_bundle(path: str | os.PathLike) -> tuple[dict, str, Signature]:
    """The manifest, module text and signature of a bundle, checked as ``load_bundle`` checks them (its weights
    are not read)."""
    return one_snapshot(Path(path), _inspect)


def one_snapshot(path: Path, read: Callable[[FolderSnapshot], T]) -> T:
    """``read(folder)`` of the folder at ``path`` opened once (``snapshot``): every file it reads is of one version.
    Where it fails and a save swapped another folder in meanwhile, it starts over on that one (at most
    ``SNAPSHOT_TRIES`` times): a concurrent save neither makes a healthy bundle look corrupt nor mixes versions."""
    for attempt in range(1, SNAPSHOT_TRIES + 1):
        with open_folder(path) as folder:
            try:
                return read(folder)
            except BundleError:
                if attempt == SNAPSHOT_TRIES or not folder.replaced():
                    raise
    raise AssertionError("unreachable: the last try returns or raises")


def open_folder(path: Path) -> FolderSnapshot:
    """The bundle folder at ``path``, opened once (after putting back the copy an interrupted save left)."""
    if not os.path.isdir(path) and recover_interrupted_swap(path):
        warnings.warn(f"{path} was missing after an interrupted save; its previous copy was put back")
    return FolderSnapshot(path)


def _inspect(folder: FolderSnapshot) -> tuple[dict, str, Signature]:
    path, manifest = folder.path, read_manifest(folder)
    record = file_record(path, manifest, MODULE_PORTABLE)
    with folder.open(MODULE_PORTABLE) as handle:
        text, main_types = read_module(checked_bytes(handle, path / MODULE_PORTABLE, record), path / MODULE_PORTABLE)
    signature = read_signature(str(path / MANIFEST), manifest)
    check_main(str(path / MANIFEST), signature, main_types)
    return manifest, text, signature


def _load_bundle(folder: FolderSnapshot, local_shards: bool, trusted: bool) -> Bundle:
    path, manifest = folder.path, read_manifest(folder)
    weight_files = _weight_files(manifest)
    record = file_record(path, manifest, MODULE_PORTABLE)
    handles = {}
    try:
        for name in sorted(set(manifest["files"]) | weight_files):  # all opened before any is read: this version
            handles[name] = folder.open(name)
        for name in sorted(set(handles) - weight_files - {MODULE_PORTABLE}):
            check_stream(handles[name], path / name, manifest["files"][name])
        data = checked_bytes(handles[MODULE_PORTABLE], path / MODULE_PORTABLE, record)
        (module, main_types) = read_module(data, path / MODULE_PORTABLE, trusted)
        signature = read_signature(str(path / MANIFEST), manifest)
        check_main(str(path / MANIFEST), signature, main_types)
        if local_shards:
            return _local_shards(path, manifest, module, signature, {name: handles.pop(name) for name in weight_files})
        return Bundle(module, signature, read_weights(path, manifest, handles), manifest)
    finally:
        for handle in handles.values():
            handle.close()


def _local_shards(path: Path, manifest: dict, module: str, signature: Signature, handles: dict) -> Bundle:
    """The bundle with placeholder weights and a ``SliceReader`` per stored one, over the files ``handles`` hold
    (checked here, kept open)."""
    for name, handle in handles.items():
        check_stream(handle, path / name, manifest["files"][name])
    records = {name: manifest["weights"][manifest["weight_aliases"].get(name, name)]
               for name in [*manifest["weights"], *manifest["weight_aliases"]]}
    weights = {name: placeholder(r["shape"], DTYPES_BY_NAME[r["dtype"]]) for name, r in records.items()}
    readers = {name: SliceReader(handles[r["file"]], path / r["file"], manifest["weight_aliases"].get(name, name),
                                 r["shape"]) for name, r in records.items() if r["file"] is not None}
    for name, reader in readers.items():
        try:
            stored = reader.stored_like()
        except safetensors.SafetensorError as error:
            raise BundleError(f"{reader.file}: cannot read weight {reader.name!r}: {error}") from None
        _check_stored(reader.file, reader.name, stored, weights[name])
    return Bundle(module, signature, weights, manifest, readers)


def read_signature(where: str, manifest: dict) -> Signature:
    """The manifest's signature (``where``: the manifest file, as errors name it), its pytree specs read (see ``conversion.trees``) and matching its slots."""
    signature = signature_from_json(manifest["signature"])
    check_slots(manifest, signature, where)
    trees = []
    for which in ("in_tree", "out_tree"):
        try:
            trees.append(getattr(signature, which))
        except TreeSpecError as error:
            field = which.replace("tree", "spec")
            raise BundleError(f"{where} is invalid: manifest field signature.{field}: {error}") from None
    in_spec, out_spec = trees
    inputs, outputs = len(signature.user_inputs), len(signature.user_outputs)
    if in_spec.type is not tuple or in_spec.num_children != 2 or in_spec.num_leaves != inputs:
        raise BundleError(f"{where} is invalid: signature.in_spec: expected (args, kwargs) with {inputs} "
                          f"leaves, got {in_spec.num_leaves} leaves under {in_spec.type}")
    if out_spec.num_leaves != outputs:
        raise BundleError(f"{where} is invalid: signature.out_spec: expected {outputs} leaves (the user "
                          f"outputs), got {out_spec.num_leaves}")
    return signature


def load_manifest(path: str | os.PathLike) -> dict:
    """The bundle's manifest, once its format and StableHLO version are known to be readable here."""
    with open_folder(Path(path)) as folder:
        return read_manifest(folder)


@dataclass(frozen=True)
class ManifestKind:
    """What a folder's manifest is: its file name, its ``format`` and ``format_version``, the fields needed before
    its schema is checked, and the check of its schema (``check(manifest, file)``: BundleError naming the field)."""
    file: str
    format: str
    version: int
    required: tuple[str, ...]
    check: Callable[[dict, str], None]


PROGRAM_MANIFEST = ManifestKind(MANIFEST, FORMAT, FORMAT_VERSION, _REQUIRED, check_manifest)


def read_manifest(folder: FolderSnapshot, kind: ManifestKind = PROGRAM_MANIFEST) -> dict:
    """The folder's manifest of ``kind``, read whole under ``MAX_MANIFEST_BYTES``, once its format, format version,
    StableHLO version and schema are known to be readable here."""
    file = folder.path / kind.file
    bound = settings.MAX_MANIFEST_BYTES
    try:
        data = folder.read(kind.file, bound.value(), bound.variable)
        manifest = json.loads(data, parse_int=bounded_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{file} is corrupt: not valid JSON ({error})") from None
    except RecursionError:
        raise BundleError(f"{file} is corrupt: nested too deeply") from None
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise BundleError(f"{file} is not a bundle manifest (no format_version)")
    if manifest.get("format") != kind.format:
        raise BundleError(f"{file} is not a bundle manifest: its format is {described(manifest.get('format'))}, "
                          f"expected {kind.format!r}")
    version = manifest["format_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleError(f"{file} is invalid: manifest field format_version: expected an integer (this exporter "
                          f"reads {kind.version}), got {described(version)}")
    if version != kind.version:
        raise BundleVersionError(
            f"{folder.path}: bundle format {version} is not readable by this exporter (it reads format "
            f"{kind.version}); " + ("upgrade torch-stablehlo-exporter" if version > kind.version
                                    else "re-export the model"))
    missing = [key for key in kind.required if key not in manifest]
    if missing:
        raise BundleError(f"{file} is corrupt: it lacks {', '.join(missing)}")
    check_readable(manifest["stablehlo_version"], f"bundle {folder.path}")
    kind.check(manifest, str(file))
    return manifest


def file_record(path: Path, manifest: dict, name: str) -> dict:
    record = manifest["files"].get(name)
    if record is None:
        raise BundleError(f"{path}: the manifest lists no file {name}")
    return record


def checked_file(path: Path, manifest: dict, name: str) -> Path:
    """``path / name`` once its size and sha256 match the manifest (for a tool that reads it by its path)."""
    with open_folder(path) as folder, folder.open(name) as handle:
        check_stream(handle, path / name, file_record(path, manifest, name))
    return path / name


def read_module(data: bytearray, file: Path, trusted: bool = False) -> tuple[str, tuple[list, list]]:
    """The module's text, and the type (``_TensorType``) of each of ``@main``'s arguments and results. Unless
    ``trusted`` or this process wrote or checked the same bytes before, they are first read in a child process
    (``stablehlo_ir.bytecode_check``), so that crafted bytes cannot crash this one; the bytes parsed here are
    the bytes checked there."""
    digest = hashlib.sha256(data).hexdigest()
    if not trusted and digest not in _READABLE:
        problem = read_in_child(data, settings.CHECK_MEMORY_BYTES.value(), settings.CHECK_SECONDS.value())
        if problem is not None:
            raise BundleError(f"{file} is not a readable StableHLO portable artifact: {problem}")
        _READABLE.add(digest)
    with make_context() as context:
        try:
            module = stablehlo.deserialize_portable_artifact(context, bytes(data))
        except Exception as error:  # noqa: BLE001  (MLIR raises plain errors; say which file)
            raise BundleError(f"{file} is not a readable StableHLO portable artifact: {error}") from None
        try:
            main = main_function(module)
        except ValueError as error:
            raise BundleError(f"{file}: {error}") from None
        types = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        return module.operation.get_asm(enable_debug_info=True), tuple(
            [_tensor_type(t) for t in group] for group in (types.inputs, types.results))


@dataclass(frozen=True)
class _MainType:
    """One of ``@main``'s arguments or results as the module declares it."""
    shape: list | None    # its dims (None where dynamic); None for a type that is no ranked tensor
    element: str | None   # its element type as MLIR writes it (``ELEMENT_TYPES``); a quantized one's storage type


def _tensor_type(mlir_type) -> _MainType:
    if mlir_type.typeid != ir.RankedTensorType.static_typeid:
        return _MainType(None, None)
    tensor = ir.RankedTensorType(mlir_type)
    element = str(tensor.element_type)
    stored = re.match(r"!quant\.uniform<(u?)(i\d+)", element)  # held in its storage type (u8: MLIR's ui8)
    return _MainType([None if ir.ShapedType.is_dynamic_size(d) else d for d in tensor.shape],
                     f"{stored[1] and 'u'}{stored[2]}" if stored else element)


def check_main(where: str, signature: Signature, main_types: tuple[list, list]) -> None:
    """Raise BundleError unless the signature's ``@main`` arguments and results are the module's: count, rank,
    static dims (a symbolic dim where the module's is dynamic, a data-dependent one of any size) and element type
    (PJRT takes any buffer of the right size: a state of another dtype would be read as the module's)."""
    arguments = [s.tensor for s in signature.main_inputs]
    results = [s.tensor for s in signature.main_outputs] + [None] * (len(signature.sizes) + len(signature.call_sizes))
    for what, specs, types in (("arguments", arguments, main_types[0]), ("results", results, main_types[1])):
        if len(specs) != len(types):
            raise BundleError(f"{where} does not fit its module: the signature lists {len(specs)} @main "
                              f"{what}, the module has {len(types)}")
        for index, (spec, declared) in enumerate(zip(specs, types)):
            shape = declared.shape
            expected = None if spec is None else [d if isinstance(d, int) else None for d in spec.shape]
            if shape is not None and spec is not None and len(shape) == len(expected):
                # a data-dependent dim is held padded: static in the module, any size
                shape = [None if d in signature.sizes else s for d, s in zip(spec.shape, shape)]
            if shape is None or (spec is not None and expected != shape) or (spec is None and shape != []):
                raise BundleError(f"{where} does not fit its module: @main's {what[:-1]} {index} is "
                                  f"{shape} in the module, {expected if spec else 'a 0-d size'} in the signature")
            dtype = spec.dtype if spec else SIZE_DTYPE
            if declared.element != ELEMENT_TYPES[DTYPES_BY_NAME[dtype]]:
                raise BundleError(f"{where} does not fit its module: @main's {what[:-1]} {index}"
                                  f"{f' ({spec.name})' if spec else ''} holds {declared.element} in the module, "
                                  f"{dtype} ({ELEMENT_TYPES[DTYPES_BY_NAME[dtype]]}) in the signature")


def _weight_files(manifest: dict) -> set[str]:
    return {record["file"] for record in manifest["weights"].values() if record["file"] is not None}


def read_weights(path: Path, manifest: dict, handles: dict) -> dict[str, torch.Tensor]:
    """Every weight, read from its shard (``handles``: the open files; each read once, its checksum checked on the
    mapping the weights are views of); a weight stored nowhere (a weightless bundle) is a meta tensor of its shape and dtype, to be
    attached."""
    weights: dict[str, torch.Tensor] = {}
    for name in sorted(_weight_files(manifest)):
        file = path / name
        stored = stored_tensors(checked_mapping(handles[name], file, manifest["files"][name]), file)
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
