"""The exported artifact: StableHLO text, its signature and its weights; callable on PJRT.

It is saved as a bundle (``save``, read back by ``load_artifact``), as a TF SavedModel
(``save_tf_saved_model``) or handed to JAX (``to_jax``).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from runtime import pjrt
from runtime.dtypes import to_numpy, to_torch
from runtime.validation import validate_inputs

from . import bundle
from .signature import Signature
from .versions import DEFAULT_TARGET
from .weights import alias_map


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
        return self.signature.unflatten_outputs(self.run_flat(self.signature.tensor_inputs(args, kwargs)))

    def run_flat(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run on the tensor inputs in ``@main`` order; returns the user outputs, flat."""
        validate_inputs([slot.tensor for slot in self.signature.user_inputs if slot.tensor is not None], tensors)
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
        return user_outputs

    def _compiled(self) -> pjrt.Executable:
        if self._executable is None:
            self._executable = pjrt.Executable(self.stablehlo_text, self.platform)
        return self._executable

    def _weights_on_device(self, executable: pjrt.Executable) -> list:
        """Device copies of the weights, made once; aliases (tied weights) share one copy."""
        slots = self.signature.weights
        missing = [s.target for s in slots if s.target not in self._device_weights]
        if missing:
            canonical = alias_map({name: self.weights[name] for name in missing})
            unique = sorted(set(canonical.values()))
            placed = dict(zip(unique, executable.put([to_numpy(self.weights[name]) for name in unique])))
            self._device_weights.update({name: placed[canonical[name]] for name in missing})
        return [self._device_weights[s.target] for s in slots]

    # -- saving and handing off ----------------------------------------------------
    def save(self, path: str | os.PathLike, *, target_version: str = DEFAULT_TARGET,
             shard_size: int = bundle.DEFAULT_SHARD_BYTES, include_text: bool = True) -> Path:
        """Write the bundle folder (see ``exporter.bundle``) atomically: a failure leaves nothing at ``path``.

        ``target_version``: the StableHLO version to serialize at: ``week12`` (readable by
        consumers up to about 12 weeks old), ``week4``, ``current``, ``minimum`` or e.g. ``1.10.0``.
        Weights go to safetensors shards of at most ``shard_size`` bytes. An existing bundle at
        ``path`` is replaced; anything else there is an error.
        """
        return bundle.save_bundle(path, self.stablehlo_text, self.signature, self.weights,
                                  target_version=target_version, shard_bytes=shard_size, include_text=include_text)

    def save_tf_saved_model(self, path: str | os.PathLike, signature_name: str = "serving_default", *,
                            target_version: str = DEFAULT_TARGET) -> Path:
        """Write a TF SavedModel serving this program through XlaCallModule (needs tensorflow)."""
        from .saved_model import save_saved_model  # tensorflow takes seconds to import: only when asked

        return save_saved_model(self, path, signature_name=signature_name, target_version=target_version)

    def to_jax(self, *, target_version: str = DEFAULT_TARGET):
        """A ``JaxModel``: callable on JAX arrays, with ``.exported`` (a ``jax.export.Exported`` whose module
        is serialized at ``target_version``, for ``Exported.serialize``)."""
        from .jax_handoff import to_jax

        return to_jax(self, target_version)


def load_artifact(path: str | os.PathLike, *, platform: str = "cpu") -> StableHLOArtifact:
    """Read a bundle written by ``StableHLOArtifact.save``; raises BundleError if a file is missing,
    truncated or corrupt, BundleVersionError if it needs a newer StableHLO or bundle format."""
    loaded = bundle.load_bundle(path)
    return StableHLOArtifact(loaded.stablehlo_text, loaded.signature, loaded.weights, platform=platform)
