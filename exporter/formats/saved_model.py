"""A TF SavedModel that serves the artifact: one XlaCallModule over the portable module.

Weights are ``tf.Variable``s (stored in the SavedModel's variables checkpoint, so
models over 2 GB work), passed as the module's leading arguments. The serving
signature takes the model's tensor inputs by name (symbolic dims are ``None``)
and returns the outputs by signature name (``logits``, ``pair.0``, ``output_0``, ...).

A program with state (``signature.state``: buffers and lifted constants it writes, e.g. a static KV cache) keeps
it in ``tf.Variable``s too, which each call updates (``@main`` donates them to their new values): a per-step
decoder is served one call per token (``loaded.state_variables`` reads it, in ``signature.state``'s order). The
state is the SavedModel's, shared by every caller: one stream at a time uses it.

A program that draws random numbers (``@main`` takes ``rng_seed``) gets two signatures, both of one tf.function
(``loaded.serve(..., seed=None)`` in Python): ``serving_default`` (the name given) takes the model's inputs only
and draws from the SavedModel's own seed counter (the variable ``next_seed``: 0 when saved, each such call then
the next seed, as the artifact's calls do after ``manual_seed(0)``); ``serving_default_seeded`` takes a ``seed``
input too (int64 scalar) and draws from it, the same sequences as ``artifact.manual_seed(seed)(...)``. TF Serving
hosts both (every input of a signature is required there, so the seed cannot be optional within one).
"""
from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf
from tensorflow.compiler.tf2xla.python.xla import call_module

from torch_stablehlo.exported_program import STATE_UPDATE
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from .folders import staged_folder
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import CALLING_CONVENTION_VERSION, SEED_INPUT, check_seed_input, xla_module_bytes

SEEDED_SIGNATURE = "{}_seeded"
"""The name of the signature that takes the seed, from the serving signature's name."""


def save_saved_model(artifact, path: str | os.PathLike, *, signature_name: str = "serving_default",
                     target_version: str = DEFAULT_TARGET) -> Path:
    """Write ``artifact`` (a StableHLOArtifact) as a SavedModel folder, atomically."""
    check_seed_input(artifact.signature)
    served = ServedModule(artifact, target_version)
    signatures = {signature_name: served.serve.get_concrete_function(*served.input_specs)}
    if artifact.signature.takes_rng_seed:
        signatures[SEEDED_SIGNATURE.format(signature_name)] = served.serve.get_concrete_function(
            *served.input_specs, seed=tf.TensorSpec([], tf.int64, name=SEED_INPUT))
    with staged_folder(path, "a SavedModel folder") as staging:
        tf.saved_model.save(served, str(staging), signatures=signatures)
    return Path(path)


class ServedModule(tf.Module):
    """The variables (weights, state, the seed counter) and the serving function that ``tf.saved_model.save``
    tracks."""

    def __init__(self, artifact, target_version: str):
        super().__init__()
        signature = artifact.signature
        aliases = alias_map(artifact.weights)
        variables = {name: tf.Variable(to_numpy(artifact.weights[name]), trainable=False, name=tf_name(name))
                     for name, target in aliases.items() if name == target}
        self.weight_variables = [variables[aliases[slot.target]] for slot in signature.held_inputs]  # @main's order
        self.state_variables = [variables[aliases[slot.target]] for slot in signature.state]  # as signature.state
        self._variable_of = {name: variables[target] for name, target in aliases.items()}
        self._outputs = signature.main_outputs  # a constant output is not served
        self._call_options = dict(
            version=CALLING_CONVENTION_VERSION,
            module=xla_module_bytes(artifact.stablehlo_text, signature, artifact.platforms, target_version),
            Tout=[tf.as_dtype(slot.tensor.dtype) for slot in self._outputs],
            Sout=[tf_shape(slot.tensor) for slot in self._outputs],
            platforms=[platform.upper() for platform in artifact.platforms])  # it passes the platform index
        self.input_specs = [tf.TensorSpec(tf_shape(slot.tensor), tf.as_dtype(slot.tensor.dtype), name=slot.tensor.name)
                            for slot in signature.user_inputs if slot.tensor is not None]
        self.next_seed = tf.Variable(0, dtype=tf.int64, trainable=False, name="next_seed") \
            if signature.takes_rng_seed else None
        self.serve = tf.function(self._serve, autograph=False)

    def _serve(self, *inputs, seed=None):
        """One call: the outputs by name; the state's new values assigned to its variables. ``seed`` (where
        ``@main`` takes ``rng_seed``): None draws from ``next_seed``, advancing it."""
        if self.next_seed is not None:
            inputs = (*inputs, self.next_seed.assign_add(1) - 1 if seed is None else seed)
        results = call_module([*self.weight_variables, *inputs], **self._call_options)
        outputs = {}
        for slot, value in zip(self._outputs, results):
            if slot.kind == STATE_UPDATE:
                self._variable_of[slot.target].assign(value)
            else:
                outputs[slot.tensor.name] = value
        return outputs


def tf_shape(spec: TensorSpec) -> list:
    return [d if isinstance(d, int) else None for d in spec.shape]


def tf_name(weight_name: str) -> str:
    """A variable name TF accepts: letters, digits and ``._-/``, not starting with ``_-/``."""
    name = "".join(c if c.isalnum() or c in "._-/" else "_" for c in weight_name)
    return name if name[:1].isalnum() or name[:1] == "." else f"v{name}"
