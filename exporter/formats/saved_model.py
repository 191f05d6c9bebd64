"""A TF SavedModel that serves the artifact: one XlaCallModule over the portable module.

Weights are ``tf.Variable``s (stored in the SavedModel's variables checkpoint, so
models over 2 GB work), passed as the module's leading arguments. The serving
signature takes the model's tensor inputs by name (symbolic dims are ``None``)
and returns the outputs by signature name (``logits``, ``pair.0``, ``output_0``, ...); buffers the model updates in place are
assigned back to their variables.
"""
from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf
from tensorflow.compiler.tf2xla.python.xla import call_module

from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from .folders import staged_folder
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import CALLING_CONVENTION_VERSION, xla_module_bytes


def save_saved_model(artifact, path: str | os.PathLike, *, signature_name: str = "serving_default",
                     target_version: str = DEFAULT_TARGET) -> Path:
    """Write ``artifact`` (a StableHLOArtifact) as a SavedModel folder, atomically."""
    served = ServedModule(artifact, target_version)
    with staged_folder(path, "a SavedModel folder") as staging:
        tf.saved_model.save(served, str(staging), signatures={signature_name: served.serve.get_concrete_function()})
    return Path(path)


class ServedModule(tf.Module):
    """The variables and the serving function that ``tf.saved_model.save`` tracks."""

    def __init__(self, artifact, target_version: str):
        super().__init__()
        signature = artifact.signature
        aliases = alias_map(artifact.weights)
        variables = {name: tf.Variable(to_numpy(artifact.weights[name]), trainable=False, name=_tf_name(name))
                     for name, target in aliases.items() if name == target}
        self.weight_variables = [variables[aliases[slot.target]] for slot in signature.held_inputs]
        self._variable_of = {name: variables[target] for name, target in aliases.items()}
        self._outputs = signature.main_outputs  # a constant output is not served
        self._call_options = dict(
            version=CALLING_CONVENTION_VERSION,
            module=xla_module_bytes(artifact.stablehlo_text, signature, target_version),
            Tout=[tf.as_dtype(slot.tensor.dtype) for slot in self._outputs],
            Sout=[_tf_shape(slot.tensor) for slot in self._outputs],
            platforms=[artifact.platform.upper()])
        input_signature = [tf.TensorSpec(_tf_shape(slot.tensor), tf.as_dtype(slot.tensor.dtype), name=slot.tensor.name)
                           for slot in signature.user_inputs if slot.tensor is not None]
        self.serve = tf.function(self._serve, input_signature=input_signature, autograph=False)

    def _serve(self, *inputs):
        results = call_module([*self.weight_variables, *inputs], **self._call_options)
        outputs = {}
        for slot, value in zip(self._outputs, results):
            if slot.kind == "buffer_mutation":
                self._variable_of[slot.target].assign(value)
            else:
                outputs[slot.tensor.name] = value
        return outputs


def _tf_shape(spec: TensorSpec) -> list:
    return [d if isinstance(d, int) else None for d in spec.shape]


def _tf_name(weight_name: str) -> str:
    """A variable name TF accepts: letters, digits and ``._-/``, not starting with ``_-/``."""
    name = "".join(c if c.isalnum() or c in "._-/" else "_" for c in weight_name)
    return name if name[:1].isalnum() or name[:1] == "." else f"v{name}"
