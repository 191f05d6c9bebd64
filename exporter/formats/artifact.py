"""The exported artifact: StableHLO text, its signature and its weights; callable on PJRT.

It is saved as a bundle (``save``, read back by ``load_artifact``), as a TF SavedModel
(``save_tf_saved_model``) or handed to JAX (``to_jax``).
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from torch_stablehlo.exported_program import INPUT_UPDATE, STATE, STATE_UPDATE
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.dtypes import to_numpy, to_torch, uncarried
from torch_stablehlo.stablehlo_ir.platforms import for_platform
from torch_stablehlo.stablehlo_ir.unused import results_only

from . import bundle
from ..errors import DimensionError, ExportError, WeightsError
from .jax_handoff import to_jax
from ..autoshard.plan import ShardingPlan
from ..conversion.calls import check_dims, output_values, tensor_inputs, unflatten_outputs, validate_inputs
from ..conversion.signature import Signature, unnamed_types
from .versions import DEFAULT_TARGET
from .weights import alias_map, attach, missing_data


CHECKED_SHAPES = 1024
"""How many input shape signatures an artifact remembers as checked (then it forgets them all and starts again)."""


class _CallLayout(NamedTuple):
    """What each call reads from the signature, worked out once (a decode loop calls a program for every token)."""
    input_names: list           # the tensor user inputs' names and specs, in @main order
    input_specs: list
    dynamic: bool               # some input has a symbolic dim or a call gives sizes (an executable per shape signature)
    checks_dims: bool           # a symbolic dim, a scalar input or a mesh: check_dims has work to do
    scalars: bool               # some input is a Python int (its value, not only the shapes, is checked)
    takes_rng_seed: bool        # @main ends with the rng_seed argument
    one_stream: bool            # state or random draws: calls run one at a time
    held_shapes: list           # the held arguments' shapes, @main's leading ones
    state_results: list         # (result index, state target, its position among the held arguments)
    carried: frozenset          # the state's result indices (its new values stay on the device)
    call_sizes: bool            # the call gives sizes read from data (Signature.call_sizes): _execute_sized
    # where every input is a tensor that the call's pytree holds as a leaf (args and kwargs, no nesting): how many
    # positional ones, and the keywords in @main order; None otherwise
    flat_call: tuple[int, tuple[str, ...]] | None

    def given_tensors(self, args: tuple, kwargs: dict) -> list | None:
        """The tensor inputs in ``@main`` order where the call passes exactly the flat inputs as tensors (what a
        decode loop does every token, without flattening the pytree); None: ``tensor_inputs`` reads the call."""
        if self.flat_call is None or len(args) != self.flat_call[0] or len(kwargs) != len(self.flat_call[1]):
            return None
        try:
            tensors = [*args, *(kwargs[key] for key in self.flat_call[1])]
        except KeyError:
            return None
        return tensors if all(type(t) is torch.Tensor for t in tensors) else None

    @classmethod
    def of(cls, signature: Signature) -> "_CallLayout":
        held = signature.held_inputs
        position = {slot.target: i for i, slot in enumerate(held) if slot.kind == STATE}
        outputs = signature.main_outputs
        inputs = [slot for slot in signature.user_inputs if slot.tensor is not None]
        dynamic = signature.is_dynamic or bool(signature.call_sizes)
        return cls([slot.name for slot in inputs], [slot.tensor for slot in inputs], dynamic,
                   dynamic or bool(signature.mesh) or any(slot.scalar for slot in inputs),
                   any(slot.scalar for slot in inputs),
                   signature.takes_rng_seed, bool(signature.state) or signature.takes_rng_seed,
                   [slot.tensor.shape for slot in held],
                   [(i, outputs[i].target, position[outputs[i].target]) for i in sorted(signature.state_results)],
                   frozenset(signature.state_results), bool(signature.call_sizes), _flat_call(signature))


def _flat_call(signature: Signature) -> tuple[int, tuple[str, ...]] | None:
    tree = signature.in_tree
    parts = [tree.child(i) for i in range(tree.num_children)]
    slots = signature.user_inputs
    if not parts or any(not child.is_leaf() for part in parts for child in part.children()) or \
            any(slot.tensor is None or slot.scalar for slot in slots):
        return None
    return parts[0].num_children, tuple(parts[1].context) if len(parts) == 2 else ()


class StableHLOArtifact:
    """A converted program. Call it like the original model; it runs on the PJRT runtime.

    ``weights`` holds the values of ``@main``'s leading arguments: the weights, and the exported values of the
    program's state (``signature.state``: the buffers and lifted constants it writes, e.g. a static KV cache).
    The state's current value lives on the device, donated to each call and replaced by its result; it reaches
    the host only when read (``state``); ``reset_state`` returns it to the exported values.

    ``platform`` is the PJRT platform it runs on; ``platforms`` those the module is lowered for. A module lowered
    for several takes the platform index first: the artifact fixes it to its platform's (``runnable_text``), so
    a caller never passes it."""

    def __init__(self, stablehlo_text: str, signature: Signature, weights: dict[str, torch.Tensor],
                 *, platform: str = "cpu", sharding_plan: ShardingPlan | None = None):
        self.stablehlo_text = stablehlo_text
        self.signature = signature
        self.weights = weights
        self.platform = platform
        self._executables = pjrt.LeastRecentlyUsed()  # by @main's argument shapes where dynamic (bounded)
        self._device_weights: dict[str, object] = {}
        self._device_state: dict[str, object] = {}  # each state slot's value after the last call, by target
        self._held: tuple[object, list] | None = None  # (the mesh executable they are laid out for, held arrays)
        self._checked_shapes: set[tuple] = set()  # input shapes whose symbolic dims passed check_dims
        self._weight_readers: dict[str, object] = {}  # weights read shard by shard from files (load_artifact)
        self._seed = 0  # the next call's rng_seed, where the program draws random numbers
        self._lock = threading.RLock()  # calls of one stream (state, seeds) one at a time: see _execute
        self._sharding_plan = sharding_plan  # the searched plan (with its cost), where shardings="auto" chose it

    @property
    def sharding_plan(self) -> ShardingPlan | None:
        """The plan ``@main`` is partitioned with (name -> spec of every weight and input given one; ``print`` it
        for a picture per tensor); None on one device."""
        if self._sharding_plan is None and self.signature.mesh:
            self._sharding_plan = ShardingPlan.of_signature(self.signature)
        return self._sharding_plan

    # -- running ------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        tensors = self._layout.given_tensors(args, kwargs)
        if tensors is None:
            tensors = tensor_inputs(self.signature, args, kwargs)
        return unflatten_outputs(self.signature, self.run_flat(tensors))

    def run_flat(self, tensors: list[torch.Tensor]) -> list:
        """Run on the tensor inputs in ``@main`` order; returns the user outputs, flat (tensors, and Python
        scalars and constants where the model returns them). Inputs the model mutates are updated in place;
        the state stays on the device for the next call."""
        arrays, layout = self._execute(tensors), self._layout
        results = iter(output_values(self.signature, [None if i in layout.carried else to_torch(a)
                                                     for i, a in enumerate(arrays)]))
        inputs = dict(zip(layout.input_names, tensors))
        user_outputs, updates = [], []
        for slot in self.signature.outputs:
            value = next(results) if slot.tensor is not None else None
            if slot.kind == STATE_UPDATE:  # the state, carried to the next call on the device (_execute)
                continue
            if slot.kind == INPUT_UPDATE:
                updates.append((inputs[slot.target], value))
            else:
                user_outputs.append(slot.user_value(value))
        with torch.no_grad():
            for tensor, value in updates:  # the caller's tensor, updated in place as eager's forward does
                tensor.copy_(value)
        return user_outputs

    def main_results(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every result of ``@main`` for the tensor inputs in ``@main`` order (weights, state and ``rng_seed``
        added here), as torch tensors: nothing sliced, cast back or matched to the signature's outputs (the
        state's new values copied: the device keeps them for the next call)."""
        carried = self._layout.carried
        return [to_torch(np.array(a)) if i in carried else to_torch(a) for i, a in enumerate(self._execute(tensors))]

    def _execute(self, tensors: list[torch.Tensor]) -> list:
        """``@main``'s results on the device for the tensor inputs in ``@main`` order; the state passed is
        consumed (donated) and its new values are kept for the next call.

        Calls from several threads: a program with state (or random draws) is one stream, so its calls run one at
        a time, each taking the state the one before left (``_lock`` held for the whole call: a donated buffer is
        never handed to two executions); calls of a program without either run at once, only the lookups of
        executables and placed weights taking turns."""
        layout = self._layout
        validate_inputs(layout.input_specs, tensors)
        if layout.checks_dims:
            self._check_dims(tensors, layout.scalars)
        if layout.call_sizes:  # no state, no random draws (signature): a run changes nothing
            return self._execute_sized(tensors)
        with self._lock if layout.one_stream else contextlib.nullcontext():
            return self._run([to_numpy(t) for t in tensors + self._seeds()])

    def _run(self, hosts: list, sizes_only: bool = False) -> list:
        """``@main``'s results for the host arrays after the held arguments; the state's new values kept. With
        ``sizes_only``, the sizes a call gives as computed (``_execute_sized``) and nothing else."""
        layout = self._layout
        with self._lock:
            executable = self._compiled([h.shape for h in hosts], sizes_only)
            held_arrays = self._held_on_device(executable)
        arrays = executable.execute(held_arrays + executable.put(hosts, first=len(held_arrays)))
        if not sizes_only:
            for result, target, position in layout.state_results:  # the next call's state
                self._device_state[target] = held_arrays[position] = arrays[result]
        return arrays

    def _execute_sized(self, tensors: list[torch.Tensor]) -> list:
        """``@main``'s results where a call gives sizes read from data (``Signature.call_sizes``): the sizes first,
        by ``@main`` cut down to computing them (given sizes 0, which only a size read from a tensor of another
        such size reads), then ``@main`` with the sizes computed, until the sizes given are those it computes."""
        names, hosts = self.signature.call_sizes, [to_numpy(t) for t in tensors]
        positions = self.signature.call_size_results
        given, sizes_only = [0] * len(names), True
        for _ in range(len(names) + 1):
            arrays = self._run(hosts + [np.zeros((max(size, 0), max(-size, 0), 0), np.int8) for size in given],
                               sizes_only)
            computed = [int(np.asarray(arrays[i if not sizes_only else n])) for n, i in enumerate(positions)]
            if computed == given and not sizes_only:
                return arrays
            given, sizes_only = computed, False
        raise DimensionError(f"the sizes {', '.join(names)} read from tensor data did not settle: "
                             f"{dict(zip(names, given))} computed last")

    def _check_dims(self, tensors: list[torch.Tensor], scalars: bool) -> None:
        """Symbolic dims in range, and equal where they must be (``check_dims``); shapes that passed are not
        checked again (sympy takes about half a millisecond, at every token of a dynamic-prompt decode loop)."""
        shapes = tuple(tensor.shape for tensor in tensors)
        if scalars or shapes not in self._checked_shapes:
            check_dims(self.signature, tensors)
            if not scalars:
                if len(self._checked_shapes) >= CHECKED_SHAPES:
                    self._checked_shapes.clear()
                self._checked_shapes.add(shapes)

    @functools.cached_property
    def _layout(self) -> "_CallLayout":
        return _CallLayout.of(self.signature)

    @property
    def platforms(self) -> tuple[str, ...]:
        """The platforms the module is lowered for, in the order of its platform index (a bundle made before they
        were recorded: the one it runs on)."""
        return tuple(self.signature.platforms) or (self.platform,)

    def runnable_text(self) -> str:
        """The module as it runs on ``platform``: where it is lowered for several platforms, ``@main``'s platform
        index fixed to this one's (``stablehlo_ir.platforms.for_platform``), so only its branches are compiled.
        Raises ValueError if the module is not lowered for ``platform``."""
        if not self.signature.takes_platform_index:
            return self.stablehlo_text
        if self.platform not in self.platforms:
            raise ValueError(f"this module is lowered for the platforms {', '.join(self.platforms)}, not for "
                             f"'{self.platform}', where this artifact runs: load it with platform= one of them")
        return for_platform(self.stablehlo_text, self.platforms.index(self.platform))

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The program's state as it is now (name -> a torch tensor of its own), read from the device."""
        with self._lock:
            return {slot.name: uncarried(to_torch(np.array(self._device_state[slot.target])),
                                         slot.tensor.torch_dtype)
                    if slot.target in self._device_state else self.weights[slot.target].clone()
                    for slot in self.signature.state}

    def reset_state(self) -> "StableHLOArtifact":
        """Return the state to its exported values (the next call starts from them). Returns the artifact."""
        with self._lock:
            self._device_state.clear()
            self._held = None
        return self

    def manual_seed(self, seed: int) -> "StableHLOArtifact":
        """Seed the random ops: the next call draws from ``seed``, each call after it from the next seed,
        so repeated calls differ (like eager's generator) and re-seeding reproduces them."""
        self._seed = int(seed)
        return self

    def _seeds(self) -> list[torch.Tensor]:
        """The ``rng_seed`` argument where ``@main`` takes one (then advanced for the next call)."""
        if not self._layout.takes_rng_seed:
            return []
        self._seed += 1
        return [torch.tensor(self._seed - 1, dtype=torch.int64)]

    def _compiled(self, input_shapes: list, sizes_only: bool = False) -> pjrt.Executable:
        """The executable for ``@main``'s arguments after the held ones of these shapes: one for a static module;
        for a dynamic one, one per shape signature of the call (the module refined to it, the held arguments'
        shapes, which never change, added; see ``stablehlo_ir.refine``), looked up by the given shapes alone (a
        decode step's lookup hashes its two inputs' shapes, not a hundred weights'). With ``sizes_only``, of
        ``@main`` returning only the sizes a call gives."""
        shapes = tuple(tuple(shape) for shape in input_shapes) if self._layout.dynamic else ()
        key = ("sizes only", shapes) if sizes_only else shapes
        if key not in self._executables:
            text = self.runnable_text()
            if sizes_only:
                text = results_only(text, self.signature.call_size_results)
            self._executables[key] = pjrt.Executable(
                text, self.platform, arg_shapes=[*map(tuple, self._layout.held_shapes), *shapes] if shapes else None,
                mesh=self.signature.mesh)
        return self._executables[key]

    def _held_on_device(self, executable: pjrt.Executable) -> list:
        """``@main``'s held arguments on the device, the list ``_execute`` puts each call's new state into (made
        again for an executable over a mesh other than the last one's, or after a reset: on one device, every
        executable takes them alike)."""
        layouts = executable if executable.mesh is not None else None
        if self._held is None or self._held[0] is not layouts:
            self._held = (layouts, self._placed_held(executable))
        return self._held[1]

    def _placed_held(self, executable: pjrt.Executable) -> list:
        """The held arguments placed. Weights: copies made once (over a mesh, each device holding its shard only,
        as ``executable`` takes it); aliases (tied weights) share one copy where the program takes them laid out
        alike. State: its value after the last call, else a copy of its exported value of its own (each call
        consumes it)."""
        slots = self.signature.held_inputs
        index = {s.target: i for i, s in enumerate(slots)}
        weights = [s.target for i, s in enumerate(slots) if s.kind != STATE and (
            s.target not in self._device_weights or not executable.holds(i, self._device_weights[s.target]))]
        state = [s.target for s in slots if s.kind == STATE and s.target not in self._device_state]
        if weights or state:
            self._require_weights("run")
        if weights:
            canonical = alias_map({name: self.weights[name] for name in weights})
            placed: dict[str, list] = {}  # canonical name -> its copies, one per layout the program takes it in
            for name in weights:
                copies = placed.setdefault(canonical[name], [])
                copy = next((c for c in copies if executable.holds(index[name], c)), None)
                if copy is None:  # a tied weight the plan splits otherwise than its twin: a copy of its own
                    copy = executable.put([self._host(name)], first=index[name])[0]
                    copies.append(copy)
                self._device_weights[name] = copy
        self._device_state.update({name: executable.put([self._host(name)], first=index[name])[0] for name in state})
        return [self._device_state[s.target] if s.kind == STATE else self._device_weights[s.target] for s in slots]

    def _host(self, name: str):
        """A held argument's value as the runtime places it: the file reader (``local_shards``) or numpy."""
        return self._weight_readers.get(name) or to_numpy(self.weights[name])

    # -- weightless artifacts (a meta-device export, a weightless bundle) ---------------
    @property
    def is_weightless(self) -> bool:
        """Whether some weight has a shape and dtype but no data yet (see ``attach_weights``)."""
        return bool(missing_data(self.weights))

    def attach_weights(self, source) -> "StableHLOArtifact":
        """Give the weights that have no data their values, by name, from ``source``: a safetensors file
        (e.g. ``model.safetensors``), a list of files, a folder of shards, or a ``{name: tensor}`` dict such
        as a model's ``state_dict()``. Raises WeightsError naming each weight ``source`` lacks or has with
        another shape or dtype (nothing is attached then). Returns the artifact."""
        weights = attach(self.weights, source)
        with self._lock:
            self.weights = weights
            self._device_weights.clear()
            self._device_state.clear()
            self._held = None
        return self

    def _require_weights(self, action: str) -> None:
        absent = [name for name in missing_data(self.weights) if name not in self._weight_readers]
        if absent:
            shown = ", ".join(absent[:8]) + (f", ... ({len(absent)} in all)" if len(absent) > 8 else "")
            raise WeightsError(f"cannot {action} a weightless artifact: weights {shown} have no data; attach them "
                               f"with artifact.attach_weights('model.safetensors') or "
                               f"load_artifact(path, weights=...)")

    def _require_no_call_sizes(self, action: str) -> None:
        if self.signature.call_sizes:
            raise NotImplementedError(
                f"cannot {action} a program whose call gives sizes read from tensor data "
                f"({', '.join(self.signature.call_sizes)}: with no bound, or taken by an op that cannot take them "
                "padded to one): @main takes them as arguments, which only this artifact's own call finds (it runs "
                "@main until they agree), here or loaded from its bundle (save it with artifact.save); bound them "
                "where they are made (torch._check(u <= N)) and keep them to ops that take padded rows")

    def _require_sized_outputs(self, action: str) -> None:
        self._require_no_call_sizes(action)
        if self.signature.sizes:
            raise NotImplementedError(
                f"cannot {action} a program whose outputs have data-dependent sizes "
                f"({', '.join(self.signature.sizes)}, from ops such as nonzero or unique): @main returns them "
                "padded, with their sizes as extra results, which only this artifact's own call slices")

    # -- saving and handing off ----------------------------------------------------
    def save(self, path: str | os.PathLike, *, target_version: str = DEFAULT_TARGET,
             shard_size: int = bundle.DEFAULT_SHARD_BYTES, include_text: bool = True) -> Path:
        """Write the bundle folder (see ``exporter.formats.bundle``) atomically: a failure leaves nothing at ``path``.

        ``target_version``: the StableHLO version to serialize at: ``week12`` (readable by
        consumers up to about 12 weeks old), ``week4``, ``current``, ``minimum`` or e.g. ``1.10.0``.
        Weights go to safetensors shards of at most ``shard_size`` bytes. An existing bundle at
        ``path`` is replaced; anything else there is an error.
        """
        unnamed = unnamed_types(self.signature)
        if unnamed:
            raise ExportError(f"cannot save a bundle of this program: its manifest records the pytree of its inputs "
                              f"and outputs, which holds a {unnamed}")
        return bundle.save_bundle(path, self.stablehlo_text, self.signature, self.weights,
                                  target_version=target_version, shard_bytes=shard_size, include_text=include_text)

    def save_tf_saved_model(self, path: str | os.PathLike, signature_name: str = "serving_default", *,
                            target_version: str = DEFAULT_TARGET) -> Path:
        """Write a TF SavedModel serving this program through XlaCallModule (needs tensorflow); the state, where
        the program has some, in variables each call updates (one stream at a time); a ``seed`` input where it
        draws random numbers (see ``formats.saved_model``)."""
        from .saved_model import save_saved_model  # tensorflow takes seconds to import: only when asked

        self._require_weights("save a SavedModel of")
        self._require_sized_outputs("save a SavedModel of")
        if self.signature.mesh:
            raise NotImplementedError(f"cannot save a SavedModel of a program partitioned over the mesh "
                                      f"{self.signature.mesh}: TF's XlaCallModule runs it on one device; export "
                                      "without a mesh for TF serving")
        return save_saved_model(self, path, signature_name=signature_name, target_version=target_version)

    def to_jax(self, *, target_version: str = DEFAULT_TARGET):
        """A ``JaxModel``: callable on JAX arrays, with ``.exported`` (a ``jax.export.Exported`` whose module
        is serialized at ``target_version``, for ``Exported.serialize``); a ``StatefulJaxModel``, carrying the
        state on the device, where the program has some (see ``formats.jax_handoff``)."""
        self._require_sized_outputs("hand to JAX")
        return to_jax(self, target_version)


def load_artifact(path: str | os.PathLike, *, platform: str = "cpu", weights=None,
                  local_shards: bool = False, trusted: bool = False) -> StableHLOArtifact:
    """Read a bundle written by ``StableHLOArtifact.save``; raises BundleError if a file is missing,
    truncated or corrupt, BundleVersionError if it needs a newer StableHLO or bundle format.

    ``weights`` (a safetensors file, files, a folder or a dict; see ``attach_weights``) gives a weightless
    bundle its weights. ``local_shards`` (for a program over a mesh, e.g. one process of several under
    ``jax.distributed``): read from the bundle's files only the weight shards this process's devices hold,
    when they are first placed; such an artifact runs but holds no weight values of its own. ``trusted``: the
    caller vouches for the bundle, whose module is then read without first reading it in a child process (which
    protects this process from crafted bytecode, for about half a second; see docs/security.md)."""
    loaded = bundle.load_bundle(path, local_shards=local_shards, trusted=trusted)
    if local_shards and not loaded.signature.mesh:
        raise ValueError(f"{path}: local_shards reads the shards of a program over a device mesh; this bundle's "
                         "program runs on one device (load it without local_shards)")
    artifact = StableHLOArtifact(loaded.stablehlo_text, loaded.signature, loaded.weights, platform=platform)
    artifact._weight_readers = loaded.readers
    return artifact.attach_weights(weights) if weights is not None else artifact
