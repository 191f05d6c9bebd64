"""Stored goldens: inputs and flattened eager outputs of each zoo model, plus a manifest.

``golden/data/<name>.safetensors`` holds

* ``input.<path>``: every tensor the model is called with, keyed by its place in
  ``(args, kwargs)``, e.g. ``input.args.0`` or ``input.kwargs.input_ids``;
* ``output.<i>``: the model's outputs, flattened with ``torch.utils._pytree``
  (a transformers ``ModelOutput`` flattens to its non-None fields, in order).

The file's metadata (one key, ``golden``, holding JSON) keeps the pytree specs of
``(args, kwargs)`` and of the outputs, so inputs load without rebuilding the model
and the structure of a converted model's outputs can be checked too. ``golden/data/manifest.json`` records the torch and
transformers versions, the seed, per-model shapes and a fingerprint of the weights.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import torch.utils._pytree as pytree

DATA_DIR = Path(__file__).resolve().parent / "data"
MANIFEST_PATH = DATA_DIR / "manifest.json"
FORMAT = 1
METADATA_KEY = "golden"


def golden_path(name: str, data_dir: Path = DATA_DIR) -> Path:
    return Path(data_dir) / f"{name}.safetensors"


# -- keys ------------------------------------------------------------------------------

def _key_text(key) -> str:
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    return str(key)


def input_key(path) -> str:
    """``input.args.0`` / ``input.kwargs.input_ids`` for a key path into ``(args, kwargs)``."""
    top, *rest = path
    parts = [("args", "kwargs")[top.idx]] + [_key_text(k) for k in rest]
    return "input." + ".".join(parts)


def flatten_inputs(args: tuple, kwargs: dict) -> tuple[dict[str, object], pytree.TreeSpec]:
    leaves, spec = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    return {input_key(path): leaf for path, leaf in leaves}, spec


def spec_text(spec: pytree.TreeSpec) -> str:
    """The pytree structure as text (treespec_dumps; its repr for types with no serialized name)."""
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # noqa: BLE001  (a pytree node type registered without a serialized name)
        return repr(spec)


# -- weights fingerprint ----------------------------------------------------------------

def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), in state-dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict(keep_vars=False).items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


# -- the stored golden ----------------------------------------------------------------------

@dataclass
class Golden:
    name: str
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor]
    metadata: dict = field(default_factory=dict)


def save_golden(name: str, args: tuple, kwargs: dict, outputs, data_dir: Path = DATA_DIR) -> dict:
    """Write ``<name>.safetensors``; returns the file's manifest entry (shapes of inputs and outputs)."""
    inputs, spec = flatten_inputs(args, kwargs)
    non_tensors = {k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor)}
    if non_tensors:
        raise TypeError(f"golden {name}: inputs must all be tensors; got {non_tensors}")
    flat_outputs, output_spec = pytree.tree_flatten(outputs)
    tensors = dict(inputs)
    for i, value in enumerate(flat_outputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"golden {name}: output {i} is a {type(value).__name__}, not a tensor")
        tensors[f"output.{i}"] = value
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    path = golden_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": FORMAT, "name": name, "input_spec": pytree.treespec_dumps(spec),
                "num_outputs": len(flat_outputs), "output_spec": spec_text(output_spec)}
    # one metadata key holding JSON: safetensors writes several keys in no fixed order,
    # which would make every regeneration a (spurious) change to the file
    safetensors.torch.save_file(tensors, str(path), metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})
    os.chmod(path, 0o644)  # safetensors creates the file owner-only; goldens are shared data
    return {
        "file": path.name,
        "inputs": {k: _describe(v) for k, v in inputs.items()},
        "outputs": [{"key": f"output.{i}", **_describe(v)} for i, v in enumerate(flat_outputs)],
    }


def load_golden(name: str, data_dir: Path = DATA_DIR) -> Golden:
    path = golden_path(name, data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no stored golden for {name!r} at {path}; "
                                f"create it with `python -m torch_stablehlo.golden.regenerate --only {name}`")
    with safetensors.safe_open(str(path), framework="pt") as handle:
        metadata = json.loads((handle.metadata() or {}).get(METADATA_KEY, "{}"))
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path}: golden format {metadata.get('format')!r}, this code reads {FORMAT}")
    spec = pytree.treespec_loads(metadata["input_spec"])
    # the key of each leaf in spec order: flatten a structure of placeholders with the same spec
    placeholders = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    keys = [input_key(path) for path, _ in pytree.tree_flatten_with_path(placeholders)[0]]
    args, kwargs = pytree.tree_unflatten([tensors[k] for k in keys], spec)
    outputs = [tensors[f"output.{i}"] for i in range(int(metadata["num_outputs"]))]
    return Golden(name, tuple(args), dict(kwargs), outputs, metadata)


def _describe(tensor: torch.Tensor) -> dict:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}


# -- manifest ---------------------------------------------------------------------------------

def read_manifest(data_dir: Path = DATA_DIR) -> dict:
    path = Path(data_dir) / MANIFEST_PATH.name
    if not path.is_file():
        return {"format": FORMAT, "models": {}}
    return json.loads(path.read_text())


def write_manifest(manifest: dict, data_dir: Path = DATA_DIR) -> Path:
    path = Path(data_dir) / MANIFEST_PATH.name
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = dict(manifest, models=dict(sorted(manifest.get("models", {}).items())))
    text = json.dumps(manifest, indent=1)
    # keep short lists (shapes, tags) on one line
    text = re.sub(r'\[[^\[\]{}]*\]', lambda m: json.dumps(json.loads(m.group(0))), text)
    path.write_text(text + "\n")
    return path


# -- comparison ---------------------------------------------------------------------------------

@dataclass
class Comparison:
    """Worst error over all outputs; ``max_rel`` is max |actual - golden| / max |golden|, per output.
    ``abs_tolerance`` (quantized models) bounds ``max_abs`` instead of ``tolerance`` bounding ``max_rel``."""
    max_abs: float
    max_rel: float
    tolerance: float
    problems: list[str]
    abs_tolerance: float | None = None

    @property
    def within_tolerance(self) -> bool:
        if self.abs_tolerance is not None:
            return self.max_abs <= self.abs_tolerance
        return self.max_rel <= self.tolerance

    @property
    def ok(self) -> bool:
        return not self.problems and self.within_tolerance


def compare_outputs(outputs, golden: Golden, tolerance: float, abs_tolerance: float | None = None) -> Comparison:
    """Compare a model's (unflattened) outputs with a stored golden: structure, then values."""
    flat, spec = pytree.tree_flatten(outputs)
    comparison = compare(flat, golden.outputs, tolerance, abs_tolerance)
    expected = golden.metadata.get("output_spec")
    if expected is not None and spec_text(spec) != expected:
        comparison.problems.insert(0, f"output structure {spec} differs from the golden's {expected}")
    return comparison


def compare(actual: list, golden: list[torch.Tensor], tolerance: float,
            abs_tolerance: float | None = None) -> Comparison:
    """Compare flat lists of outputs; tolerance is relative to each golden output's max |value|, abs_tolerance
    (when given, instead) bounds the absolute error."""
    problems = []
    if len(actual) != len(golden):
        problems.append(f"{len(actual)} outputs, golden has {len(golden)}")
    max_abs = max_rel = 0.0
    for i, (got, want) in enumerate(zip(actual, golden)):
        if not isinstance(got, torch.Tensor):
            problems.append(f"output {i}: got a {type(got).__name__}, not a tensor")
            continue
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"output {i}: got {got.dtype}{list(got.shape)}, golden is {want.dtype}{list(want.shape)}")
            continue
        if not want.is_floating_point():
            mismatches = int((got != want).sum())
            if mismatches:
                problems.append(f"output {i}: {mismatches} of {want.numel()} integer elements differ")
            continue
        got64, want64 = got.double(), want.double()
        if not torch.equal(torch.isnan(got64), torch.isnan(want64)):
            problems.append(f"output {i}: NaNs where the golden has none (or the reverse)")
        finite = ~torch.isnan(want64)
        error = (got64 - want64).abs()[finite]
        abs_err = float(error.max()) if error.numel() else 0.0
        if math.isnan(abs_err):
            abs_err = math.inf
        scale = float(want64[finite].abs().max()) if finite.any() else 0.0
        rel_err = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else math.inf)
        max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
    return Comparison(max_abs, max_rel, tolerance, problems, abs_tolerance)
