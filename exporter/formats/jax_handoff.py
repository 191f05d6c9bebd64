"""The artifact for JAX users: a ``jax.export.Exported`` of ``@main`` and a callable with the weights bound.

``Exported`` takes the weights first, then the model's tensor inputs, all flat, and
returns the model's outputs flat; ``exported.serialize()`` works on it and
``jax.export.deserialize`` reads it back. ``JaxModel`` wraps it with the model's own
input and output structure.

A program over a device mesh is an ``Exported`` for ``prod(mesh)`` devices whose input shardings are the
signature's (``NamedSharding`` on an abstract mesh of the same axes; ``in_shardings_hlo`` their HLO form) and
whose outputs are replicated; ``JaxModel`` places the weights and inputs on the first devices JAX has.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax import export as jax_export
from jax.sharding import AbstractMesh, AxisType, NamedSharding

from torch_stablehlo.runtime import pjrt, spmd
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..conversion.signature import Signature
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import CALLING_CONVENTION_VERSION, SHARDY_CALLING_CONVENTION_VERSION, xla_module_bytes


class JaxModel:
    """``model(*args, **kwargs)`` like the torch model, on JAX arrays; ``apply(weights, ...)`` to pass the
    weights explicitly (e.g. under ``jax.jit``); ``exported`` to embed or serialize."""

    def __init__(self, exported: jax_export.Exported, weights: tuple, signature: Signature,
                 mesh: jax.sharding.Mesh | None = None):
        self.exported = exported
        self.weights = weights
        self.signature = signature
        self.mesh = mesh  # the devices a partitioned program runs on

    def apply(self, weights, *args, **kwargs):
        """Run with ``weights`` (``@main`` order, as ``self.weights``). 64-bit inputs need JAX's x64 mode."""
        results = iter(self.exported.call(*weights, *self.signature.tensor_inputs(args, kwargs)))
        return self.signature.unflatten_outputs(  # constant outputs are the signature's, not @main's
            [next(results) if slot.tensor is not None else slot.value for slot in self.signature.outputs])

    def __call__(self, *args, **kwargs):
        with jax.enable_x64(True):  # scoped, as in runtime.pjrt: int64/float64 inputs stay 64-bit
            if self.mesh is not None:  # each input split over the devices as the signature says
                args, kwargs = jax.tree_util.tree_map(jnp.asarray, (args, kwargs))
                args, kwargs = jax.device_put((args, kwargs), self._input_layouts(args, kwargs))
            return self.apply(self.weights, *args, **kwargs)

    def _input_layouts(self, args, kwargs):
        """A sharding per input leaf: the signature's for tensor inputs (replicated where it names none)."""
        slots = iter(s for s in self.signature.user_inputs if s.tensor is not None)
        return jax.tree_util.tree_map(lambda _: spmd.sharding(self.mesh, next(slots).sharding), (args, kwargs))


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
    in_shardings = tuple(_named(signature.mesh, slot.sharding) for slot in signature.main_inputs)
    out_shardings = tuple(_named(signature.mesh, ((),) * len(a.shape)) for a in out_avals)  # replicated
    exported = jax_export.Exported(  # its fields as of jax 0.10 (the ones named _... too)
        fun_name="main",
        in_tree=jax.tree_util.tree_structure((tuple(range(len(in_avals))), {})),
        in_avals=in_avals,
        out_tree=jax.tree_util.tree_structure(tuple(range(len(out_avals)))),
        out_avals=out_avals,
        _has_named_shardings=True,
        _in_named_shardings=in_shardings,
        _out_named_shardings=out_shardings,
        in_shardings_hlo=tuple(_hlo(s, a) for s, a in zip(in_shardings, in_avals)),
        out_shardings_hlo=tuple(_hlo(s, a) for s, a in zip(out_shardings, out_avals)),
        nr_devices=signature.num_devices,
        platforms=(artifact.platform,),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(),
        mlir_module_serialized=xla_module_bytes(artifact.stablehlo_text, signature, target_version),
        calling_convention_version=SHARDY_CALLING_CONVENTION_VERSION if signature.mesh else CALLING_CONVENTION_VERSION,
        module_kept_var_idx=tuple(range(len(in_avals))),
        uses_global_constants=signature.is_dynamic,
        _get_vjp=None)
    artifact._require_weights("hand to JAX")
    aliases = alias_map(artifact.weights)
    unique = [name for name, target in aliases.items() if name == target]
    slot_of = {slot.target: slot for slot in signature.weights}
    layout = (signature.mesh, [slot_of[name].sharding for name in unique]) if signature.mesh else ()
    placed = dict(zip(unique, pjrt.put([to_numpy(artifact.weights[name]) for name in unique],
                                       artifact.platform, *layout)))
    weights = tuple(placed[aliases[slot.target]] for slot in signature.weights)
    mesh = pjrt.device_mesh(artifact.platform, tuple(signature.mesh.items())) if signature.mesh else None
    return JaxModel(exported, weights, signature, mesh)


def _named(mesh: dict[str, int] | None, spec) -> NamedSharding | None:
    """The sharding jax.export records for one argument: over an abstract mesh of ``mesh``'s axes."""
    if mesh is None or spec is None:
        return None
    abstract = AbstractMesh(tuple(mesh.values()), tuple(mesh), axis_types=(AxisType.Auto,) * len(mesh))
    return spmd.sharding(abstract, spec)


def _hlo(sharding: NamedSharding | None, aval):
    return None if sharding is None else sharding._to_xla_hlo_sharding(len(aval.shape))


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
