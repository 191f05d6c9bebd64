"""The exported artifact: StableHLO text, its signature and its weights; callable on PJRT."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import safetensors.torch
import torch
import torch.utils._pytree as pytree
from jaxlib.mlir.dialects import stablehlo

from runtime import pjrt
from runtime.dtypes import to_numpy, to_torch
from runtime.mlir_context import make_context
from runtime.passes import portable_artifact
from runtime.validation import InputError, validate_inputs

from .signature import Signature

FORMAT_VERSION = 1
MANIFEST, MODULE_TEXT, MODULE_PORTABLE, WEIGHTS = "manifest.json", "module.mlir", "module.mlirbc", "weights.safetensors"


class StableHLOArtifact:
    """A converted program. Call it like the original model; it runs on the PJRT runtime."""

    def __init__(self, stablehlo_text: str, signature: Signature, weights: dict[str, torch.Tensor],
                 *, platform: str = "cpu"):
        self.stablehlo_text = stablehlo_text
        self.signature = signature
        self.weights = weights
        self.platform = platform
        self._executable = None
        self._device_weights: dict[str, object] = {}

    # -- running ------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        flat = self._flatten_user_inputs(args, kwargs)
        slots = self.signature.user_inputs
        tensors = [value for slot, value in zip(slots, flat) if slot.tensor is not None]
        validate_inputs([slot.tensor for slot in slots if slot.tensor is not None], tensors)
        for slot, value in zip(slots, flat):
            if slot.tensor is None and value != slot.value:
                raise InputError(f"input '{slot.name}' was specialised to {slot.value!r} at export; got {value!r}")
        executable = self._compiled()
        device_inputs = self._weights_on_device(executable) + executable.put([to_numpy(t) for t in tensors])
        outputs = [to_torch(array) for array in executable.execute(device_inputs)]
        user_outputs = []
        for slot, value in zip(self.signature.outputs, outputs):
            if slot.kind == "buffer_mutation":  # state carried to the next call, as in eager
                self.weights[slot.target] = value
                self._device_weights.pop(slot.target, None)
            else:
                user_outputs.append(value)
        return pytree.tree_unflatten(user_outputs, self.signature.tree("out_spec"))

    def _flatten_user_inputs(self, args, kwargs) -> list:
        in_spec = self.signature.tree("in_spec")
        expected_positional = in_spec.child(0).num_children
        if len(args) != expected_positional:
            raise InputError(f"expected {expected_positional} positional input(s), got {len(args)} "
                             f"(inputs: {', '.join(s.name for s in self.signature.user_inputs)})")
        expected_keys = list(in_spec.child(1).context) if in_spec.num_children == 2 else []
        unknown = sorted(set(kwargs) - set(expected_keys))
        missing = [k for k in expected_keys if k not in kwargs]
        if unknown or missing:
            raise InputError(f"keyword inputs: expected {expected_keys}"
                             + (f"; unexpected {unknown}" if unknown else "")
                             + (f"; missing {missing}" if missing else ""))
        flat, spec = pytree.tree_flatten((tuple(args), {k: kwargs[k] for k in expected_keys}))
        if spec != in_spec:
            raise InputError(f"inputs do not have the structure the model was exported with.\n"
                             f"  expected: {in_spec}\n  got:      {spec}")
        return flat

    def _compiled(self) -> pjrt.Executable:
        if self._executable is None:
            self._executable = pjrt.Executable(self.stablehlo_text, self.platform)
        return self._executable

    def _weights_on_device(self, executable: pjrt.Executable) -> list:
        """Device copies of the weights, made once; aliases (tied weights) share one copy."""
        slots = self.signature.weights
        missing = [s.target for s in slots if s.target not in self._device_weights]
        if missing:
            canonical = _alias_map({name: self.weights[name] for name in missing})
            unique = sorted(set(canonical.values()))
            placed = dict(zip(unique, executable.put([to_numpy(self.weights[name]) for name in unique])))
            self._device_weights.update({name: placed[canonical[name]] for name in missing})
        return [self._device_weights[s.target] for s in slots]

    # -- saving ---------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the bundle folder atomically: a failure leaves no (half-written) bundle at ``path``.

        An existing bundle at ``path`` is replaced; anything else there is an error.
        Tied weights are stored once and listed as aliases in the manifest.
        """
        path = Path(path)
        if path.exists() and not (path / MANIFEST).is_file():
            raise FileExistsError(f"{path} exists and is not an artifact folder; choose a new path or remove it")
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            version = stablehlo.get_version_from_compatibility_requirement(
                stablehlo.StablehloCompatibilityRequirement.WEEK_12)
            (staging / MODULE_PORTABLE).write_bytes(portable_artifact(self.stablehlo_text, version))
            (staging / MODULE_TEXT).write_text(self.stablehlo_text)
            aliases = _alias_map(self.weights)
            safetensors.torch.save_file({name: self.weights[name].detach().contiguous()
                                         for name in set(aliases.values())}, str(staging / WEIGHTS))
            manifest = {"format_version": FORMAT_VERSION, "stablehlo_version": version,
                        "torch_version": torch.__version__, "signature": self.signature.to_json(),
                        "weight_aliases": {name: target for name, target in aliases.items() if name != target}}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
            if path.exists():
                shutil.rmtree(path)
            os.replace(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return path


def load_artifact(path: str | os.PathLike, *, platform: str = "cpu") -> StableHLOArtifact:
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"{path} is not an artifact folder: {MANIFEST} is missing")
    manifest = json.loads((path / MANIFEST).read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: bundle format {manifest.get('format_version')} is not readable "
                         f"by this version (reads format {FORMAT_VERSION})")
    with make_context() as context:
        module = stablehlo.deserialize_portable_artifact(context, (path / MODULE_PORTABLE).read_bytes())
        text = module.operation.get_asm(enable_debug_info=True)
    weights = safetensors.torch.load_file(str(path / WEIGHTS))
    weights.update({name: weights[target] for name, target in manifest.get("weight_aliases", {}).items()})
    return StableHLOArtifact(text, Signature.from_json(manifest["signature"]), weights, platform=platform)


def _alias_map(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """Map each weight name to the first name holding the same tensor view (tied weights)."""
    first_by_view: dict[tuple, str] = {}
    result = {}
    for name, tensor in weights.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tuple(tensor.stride()), tensor.dtype)
        result[name] = first_by_view.setdefault(view, name)
    return result
