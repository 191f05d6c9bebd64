"""The artifact for JAX users: a ``jax.export.Exported`` of ``@main`` and a callable with the weights bound.

``Exported`` takes the weights first, then the model's tensor inputs, all flat, and
returns the model's outputs flat; ``exported.serialize()`` works on it and
``jax.export.deserialize`` reads it back. ``JaxModel`` wraps it with the model's own
input and output structure.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax import export as jax_export

from stablehlo_ir.dtypes import to_numpy
from stablehlo_ir.specs import TensorSpec

from .signature import Signature
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import CALLING_CONVENTION_VERSION, xla_module_bytes


class JaxModel:
    """``model(*args, **kwargs)`` like the torch model, on JAX arrays; ``apply(weights, ...)`` to pass the
    weights explicitly (e.g. under ``jax.jit``); ``exported`` to embed or serialize."""

    def __init__(self, exported: jax_export.Exported, weights: tuple, signature: Signature):
        self.exported = exported
        self.weights = weights
        self.signature = signature

    def apply(self, weights, *args, **kwargs):
        """Run with ``weights`` (``@main`` order, as ``self.weights``). 64-bit inputs need JAX's x64 mode."""
        results = iter(self.exported.call(*weights, *self.signature.tensor_inputs(args, kwargs)))
        return self.signature.unflatten_outputs(  # constant outputs are the signature's, not @main's
            [next(results) if slot.tensor is not None else slot.value for slot in self.signature.outputs])

    def __call__(self, *args, **kwargs):
        with jax.enable_x64(True):  # scoped, as in runtime.pjrt: int64/float64 inputs stay 64-bit
            return self.apply(self.weights, *args, **kwargs)


def to_jax(artifact, target_version: str = DEFAULT_TARGET) -> JaxModel:
    """The JAX handoff of ``artifact`` (a StableHLOArtifact); its weights are placed on JAX's default device."""
    signature = artifact.signature
    mutated = [slot.target for slot in signature.outputs if slot.kind in ("buffer_mutation", "user_input_mutation")]
    if mutated:
        raise NotImplementedError(f"to_jax: the program updates buffers in place ({', '.join(mutated)}), "
                                  "which a JAX function cannot do; export a forward without in-place updates")
    scope = jax_export.SymbolicScope(_dim_constraints(signature))
    in_avals = tuple(_aval(slot.tensor, scope) for slot in signature.main_inputs)
    out_avals = tuple(_aval(slot.tensor, scope) for slot in signature.main_outputs)
    exported = jax_export.Exported(  # its fields as of jax 0.10 (the ones named _... too)
        fun_name="main",
        in_tree=jax.tree_util.tree_structure((tuple(range(len(in_avals))), {})),
        in_avals=in_avals,
        out_tree=jax.tree_util.tree_structure(tuple(range(len(out_avals)))),
        out_avals=out_avals,
        _has_named_shardings=True,
        _in_named_shardings=(None,) * len(in_avals),
        _out_named_shardings=(None,) * len(out_avals),
        in_shardings_hlo=(None,) * len(in_avals),
        out_shardings_hlo=(None,) * len(out_avals),
        nr_devices=1,
        platforms=(artifact.platform,),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(),
        mlir_module_serialized=xla_module_bytes(artifact.stablehlo_text, signature, target_version),
        calling_convention_version=CALLING_CONVENTION_VERSION,
        module_kept_var_idx=tuple(range(len(in_avals))),
        uses_global_constants=signature.is_dynamic,
        _get_vjp=None)
    aliases = alias_map(artifact.weights)
    with jax.enable_x64(True):
        placed = {name: jnp.asarray(to_numpy(artifact.weights[name]))
                  for name, target in aliases.items() if name == target}
    weights = tuple(placed[aliases[slot.target]] for slot in signature.weights)
    return JaxModel(exported, weights, signature)


def _aval(spec: TensorSpec, scope: jax_export.SymbolicScope) -> jax.core.ShapedArray:
    shape = spec.shape
    if any(isinstance(d, str) for d in shape):
        shape = jax_export.symbolic_shape(", ".join(str(d) for d in shape), scope=scope)
    return jax.core.ShapedArray(tuple(shape), jnp.dtype(spec.dtype))


def _dim_constraints(signature: Signature) -> list[str]:
    """The ranges of the symbolic dims in ``@main``'s shapes (torch also ranges sizes that stay inside the
    program, such as those a while_loop's body computes: JAX refuses a constraint on a dim it cannot see)."""
    shapes = " ".join(str(d) for slot in [*signature.main_inputs, *signature.main_outputs] for d in slot.tensor.shape)
    seen = set(re.findall(r"[A-Za-z_]\w*", shapes))
    constraints = []
    for name, (low, high) in ((n, r) for n, r in signature.dims.items() if n in seen):
        if low is not None:
            constraints.append(f"{name} >= {low}")
        if high is not None:
            constraints.append(f"{name} <= {high}")
    return constraints
