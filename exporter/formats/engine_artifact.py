"""The artifact of ``exporter.export_engine``: the entry points a continuous-batching server drives, sharing one
set of weights, and the runner that drives them on PJRT with the decode state kept on the device.

Entry points (each a ``StableHLOArtifact`` whose ``@main`` takes the weights, then its inputs, flat, in the order of
the typed structures of ``exporter.engine.state``):
- ``prefill(Prompt) -> Prefilled``: a prompt, left-padded to a bucket's length (the bucket is ``@main``'s one
  symbolic dim: compiled once per bucket);
- ``insert(DecodeState, Admission) -> DecodeState``: a prefilled request into a free slot;
- ``generate(DecodeState, steps) -> (DecodeState, tokens [steps_per_call, slots])``: ``steps`` steps over all
  slots in one ``stablehlo.while``;
- ``shift(DecodeState, by) -> DecodeState``: every row moved ``by`` columns left.
``@main`` donates the state's leaves (``tf.aliasing_output``): each call updates the state in place.

A bundle of it is a program bundle (``bundle``) with one module per entry point: ``engine.json`` (the engine's
settings, each entry point's signature and module file, the weights' index, each file's size and sha256), one
portable artifact ``<entry>.mlirbc`` per entry point, and ``weights.safetensors``, holding each weight once (tied
weights once too). ``load_engine`` reads it through the program bundle's checks: one snapshot of the folder, the
manifest under its size bound and checked against ``manifest_schema.ENGINE_MANIFEST``, each module read in a child
process first and its ``@main`` checked against its signature, the weights checked against the index and the
signatures' weight slots.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME, dtype_name

from ..autoshard.plan import ShardingPlan
from ..conversion.signature import Signature
from ..engine.state import Admission, DecodeState, Prefilled, Prompt, Sampling, empty_state
from ..errors import BundleError
from .artifact import StableHLOArtifact
from .bundle import (DEFAULT_SHARD_BYTES, ManifestKind, check_main, file_record, file_records, one_snapshot,
                     read_manifest, read_module, read_signature, read_weights, write_module, write_weights)
from .folders import staged_folder
from .manifest_schema import check_engine_manifest, signature_json
from .snapshot import FolderSnapshot, check_stream, checked_bytes
from .versions import DEFAULT_TARGET, producer_versions, resolve_target_version
from .weights import alias_map

ENGINE_FORMAT = "torch-stablehlo-engine"
ENGINE_FORMAT_VERSION = 3  # 2: modules as portable artifacts, the weights indexed as a program bundle's; 3: k steps
# per generate call
ENGINE_MANIFEST = "engine.json"
PREFILL, INSERT, GENERATE, SHIFT = "prefill", "insert", "generate", "shift"
ENTRY_POINTS = (PREFILL, INSERT, GENERATE, SHIFT)
ENGINE_MANIFEST_KIND = ManifestKind(ENGINE_MANIFEST, ENGINE_FORMAT, ENGINE_FORMAT_VERSION,
                                    ("stablehlo_version", "config", "entry_points", "weights", "weight_aliases",
                                     "files"), check_engine_manifest)


@dataclasses.dataclass(frozen=True)
class SamplingDefaults:
    """The model's ``generation_config`` sampling values as it stores them (None: unset), what a request that
    names none of them falls back to (``generation_settings.resolve_sampling`` reads them as from the config)."""
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """What the engine was exported for, and what its runner needs to build its first state."""
    slots: int
    max_cache_len: int
    buckets: tuple[int, ...]           # the prompt lengths prefill is compiled for, ascending; the last is the longest
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    cache_dtype: str                    # torch dtype name
    layer_shapes: tuple[tuple[int, ...], ...]  # [slots, kv heads, max_cache_len, head dim] per cache tensor
    carried_shapes: tuple[tuple[int, ...], ...]  # the same, as the state carries them
    defaults: SamplingDefaults
    steps_per_call: int = 1             # the most steps one generate call runs

    @property
    def max_prompt_len(self) -> int:
        return self.buckets[-1]

    def bucket(self, prompt_len: int) -> int:
        """The shortest bucket that holds ``prompt_len`` tokens."""
        return next(b for b in self.buckets if b >= prompt_len)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "EngineConfig":
        """The config of a manifest's ``config`` (checked against ``manifest_schema.ENGINE_CONFIG``)."""
        tuples = {"buckets", "eos_token_ids"}
        shapes = {"layer_shapes", "carried_shapes"}
        fields = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name != "defaults"}
        fields = {k: tuple(v) if k in tuples else tuple(tuple(s) for s in v) if k in shapes else v
                  for k, v in fields.items()}
        defaults = {f.name: data["defaults"][f.name] for f in dataclasses.fields(SamplingDefaults)}
        return cls(**fields, defaults=SamplingDefaults(**defaults))

    def empty_state(self) -> DecodeState:
        """Every slot free, the cursor at the longest bucket (so any prompt can be inserted before it)."""
        return empty_state(self.slots, self.max_cache_len, list(self.carried_shapes), DTYPES_BY_NAME[self.cache_dtype],
                           self.vocab_size, self.pad_token_id, cursor=self.max_prompt_len)


class EngineArtifact:
    """The engine's entry points (``ENTRY_POINTS``, each a ``StableHLOArtifact``) over one ``weights`` dict."""

    def __init__(self, entry_points: dict[str, StableHLOArtifact], weights: dict[str, torch.Tensor],
                 config: EngineConfig, *, sharding_plan: ShardingPlan | None = None):
        self.entry_points = entry_points
        self.weights = weights
        self.config = config
        self._sharding_plan = sharding_plan  # the searched plan (with its cost), where shardings="auto" chose it

    @property
    def mesh(self) -> dict[str, int] | None:
        """The device mesh every entry point is partitioned over (``export_engine(mesh=...)``); None: one device."""
        return self.entry_points[GENERATE].signature.mesh

    @property
    def sharding_plan(self) -> ShardingPlan | None:
        """The generate step's plan, which every entry point follows (name -> spec of each weight and state leaf;
        ``print`` it for a picture); None on one device."""
        return self._sharding_plan or self.entry_points[GENERATE].sharding_plan

    def runner(self, platform: str = "cpu") -> "EngineRunner":
        """A runner over these entry points with a fresh state (every slot free)."""
        return EngineRunner(self, platform)

    def to_jax(self) -> dict:
        """One ``JaxModel`` per entry point (its ``.exported`` a ``jax.export.Exported`` over the weights and the
        flat leaves of its inputs); called, it takes and returns the typed structures of ``engine.state`` as plain
        nested tuples in field order (``DecodeState(*result)`` names them again)."""
        return {name: entry.to_jax() for name, entry in self.entry_points.items()}

    def save_tf_saved_model(self, path: str | os.PathLike, *, target_version: str = DEFAULT_TARGET) -> Path:
        """Write a TF SavedModel with one signature per entry point, the decode state in variables (needs
        tensorflow; see ``formats.engine_saved_model``)."""
        if self.mesh:
            raise NotImplementedError(f"cannot save a SavedModel of an engine partitioned over the mesh {self.mesh}: "
                                      "TF's XlaCallModule runs it on one device; export the engine without a mesh "
                                      "for TF serving")
        from .engine_saved_model import save_engine_saved_model  # tensorflow takes seconds to import: only when asked

        return save_engine_saved_model(self, path, target_version=target_version)

    def save(self, path: str | os.PathLike, *, target_version: str = DEFAULT_TARGET) -> Path:
        """Write the bundle folder at ``path`` (see the module's docstring); a failure leaves nothing there."""
        version = resolve_target_version(target_version)
        with staged_folder(path, "an engine folder") as staging:
            index, aliases = write_weights(staging, self.weights, DEFAULT_SHARD_BYTES)
            entries = {}
            for name, entry in self.entry_points.items():
                write_module(staging / f"{name}.mlirbc", entry.stablehlo_text, version)
                entries[name] = {"module": f"{name}.mlirbc", "signature": signature_json(entry.signature)}
            manifest = {"format": ENGINE_FORMAT, "format_version": ENGINE_FORMAT_VERSION,
                        "stablehlo_version": version, "stablehlo_target": target_version, **producer_versions(),
                        "config": self.config.to_json(), "entry_points": entries, "weights": index,
                        "weight_aliases": aliases, "files": file_records(staging)}
            (staging / ENGINE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        return Path(path)


def is_engine_bundle(path: str | os.PathLike) -> bool:
    return os.path.lexists(Path(path) / ENGINE_MANIFEST)


def load_engine(path: str | os.PathLike, platform: str = "cpu", *, trusted: bool = False) -> EngineArtifact:
    """Read an engine bundle (``EngineArtifact.save``) from one snapshot of its folder, checked as ``load_bundle``
    checks a program bundle (``trusted`` as it takes it); BundleError naming what is missing, altered or malformed,
    BundleVersionError for another format version."""
    return one_snapshot(Path(path), lambda folder: _load_engine(folder, platform, trusted))


def _load_engine(folder: FolderSnapshot, platform: str, trusted: bool) -> EngineArtifact:
    path, manifest = folder.path, read_manifest(folder, ENGINE_MANIFEST_KIND)
    where = path / ENGINE_MANIFEST
    if sorted(manifest["entry_points"]) != sorted(ENTRY_POINTS):
        raise BundleError(f"{where} is invalid: manifest field entry_points: expected {list(ENTRY_POINTS)}, got "
                          f"{sorted(manifest['entry_points'])}")
    modules = {entry["module"] for entry in manifest["entry_points"].values()}
    handles = {}
    try:
        for name in sorted(manifest["files"]):  # all opened before any is read: this version
            handles[name] = folder.open(name)
        weights = read_weights(path, manifest, handles)
        for name in sorted(set(handles) - modules - {r["file"] for r in manifest["weights"].values()}):
            check_stream(handles[name], path / name, manifest["files"][name])
        entries = {}
        for name, entry in manifest["entry_points"].items():
            file = path / entry["module"]
            text, main_types = read_module(checked_bytes(handles[entry["module"]], file,
                                                         file_record(path, manifest, entry["module"])), file, trusted)
            entry_where = f"{where} (entry point {name!r})"
            signature = read_signature(entry_where, {**manifest, "signature": entry["signature"]})
            check_main(entry_where, signature, main_types)
            entries[name] = StableHLOArtifact(text, signature, {s.target: weights[s.target] for s in signature.weights},
                                              platform=platform)
    finally:
        for handle in handles.values():
            handle.close()
    config = EngineConfig.from_json(manifest["config"])
    _check_config(where, config, entries)
    return EngineArtifact(entries, weights, config)


def _check_config(where: Path, config: EngineConfig, entries: dict[str, StableHLOArtifact]) -> None:
    """Raise BundleError unless every bucket is a length prefill's symbolic dim takes, generate returns
    ``steps_per_call`` rows of tokens, and the state the runner
    builds from ``config`` (every slot free) is, leaf by leaf in shape and dtype, the state each entry point that
    takes one takes (its first inputs)."""
    for dim, (low, high) in entries[PREFILL].signature.dims.items():
        outside = [b for b in config.buckets if b < (low or 0) or (high is not None and b > high)]
        if outside:
            raise BundleError(f"{where} is invalid: manifest field config.buckets: {outside} outside the range "
                              f"[{low}, {high}] of prefill's dim {dim}")
    try:
        with torch.device("meta"):  # shapes and dtypes only: a config's sizes allocate nothing here
            leaves = pytree.tree_leaves(config.empty_state())
    except RuntimeError as error:
        raise BundleError(f"{where} is invalid: manifest field config: no state can be built of it ({error})") \
            from None
    built = [f"{dtype_name(leaf.dtype)}{list(leaf.shape)}" for leaf in leaves]
    for name in (INSERT, GENERATE, SHIFT):
        slots = entries[name].signature.user_inputs[:len(leaves)]
        taken = [f"{slot.tensor.dtype}{list(slot.tensor.shape)}" if slot.tensor else "no tensor" for slot in slots]
        if taken != built:
            index = next((i for i, (a, b) in enumerate(zip(built, taken)) if a != b), min(len(built), len(taken)))
            raise BundleError(f"{where} is invalid: manifest field config: the state it makes has {len(built)} "
                              f"leaves, leaf {index} {built[index] if index < len(built) else '(none)'}; entry "
                              f"point {name!r} takes {len(taken)}, leaf {index} "
                              f"{taken[index] if index < len(taken) else '(none)'}")
    made = entries[GENERATE].signature.main_outputs[-1].tensor  # the tokens, [steps_per_call, slots]
    if made is None or list(made.shape) != [config.steps_per_call, config.slots]:
        raise BundleError(f"{where} is invalid: manifest field config.steps_per_call: {config.steps_per_call} steps "
                          f"of {config.slots} slots; entry point 'generate' returns tokens "
                          f"{list(made.shape) if made is not None else '(none)'}")


class EngineRunner:
    """Drives the entry points on PJRT: the weights placed once, the ``DecodeState``'s leaves kept on the device
    and donated to each call that takes them (never copied to the host), each module compiled once per shape."""

    def __init__(self, artifact: EngineArtifact, platform: str = "cpu"):
        self.artifact, self.config, self.platform = artifact, artifact.config, platform
        self.mesh = artifact.mesh  # over a mesh, each device holds its shards of the weights and of the state
        specs = {s.target: s.sharding for entry in artifact.entry_points.values() for s in entry.signature.weights}
        copies = {name: (target, specs.get(name)) for name, target in alias_map(artifact.weights).items()}
        unique = sorted(set(copies.values()), key=repr)  # tied weights once per layout
        placed = dict(zip(unique, pjrt.put([to_numpy(artifact.weights[n]) for n, _ in unique], platform, self.mesh,
                                           [spec for _, spec in unique])))
        self._weights = {name: placed[copy] for name, copy in copies.items()}
        self._executables: dict[tuple, pjrt.Executable] = {}
        self.reset()

    def reset(self) -> None:
        """Every slot free again."""
        leaves, self._state_tree = pytree.tree_flatten(self.config.empty_state())
        specs = [slot.sharding for slot in self.artifact.entry_points[GENERATE].signature.user_inputs]
        self._state = pjrt.put([to_numpy(leaf) for leaf in leaves], self.platform, self.mesh, specs[:len(leaves)])

    def prefill(self, prompt: list[int], sampling: Sampling, max_new_tokens: int) -> Prefilled:
        """The first token and caches of ``prompt`` (its caches stay on the device, for ``insert``)."""
        ids, mask = self._padded(prompt)
        first_token, *caches = self._run(PREFILL, Prompt(ids, mask, torch.tensor([max_new_tokens]), sampling),
                                         takes_state=False)
        return Prefilled(first_token, tuple(caches))

    def insert(self, slot: int, prompt: list[int], max_new_tokens: int, sampling: Sampling,
               prefilled: Prefilled) -> None:
        """The prefilled request into ``slot`` (free), its first token at the cursor."""
        def scalar(value):
            return torch.tensor(value, dtype=torch.int64)
        self._run(INSERT, Admission(scalar(slot), self._padded(prompt)[0], scalar(len(prompt)),
                                    scalar(max_new_tokens), sampling, prefilled))

    def _padded(self, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``prompt`` left-padded to its bucket, and its attention mask ([1, bucket] each)."""
        bucket = self.config.bucket(len(prompt))
        ids = torch.full((1, bucket), self.config.pad_token_id, dtype=torch.int64)
        ids[0, bucket - len(prompt):] = torch.tensor(prompt, dtype=torch.int64)
        mask = torch.zeros(1, bucket, dtype=torch.int64)
        mask[0, bucket - len(prompt):] = 1
        return ids, mask

    def generate(self, steps: int = 1) -> np.ndarray:
        """``steps`` steps (1 to ``config.steps_per_call``) over all slots in one call: [steps, slots], the token
        each slot made at each step (the pad token where it is done)."""
        if not 1 <= steps <= self.config.steps_per_call:
            raise ValueError(f"steps must be from 1 to steps_per_call={self.config.steps_per_call}, got {steps}")
        (tokens,) = self._run(GENERATE, torch.tensor(steps, dtype=torch.int64))
        return np.asarray(tokens)[:steps]

    def shift(self, by: int) -> None:
        """Every row ``by`` columns to the left (the cursor too)."""
        self._run(SHIFT, torch.tensor(by, dtype=torch.int64))

    def _run(self, name: str, inputs, takes_state: bool = True) -> list:
        """Call entry point ``name`` on the weights, the state (where it takes it) and the leaves of ``inputs``;
        the new state is kept, the other results returned (on the device)."""
        entry = self.artifact.entry_points[name]
        leaves = pytree.tree_leaves(inputs)
        hosts = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        weights = [self._weights[slot.target] for slot in entry.signature.weights]
        state = self._state if takes_state else []
        shapes = tuple(tuple(a.shape) for a in [*weights, *state, *leaves])
        key = (name, shapes if entry.signature.is_dynamic else ())
        if key not in self._executables:
            self._executables[key] = pjrt.Executable(entry.runnable_text(), self.platform,
                                                     arg_shapes=shapes if key[1] else None, mesh=self.mesh)
        executable = self._executables[key]
        if self.mesh is None:
            placed = dict(zip(hosts, pjrt.put([to_numpy(leaves[i]) for i in hosts], self.platform)))
        else:  # each host input split (or replicated) as the program takes it
            first = len(weights) + len(state)
            placed = {i: executable.put([to_numpy(leaves[i])], first=first + i)[0] for i in hosts}
        arrays = executable.execute([*weights, *state, *(placed.get(i, leaf) for i, leaf in enumerate(leaves))],
                                    laid_out=True)
        if takes_state:
            self._state, arrays = arrays[:len(state)], arrays[len(state):]
        return arrays
