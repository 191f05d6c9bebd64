"""An engine over a device mesh: one plan for every entry point of ``export_engine``.

The plan is the generate step's (``steps.EngineStep`` over the ``DecodeState``), given (a mapping of names to
specs, or a ``ShardingPlan``) or searched (``shardings="auto"``: ``auto_shardings`` with the state priced as
carried from call to call, so the KV cache is split over its kv heads where that wins). Every entry point then takes
the weights and the state laid out as that plan says and returns the state laid out alike (its results' shardings
are its arguments'), so the runner keeps the state on the mesh's devices between calls and donates it; what the
plan leaves out (a name a mapping does not match, each step's lifted constants, the prompt, the scalars) is
replicated. A prefill returns its caches split as the state's caches are over their heads and head dim (its one
row and its bucket's columns whole), and insert takes them so.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch.utils._pytree as pytree
from jaxlib.mlir import ir

from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.shardy import Spec, normalize_spec, shard_main

from ..conversion.input_shardings import check_mesh
from ..errors import ShardingError
from ..formats.artifact import StableHLOArtifact
from ..formats.engine_artifact import GENERATE, INSERT, PREFILL, SHIFT
from ..plans import auto_shardings, step_layouts

_LENGTH_DIM = 2  # of a cache's [slots, kv heads, length, head dim]


class EngineLayouts(NamedTuple):
    """How every entry point lays out what it shares with the others, read from the generate step's plan."""
    mesh: dict[str, int]
    weights: dict[str, Spec]       # the parameters' and buffers' specs, by name (those not given: replicated)
    state: list[Spec | None]       # per leaf of the DecodeState, in its order (None: replicated)
    prefilled: list[Spec | None]   # per cache tensor a prefill returns (and insert takes)


def step_shardings(step, state, mesh, shardings, platform: str = "cpu"):
    """The shardings to export the generate step with (``shardings``, or with ``"auto"`` the plan searched for
    ``step`` over ``state``); None without a mesh. Checks the mesh against the platform's devices first
    (``MeshError``), so nothing compiles for a mesh that cannot run."""
    if mesh is None:
        if shardings is not None:
            raise ShardingError("export_engine: shardings need a device mesh to split over: pass mesh={'axis': size, "
                                "...} too (or leave shardings out for one device)")
        return None
    mesh = check_mesh(mesh)
    pjrt.device_mesh(platform, tuple(mesh.items()))
    if isinstance(shardings, str) and shardings == "auto":  # another word: export_to_stablehlo says what it takes
        return auto_shardings(step, (state,), mesh=mesh, platform=platform,
                              loop_carried=len(pytree.tree_leaves(state)))
    return shardings


def engine_layouts(step: StableHLOArtifact, state, layer_shapes: list) -> EngineLayouts:
    """The layouts of the generate ``step`` (exported from ``state`` over a mesh) that the other
    entry points take: its weights', its state's, and the prefill's caches (``layer_shapes``: [slots, kv heads,
    length, head dim] per cache tensor, the state's last leaves)."""
    specs = [slot.sharding for slot in step.signature.user_inputs]
    caches = specs[-len(layer_shapes):]
    return EngineLayouts(dict(step.signature.mesh), step_layouts(step, (state,)).weights, specs,
                         [_prefilled_spec(spec, shape) for spec, shape in zip(caches, layer_shapes)])


def _prefilled_spec(spec: Spec | None, layer_shape) -> Spec | None:
    """A state cache's spec for the prefill's cache of one row and a bucket's columns: the slot and length dims
    whole, the others split alike (each carried without its size-1 dims: ``loop_steps.carried_shape``)."""
    if spec is None:
        return None
    kept = [dim for dim, size in enumerate(layer_shape) if dim >= 2 or size != 1]
    full = [()] * len(layer_shape)
    for dim, axes in zip(kept, spec):
        full[dim] = axes
    full[0] = full[_LENGTH_DIM] = ()
    one_row = (1, *layer_shape[1:])
    return tuple(full[dim] for dim, size in enumerate(one_row) if dim >= 2 or size != 1)


def sharded_entry(entry: StableHLOArtifact, layouts: EngineLayouts, inputs: list[Spec | None],
                  results: list[Spec | None]) -> StableHLOArtifact:
    """``entry`` (its ``@main`` taking the weights, then ``inputs``' tensors) over ``layouts.mesh``: the weights
    laid out as the plan says, its other arguments as ``inputs`` say and its results as ``results`` say (None:
    replicated), in the module and in its signature."""
    weights = [layouts.weights.get(slot.name) for slot in entry.signature.weights]
    specs = weights + list(inputs)
    slots = entry.signature.main_inputs
    if len(specs) != len(slots):
        raise AssertionError(f"{len(specs)} argument shardings for {len(slots)} @main arguments")
    full = [_full(spec, slot.tensor.shape) for spec, slot in zip(specs, slots)]
    text = _annotated(entry.stablehlo_text, layouts.mesh, full, results)
    by_slot = dict(zip((id(s) for s in slots), full))
    signature = dataclasses.replace(
        entry.signature, mesh=dict(layouts.mesh),
        inputs=[dataclasses.replace(s, sharding=by_slot[id(s)]) if id(s) in by_slot else s
                for s in entry.signature.inputs])
    return StableHLOArtifact(text, signature, entry.weights, platform=entry.platform)


def _full(spec, shape) -> Spec:
    """``spec`` (None: replicated) with an entry for each of ``shape``'s dims."""
    spec = normalize_spec(spec) if spec is not None else ()
    return (*spec, *[()] * (len(shape) - len(spec)))


def _annotated(text: str, mesh: dict[str, int], arguments: list[Spec], results: list[Spec | None]) -> str:
    """``text`` over ``mesh`` (``shardy.shard_main``): ``@main``'s argument and result shardings set, a result
    without a spec replicated."""
    with make_context():
        module = ir.Module.parse(text)
        main = next(op for op in module.body.operations if op.operation.name == "func.func"
                    and ir.StringAttr(op.attributes["sym_name"]).value == "main")
        types = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        result_specs = list(results) + [None] * (len(types.results) - len(results))
        shard_main(module, main, mesh, arguments,
                   [_full(spec, ir.RankedTensorType(t).shape) for spec, t in zip(result_specs, types.results)])
        return module.operation.get_asm(enable_debug_info=True)


def sharded_entries(entries: dict[str, StableHLOArtifact], layouts: EngineLayouts,
                    admission_leaves: int) -> dict[str, StableHLOArtifact]:
    """The engine's entry points over the mesh (``sharded_entry``): the state in and out as the plan lays it out,
    the prefill's caches out and insert's in (the last of its ``admission_leaves`` inputs after the state) as
    ``layouts.prefilled`` says, the rest replicated."""
    state, prefilled = layouts.state, layouts.prefilled
    others = [None] * (admission_leaves - len(prefilled))
    specs = {PREFILL: ([None] * len(entries[PREFILL].signature.user_inputs), [None, *prefilled]),
             INSERT: ([*state, *others, *prefilled], state),
             GENERATE: ([*state, None], state),
             SHIFT: ([*state, None], state)}
    return {name: sharded_entry(entry, layouts, *specs[name]) for name, entry in entries.items()}
