"""The artifact for JAX users: a ``jax.export.Exported`` of ``@main`` and a callable with the weights bound.

``Exported`` takes the weights (and the state, where the program has some) first, then the model's tensor inputs,
then ``rng_seed`` where the program draws random numbers, all flat, and returns the model's outputs flat (then
the state's new values); ``exported.serialize()`` works on it and ``jax.export.deserialize`` reads it back.
``JaxModel`` wraps it with the model's own input and output structure. Its ``platforms`` are the module's: where
they are several, jax passes ``@main``'s platform index itself, for the platform it runs on.

A program with state (``signature.state``, e.g. a static KV cache) is a ``StatefulJaxModel``: its functional form
``apply(weights, state, *args, **kwargs) -> (state, outputs)``, and ``model(*args, **kwargs)``, which carries the
state from call to call on the device, donating it to each call (``jax.jit(donate_argnums=...)``: XLA updates it
in place). A program that writes its own inputs in place (``user_input_mutation``) is refused: JAX arrays cannot
be written, and returning the new values would change the model's output structure.

A program that draws random numbers takes its ``rng_seed`` as the keyword input ``seed`` (``SEED_INPUT``, an int64
scalar); ``model(...)`` without it draws from the model's own seed, as the artifact does (``manual_seed``: 0 at
first, and each call then the next one), so ``model.manual_seed(s)(...)`` equals ``artifact.manual_seed(s)(...)``.

A program over a device mesh is an ``Exported`` for ``prod(mesh)`` devices whose input shardings are the
signature's (``NamedSharding`` on an abstract mesh of the same axes; ``in_shardings_hlo`` their HLO form) and
whose outputs are replicated; ``JaxModel`` places the weights and inputs on the first devices JAX has.
"""
from __future__ import annotations

import re
import threading
from typing import Callable

import jax
import jax.numpy as jnp
from jax import export as jax_export
from jax.sharding import AbstractMesh, AxisType, NamedSharding

from torch_stablehlo.exported_program import INPUT_UPDATE, STATE, STATE_UPDATE, USER_OUTPUT
from torch_stablehlo.runtime import pjrt, spmd
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy
from torch_stablehlo.stablehlo_ir.shardy import num_devices
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..conversion.calls import tensor_inputs, unflatten_outputs
from ..conversion.signature import InputSlot, Signature
from ..errors import InputError
from .versions import DEFAULT_TARGET
from .weights import alias_map
from .xla_module import (CALLING_CONVENTION_VERSION, SEED_INPUT, SHARDY_CALLING_CONVENTION_VERSION,
                         check_seed_input, xla_module_bytes)


class JaxModel:
    """``model(*args, **kwargs)`` like the torch model, on JAX arrays; ``apply(weights, ...)`` to pass the
    weights explicitly (e.g. under ``jax.jit``); ``exported`` to embed or serialize."""

    def __init__(self, exported: jax_export.Exported, weights: tuple, signature: Signature,
                 mesh: jax.sharding.Mesh | None = None):
        self.exported = exported
        self.weights = weights  # signature.weights' values on the device
        self.signature = signature
        self.mesh = mesh  # the devices a partitioned program runs on
        self._seed = 0  # the next call's seed, where the program draws random numbers

    def apply(self, weights, *args, **kwargs):
        """Run with ``weights`` (``@main`` order, as ``self.weights``) and ``seed=`` where the program draws random
        numbers. 64-bit inputs need JAX's x64 mode."""
        return self._split(self._main(weights, {}, *self._flat_inputs(args, kwargs)))[1]

    def __call__(self, *args, **kwargs):
        with jax.enable_x64(True):  # scoped, as in runtime.pjrt: int64/float64 inputs stay 64-bit
            args, kwargs = self._prepared(args, kwargs)
            return self.apply(self.weights, *args, **kwargs)

    def manual_seed(self, seed: int) -> "JaxModel":
        """Seed the calls that pass no ``seed``: the next one draws from ``seed``, each after it from the next
        seed (the artifact's ``manual_seed``). Returns the model."""
        self._seed = int(seed)
        return self

    def _prepared(self, args, kwargs) -> tuple[tuple, dict]:
        """A call's inputs placed over the mesh as the signature says, with the model's next seed where the
        program draws random numbers and the call passes none."""
        if self.mesh is not None:  # each input split over the devices as the signature says
            args, kwargs = jax.tree_util.tree_map(jnp.asarray, (args, kwargs))
            args, kwargs = jax.device_put((args, kwargs), self._input_layouts(args, kwargs))
        if self.signature.takes_rng_seed and SEED_INPUT not in kwargs:
            kwargs = {**kwargs, SEED_INPUT: self._seed}
            self._seed += 1
        return args, kwargs

    def _flat_inputs(self, args, kwargs) -> tuple[list, list]:
        """The tensor inputs in ``@main`` order, and ``[rng_seed]`` (``kwargs``' ``seed``) where ``@main`` takes it."""
        if not self.signature.takes_rng_seed:
            return tensor_inputs(self.signature, args, kwargs), []
        if SEED_INPUT not in kwargs:
            raise InputError(f"this program draws random numbers: pass its seed as {SEED_INPUT}= (an int64 scalar)")
        kwargs = dict(kwargs)
        seed = jnp.asarray(kwargs.pop(SEED_INPUT), dtype=jnp.int64)
        return tensor_inputs(self.signature, args, kwargs), [seed]

    def _main(self, weights, state: dict, tensors: list, seed: list) -> list:
        """``@main``'s results for the weights and state (by name), the tensor inputs and the seed."""
        weight = iter(weights)
        held = [state[slot.name] if slot.kind == STATE else next(weight) for slot in self.signature.held_inputs]
        return list(self.exported.call(*held, *tensors, *seed))

    def _split(self, results: list) -> tuple[dict, object]:
        """``@main``'s results as the state's new values (by name) and the model's outputs in its structure
        (constant outputs are the signature's, not ``@main``'s)."""
        names = {slot.target: slot.name for slot in self.signature.state}
        slots = self.signature.main_outputs
        state = {names[s.target]: value for s, value in zip(slots, results) if s.kind == STATE_UPDATE}
        returned = iter(value for s, value in zip(slots, results) if s.kind == USER_OUTPUT)
        outputs = [next(returned) if s.tensor is not None else s.value for s in self.signature.user_outputs]
        return state, unflatten_outputs(self.signature, outputs)

    def _input_layouts(self, args, kwargs):
        """A sharding per input leaf: the signature's for tensor inputs (replicated where it names none)."""
        slots = iter(s for s in self.signature.user_inputs if s.tensor is not None)
        return jax.tree_util.tree_map(lambda _: spmd.sharding(self.mesh, next(slots).sharding), (args, kwargs))


class StatefulJaxModel(JaxModel):
    """A program with state (``signature.state``: buffers and lifted constants it writes, e.g. a static KV cache).

    ``apply(weights, state, *args, **kwargs) -> (state, outputs)`` is its functional form, the state a dict
    name -> array; ``model(*args, **kwargs)`` carries the state from call to call on the device, donated to each
    call (``jax.jit(donate_argnums=...)``: XLA updates it in place, and the arrays passed are consumed). One
    stream at a time: the state is the model's. ``state`` reads it, ``reset_state`` returns it to its exported
    values."""

    def __init__(self, exported: jax_export.Exported, weights: tuple, signature: Signature,
                 mesh: jax.sharding.Mesh | None, exported_state: Callable[[], dict]):
        super().__init__(exported, weights, signature, mesh)
        self._exported_state = exported_state  # the exported values, placed afresh on each call
        self._state: dict | None = None  # the state after the last call, on the device
        self._step = jax.jit(self._main, donate_argnums=1)
        self._lock = threading.Lock()  # one call at a time: each donates the state the one before left

    def apply(self, weights, state: dict, *args, **kwargs) -> tuple[dict, object]:
        """Run with ``weights`` (as ``self.weights``) and ``state`` (as ``self.state``); returns the new state and
        the model's outputs. Under ``jax.jit(..., donate_argnums=1)`` the state is updated in place."""
        return self._split(self._main(weights, state, *self._flat_inputs(args, kwargs)))

    def __call__(self, *args, **kwargs):
        with jax.enable_x64(True):
            args, kwargs = self._prepared(args, kwargs)
            tensors, seed = self._flat_inputs(args, kwargs)
            with self._lock:
                state = self._state if self._state is not None else self._exported_state()
                self._state, outputs = self._split(self._step(self.weights, state, tensors, seed))
        return outputs

    @property
    def state(self) -> dict[str, jax.Array]:
        """The state as it is now: name -> an array of its own on the device (``apply`` takes it)."""
        with self._lock:
            if self._state is None:
                return self._exported_state()
            with jax.enable_x64(True):
                return {name: jnp.array(value, copy=True) for name, value in self._state.items()}

    def reset_state(self) -> "StatefulJaxModel":
        """Return the state to its exported values (the next call starts from them). Returns the model."""
        self._state = None
        return self


def to_jax(artifact, target_version: str = DEFAULT_TARGET) -> JaxModel:
    """The JAX handoff of ``artifact`` (a StableHLOArtifact): a ``StatefulJaxModel`` where the program has state,
    else a ``JaxModel``; its weights are placed on JAX's default device."""
    signature = artifact.signature
    written = [slot.target for slot in signature.outputs if slot.kind == INPUT_UPDATE]
    if written:
        raise NotImplementedError(f"to_jax: the program writes its input(s) {', '.join(written)} in place, which "
                                  "a JAX function cannot do (JAX arrays are immutable); return the new values from "
                                  "forward instead, or keep them as module buffers (state)")
    check_seed_input(signature)
    exported = _exported(artifact, target_version)
    artifact._require_weights("hand to JAX")
    aliases = alias_map({slot.target: artifact.weights[slot.target] for slot in signature.weights})
    unique = [slot for slot in signature.weights if aliases[slot.target] == slot.target]
    placed = dict(zip([slot.target for slot in unique], _placed(artifact, unique)))
    weights = tuple(placed[aliases[slot.target]] for slot in signature.weights)
    mesh = pjrt.device_mesh(artifact.platform, tuple(signature.mesh.items())) if signature.mesh else None
    if not signature.state:
        return JaxModel(exported, weights, signature, mesh)
    return StatefulJaxModel(exported, weights, signature, mesh,
                            lambda: dict(zip([s.name for s in signature.state], _placed(artifact, signature.state))))


def _placed(artifact, slots: list[InputSlot]) -> list:
    """The values of held inputs ``slots``, each placed as ``@main`` takes it (over the mesh: each device its
    shard)."""
    return pjrt.put([to_numpy(artifact.weights[s.target]) for s in slots], artifact.platform, artifact.signature.mesh,
                    [s.sharding for s in slots])


def _exported(artifact, target_version: str) -> jax_export.Exported:
    """The ``jax.export.Exported`` of the artifact's ``@main``, its module serialized at ``target_version``."""
    signature = artifact.signature
    scope = jax_export.SymbolicScope(_dim_constraints(signature))
    in_avals = tuple(_aval(slot.tensor, scope) for slot in signature.caller_inputs)  # jax passes the platform index
    out_avals = tuple(_aval(slot.tensor, scope) for slot in signature.main_outputs)
    in_shardings = tuple(_named(signature.mesh, slot.sharding) for slot in signature.caller_inputs)
    out_shardings = tuple(_named(signature.mesh, ((),) * len(a.shape)) for a in out_avals)  # replicated
    return jax_export.Exported(  # its fields as of jax 0.10 (the ones named _... too)
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
        nr_devices=num_devices(signature.mesh),
        platforms=artifact.platforms,
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(),
        mlir_module_serialized=xla_module_bytes(artifact.stablehlo_text, signature, artifact.platforms, target_version),
        calling_convention_version=SHARDY_CALLING_CONVENTION_VERSION if signature.mesh else CALLING_CONVENTION_VERSION,
        module_kept_var_idx=tuple(range(len(in_avals))),
        uses_global_constants=signature.is_dynamic or signature.takes_platform_index,  # as jax.export sets it
        _get_vjp=None)


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
