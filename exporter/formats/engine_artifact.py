"""The artifact of ``exporter.export_engine``: the entry points a continuous-batching server drives, sharing one
set of weights, and the runner that drives them on PJRT with the decode state kept on the device.

Entry points (each a ``StableHLOArtifact`` whose ``@main`` takes the weights, then its inputs, flat, in the order of
the typed structures of ``exporter.engine.state``):
- ``prefill(Prompt) -> Prefilled``: a prompt, left-padded to a bucket's length (the bucket is ``@main``'s one
  symbolic dim: compiled once per bucket);
- ``insert(DecodeState, Admission) -> DecodeState``: a prefilled request into a free slot;
- ``generate(DecodeState) -> (DecodeState, tokens [slots])``: one step over all slots;
- ``shift(DecodeState, by) -> DecodeState``: every row moved ``by`` columns left.
``@main`` donates the state's leaves (``tf.aliasing_output``): each call updates the state in place.

A bundle of it is a folder: ``engine.json`` (the engine's settings, each entry point's signature and module file,
the weights' index and the files' digests), one ``<entry>.mlir`` per entry point, and ``weights.safetensors``,
holding each weight once (tied weights once too).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.utils._pytree as pytree

from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME

from ..conversion.signature import Signature
from ..engine.state import Admission, DecodeState, Prefilled, Prompt, Sampling, empty_state
from ..errors import BundleError
from .artifact import StableHLOArtifact
from .folders import staged_folder
from .weights import alias_map

ENGINE_FORMAT = "torch-stablehlo-engine"
ENGINE_FORMAT_VERSION = 1
ENGINE_MANIFEST = "engine.json"
WEIGHTS_FILE = "weights.safetensors"
PREFILL, INSERT, GENERATE, SHIFT = "prefill", "insert", "generate", "shift"
ENTRY_POINTS = (PREFILL, INSERT, GENERATE, SHIFT)


@dataclasses.dataclass(frozen=True)
class SamplingDefaults:
    """The model's ``generation_config`` sampling values as it stores them (None: unset), what a request that
    names none of them falls back to (``generate.settings.resolve_sampling`` reads them as from the config)."""
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
        tuples = {"buckets", "eos_token_ids"}
        shapes = {"layer_shapes", "carried_shapes"}
        fields = {k: tuple(v) if k in tuples else tuple(tuple(s) for s in v) if k in shapes else v
                  for k, v in data.items() if k != "defaults"}
        return cls(**fields, defaults=SamplingDefaults(**data["defaults"]))

    def empty_state(self) -> DecodeState:
        """Every slot free, the cursor at the longest bucket (so any prompt can be inserted before it)."""
        return empty_state(self.slots, self.max_cache_len, list(self.carried_shapes), DTYPES_BY_NAME[self.cache_dtype],
                           self.vocab_size, self.pad_token_id, cursor=self.max_prompt_len)


class EngineArtifact:
    """The engine's entry points (``ENTRY_POINTS``, each a ``StableHLOArtifact``) over one ``weights`` dict."""

    def __init__(self, entry_points: dict[str, StableHLOArtifact], weights: dict[str, torch.Tensor],
                 config: EngineConfig):
        self.entry_points = entry_points
        self.weights = weights
        self.config = config

    def runner(self, platform: str = "cpu") -> "EngineRunner":
        """A runner over these entry points with a fresh state (every slot free)."""
        return EngineRunner(self, platform)

    def to_jax(self) -> dict:
        """One ``JaxModel`` per entry point (its ``.exported`` a ``jax.export.Exported`` over the weights and the
        flat leaves of its inputs); called, it takes and returns the typed structures of ``engine.state`` as plain
        nested tuples in field order (``DecodeState(*result)`` names them again)."""
        return {name: entry.to_jax() for name, entry in self.entry_points.items()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the bundle folder at ``path`` (see the module's docstring); a failure leaves nothing there."""
        aliases = alias_map(self.weights)
        stored = {name: t.detach().contiguous() for name, t in self.weights.items() if aliases[name] == name}
        with staged_folder(path, "an engine folder") as staging:
            safetensors.torch.save_file(stored, str(staging / WEIGHTS_FILE))
            entries = {}
            for name, entry in self.entry_points.items():
                (staging / f"{name}.mlir").write_text(entry.stablehlo_text)
                entries[name] = {"module": f"{name}.mlir", "signature": entry.signature.to_json()}
            files = {f.name: _sha256(f) for f in sorted(staging.iterdir())}
            manifest = {"format": ENGINE_FORMAT, "format_version": ENGINE_FORMAT_VERSION,
                        "config": self.config.to_json(), "entry_points": entries,
                        "weight_aliases": {n: t for n, t in aliases.items() if n != t}, "files": files}
            (staging / ENGINE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        return Path(path)


def is_engine_bundle(path: str | os.PathLike) -> bool:
    return (Path(path) / ENGINE_MANIFEST).is_file()


def load_engine(path: str | os.PathLike, platform: str = "cpu") -> EngineArtifact:
    """Read an engine bundle (``EngineArtifact.save``); BundleError if a file is missing, altered or of another
    format version."""
    path = Path(path)
    try:
        manifest = json.loads((path / ENGINE_MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise BundleError(f"{path}: cannot read {ENGINE_MANIFEST} ({error})") from error
    if manifest.get("format") != ENGINE_FORMAT or manifest.get("format_version") != ENGINE_FORMAT_VERSION:
        raise BundleError(f"{path}: not an engine bundle of format version {ENGINE_FORMAT_VERSION} (format "
                          f"{manifest.get('format')!r}, version {manifest.get('format_version')!r})")
    for name, digest in manifest["files"].items():
        file = path / Path(name).name
        if not file.is_file() or _sha256(file) != digest:
            raise BundleError(f"{path}: {name} is missing or does not match its digest in {ENGINE_MANIFEST}")
    weights = safetensors.torch.load_file(str(path / WEIGHTS_FILE))
    weights.update({name: weights[target] for name, target in manifest["weight_aliases"].items()})
    entries = {}
    for name, entry in manifest["entry_points"].items():
        signature = Signature.from_json(entry["signature"])
        text = (path / Path(entry["module"]).name).read_text()
        entries[name] = StableHLOArtifact(text, signature, {s.target: weights[s.target] for s in signature.weights},
                                          platform=platform)
    return EngineArtifact(entries, weights, EngineConfig.from_json(manifest["config"]))


def _sha256(file: Path) -> str:
    with open(file, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


class EngineRunner:
    """Drives the entry points on PJRT: the weights placed once, the ``DecodeState``'s leaves kept on the device
    and donated to each call that takes them (never copied to the host), each module compiled once per shape."""

    def __init__(self, artifact: EngineArtifact, platform: str = "cpu"):
        self.artifact, self.config, self.platform = artifact, artifact.config, platform
        aliases = alias_map(artifact.weights)
        unique = sorted(set(aliases.values()))
        placed = dict(zip(unique, pjrt.put([to_numpy(artifact.weights[n]) for n in unique], platform)))
        self._weights = {name: placed[target] for name, target in aliases.items()}
        self._executables: dict[tuple, pjrt.Executable] = {}
        self.reset()

    def reset(self) -> None:
        """Every slot free again."""
        leaves, self._state_tree = pytree.tree_flatten(self.config.empty_state())
        self._state = pjrt.put([to_numpy(leaf) for leaf in leaves], self.platform)

    def prefill(self, prompt: list[int], sampling: Sampling) -> Prefilled:
        """The first token and caches of ``prompt`` (its caches stay on the device, for ``insert``)."""
        bucket = self.config.bucket(len(prompt))
        ids = torch.full((1, bucket), self.config.pad_token_id, dtype=torch.int64)
        ids[0, bucket - len(prompt):] = torch.tensor(prompt, dtype=torch.int64)
        mask = torch.zeros(1, bucket, dtype=torch.int64)
        mask[0, bucket - len(prompt):] = 1
        first_token, *caches = self._run(PREFILL, Prompt(ids, mask, sampling), takes_state=False)
        return Prefilled(first_token, tuple(caches))

    def insert(self, slot: int, prompt_len: int, max_new_tokens: int, sampling: Sampling,
               prefilled: Prefilled) -> None:
        """The prefilled request into ``slot`` (free), its first token at the cursor."""
        def scalar(value):
            return torch.tensor(value, dtype=torch.int64)
        self._run(INSERT, Admission(scalar(slot), scalar(prompt_len), scalar(max_new_tokens), sampling, prefilled))

    def generate(self) -> np.ndarray:
        """One step over all slots: the token each slot made (the pad token where it is done)."""
        (tokens,) = self._run(GENERATE, ())
        return np.asarray(tokens)

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
                                                     arg_shapes=shapes if key[1] else None)
        placed = dict(zip(hosts, pjrt.put([to_numpy(leaves[i]) for i in hosts], self.platform)))
        arrays = self._executables[key].execute([*weights, *state, *(placed.get(i, leaf)
                                                                      for i, leaf in enumerate(leaves))])
        if takes_state:
            self._state, arrays = arrays[:len(state)], arrays[len(state):]
        return arrays
