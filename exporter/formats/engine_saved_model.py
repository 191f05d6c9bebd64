"""A TF SavedModel of an engine (``EngineArtifact.save_tf_saved_model``): one signature per entry point, so a TF
server drives the engine without this package.

Each signature is one XlaCallModule over its entry point's portable module. The weights are ``tf.Variable``s,
each stored once and passed to every entry point that takes it. The decode state (``DecodeState``'s leaves, every
slot free when saved) is ``tf.Variable``s too: ``insert``, ``generate`` and ``shift`` read it and assign its new
value (their ``@main`` donates it), so the SavedModel holds one engine, driven by one caller at a time.

Inputs and outputs are named as the entry point's signature names them (the fields of ``engine.state``'s types):
- ``prefill``: ``prompt_input_ids`` and ``prompt_attention_mask`` [1, bucket], ``prompt_max_new_tokens`` [1],
  ``prompt_sampling_do_sample``, ... -> ``first_token``, ``caches.0``, ``caches.1``, ...;
- ``insert``: ``admission_slot``, ``admission_prompt_ids`` [1, bucket] (as prefilled), ``admission_prompt_len``,
  ``admission_max_new_tokens``, the sampling rows, the
  prefill's first token and caches (``admission_prefilled_first_token``, ``admission_prefilled_caches_0``, ...)
  -> ``cursor`` (the shared column, unchanged);
- ``generate``: ``steps`` (1 to ``steps_per_call``) -> ``tokens`` [steps_per_call, slots] (rows past ``steps``:
  the pad token) and ``cursor``;
- ``shift``: ``by`` -> ``cursor``.
"""
from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf
import torch.utils._pytree as pytree
from tensorflow.compiler.tf2xla.python.xla import call_module

from torch_stablehlo.stablehlo_ir.dtypes import to_numpy

from ..engine.state import DecodeState
from .engine_artifact import ENTRY_POINTS, PREFILL, EngineArtifact
from .folders import staged_folder
from .saved_model import tf_name, tf_shape
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import CALLING_CONVENTION_VERSION, xla_module_bytes

CURSOR = "cursor"  # the output every entry point that takes the state gives: the shared column after the call
_CURSOR_LEAF = DecodeState._fields.index("cursor")  # the fields before it are single tensors


def save_engine_saved_model(artifact: EngineArtifact, path: str | os.PathLike, *,
                            target_version: str = DEFAULT_TARGET) -> Path:
    """Write ``artifact`` as a SavedModel folder (see the module's docstring), atomically."""
    served = ServedEngine(artifact, target_version)
    signatures = {name: getattr(served, name).get_concrete_function(*served.input_specs[name])
                  for name in ENTRY_POINTS}
    with staged_folder(path, "a SavedModel folder") as staging:
        tf.saved_model.save(served, str(staging), signatures=signatures)
    return Path(path)


class ServedEngine(tf.Module):
    """The variables (weights once, the decode state) and one tf.function per entry point."""

    def __init__(self, artifact: EngineArtifact, target_version: str):
        super().__init__()
        aliases = alias_map(artifact.weights)
        stored = {name: tf.Variable(to_numpy(artifact.weights[name]), trainable=False, name=tf_name(name))
                  for name, target in aliases.items() if name == target}
        self.weight_variables = list(stored.values())
        self._variable_of = {name: stored[target] for name, target in aliases.items()}
        leaves, _ = pytree.tree_flatten(artifact.config.empty_state())
        self.state_variables = [tf.Variable(to_numpy(leaf), trainable=False, name=f"state_{i}")
                                for i, leaf in enumerate(leaves)]
        self.input_specs = {}
        for name, entry in artifact.entry_points.items():
            state = 0 if name == PREFILL else len(leaves)
            inputs = [slot for slot in entry.signature.user_inputs if slot.tensor is not None][state:]
            self.input_specs[name] = [tf.TensorSpec(tf_shape(slot.tensor), tf.as_dtype(slot.tensor.dtype),
                                                    name=slot.tensor.name) for slot in inputs]
            setattr(self, name, tf.function(self._caller(entry, state, target_version), autograph=False))

    def _caller(self, entry, state: int, target_version: str):
        """The function serving ``entry``: its outputs by name (the state's new value assigned, not returned)."""
        signature = entry.signature
        outputs = signature.main_outputs
        options = dict(version=CALLING_CONVENTION_VERSION,
                       module=xla_module_bytes(entry.stablehlo_text, signature, entry.platforms, target_version),
                       Tout=[tf.as_dtype(slot.tensor.dtype) for slot in outputs],
                       Sout=[tf_shape(slot.tensor) for slot in outputs],
                       platforms=[platform.upper() for platform in entry.platforms])
        weights = [self._variable_of[slot.target] for slot in signature.held_inputs]

        def call(*inputs):
            results = call_module([*weights, *self.state_variables[:state], *inputs], **options)
            for variable, value in zip(self.state_variables[:state], results):
                variable.assign(value)
            served = {slot.tensor.name: value for slot, value in zip(outputs[state:], results[state:])}
            if state:
                served[CURSOR] = self.state_variables[_CURSOR_LEAF].read_value()
            return served
        return call
