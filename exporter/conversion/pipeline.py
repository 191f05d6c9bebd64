"""The one conversion pipeline, which ``export_to_stablehlo`` and ``find_divergence`` both run: the model exported
(or the ExportedProgram taken), its quantization prepared, in-place ops functionalised and ops without a lowering
decomposed, stacks of weights (``scan_layers``) folded, the signature read and the graph to lower chosen.

What each graph writes in place is found once (``inplace.InPlaceWrites``): the unsupported targets, the mutations
left to the re-trace (``decomposition.retraced``), the signature's input kinds and the graph walk all read that one
value.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch.export import ExportedProgram

from torch_stablehlo.aten_lowerings import op_name
from torch_stablehlo.exported_program import CONSTANT, kind_name, shape_env_of
from torch_stablehlo.quantize import plain_quantized_weights, prepare_quantized

from ..autoshard.choose import search_plan
from ..errors import LoweringError, ShardingError, UnsupportedOpsError
from . import decomposition
from .graph_lowering import unsupported_targets
from .inplace import InPlaceWrites
from .locations import describe
from .lowerable import Conversion, lowerable
from .read_only import untouched
from .signature import Signature, signature_of
from .weight_stacks import fold_weight_stacks


def convert(model, args=(), kwargs=None, *, dynamic_shapes=None, quantized_ops: str = "fused", mesh=None,
            shardings=None, platforms: Sequence[str] = ()) -> Conversion:
    """``model`` (an ``nn.Module``, exported here, or an ``ExportedProgram``) ready to lower; ``quantized_ops``,
    ``mesh``, ``shardings`` and ``platforms`` (checked) as ``export_to_stablehlo`` takes them; no platforms:
    JAX's default backend lowers the JAX functions, and a user's lowering for any platform may be picked."""
    exported = _exported(model, args, kwargs, dynamic_shapes)
    with untouched(shape_env_of(exported)):  # the caller's program stays as it was (``read_only``)
        program, writes = _ready(exported)
        signature = signature_of(program, writes.kinds)
        if isinstance(shardings, str):
            shardings = _searched_plan(program, signature, mesh, shardings, platforms)
        return lowerable(program, signature, writes, mesh, shardings, platforms, quantized_ops)


def prepared_program(model, args=(), kwargs=None, dynamic_shapes=None) -> tuple[ExportedProgram, Signature]:
    """``model`` exported and made convertible as ``convert`` does, and its (unsharded) signature: what the
    sharding plans are made for."""
    exported = _exported(model, args, kwargs, dynamic_shapes)
    with untouched(shape_env_of(exported)):
        program, writes = _ready(exported)
        return program, signature_of(program, writes.kinds)


def _ready(exported: ExportedProgram) -> tuple[ExportedProgram, InPlaceWrites]:
    """The program with quantization prepared, decomposed and its weight stacks folded, and what it writes."""
    program, writes = _decomposed(prepare_quantized(exported))
    folded = fold_weight_stacks(program)
    return folded, writes if folded is program else InPlaceWrites.of_program(folded)


def _searched_plan(program: ExportedProgram, signature: Signature, mesh, shardings: str, platforms):
    if shardings != "auto":
        raise ShardingError(f"shardings={shardings!r}: give 'auto' (searched over the mesh) or a mapping of names "
                            "to specs")
    if mesh is None:
        raise ShardingError("shardings='auto' needs a device mesh to search over: pass mesh={'axis': size, ...}")
    return search_plan(program, signature, mesh, platform=platforms[0] if platforms else "cpu")


def _exported(model, args, kwargs, dynamic_shapes) -> ExportedProgram:
    if isinstance(model, ExportedProgram):
        return model
    if isinstance(model, torch.nn.Module):
        if _on_meta(model):  # weightless: trace with meta inputs too (torch refuses mixed devices)
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, kwargs))
        return torch.export.export(plain_quantized_weights(model), tuple(args), kwargs or {},
                                   dynamic_shapes=dynamic_shapes)
    raise TypeError(f"export_to_stablehlo takes a torch.nn.Module or a torch.export.ExportedProgram, "
                    f"got {type(model).__name__}")


def _decomposed(program: ExportedProgram) -> tuple[ExportedProgram, InPlaceWrites]:
    """Functionalise in-place ops and decompose only the ops without a lowering; the program and what its graph
    writes.

    A re-trace (``decomposition.retraced``, what ``run_decompositions`` does) costs about 1 s for GPT-2, so
    it runs only when the graph has an op we cannot lower or a mutation the walk cannot functionalise
    itself (``exporter.conversion.inplace``: one of a user input, parameter or buffer, or of an alias read later),
    again while a decomposition leaves new ops without a lowering; raises once,
    listing every op that has neither a lowering nor a decomposition.
    """
    writes, missing = _checked(program)
    decomposable = decomposition.decompositions(missing)
    _refuse_uncarried_constants(program, writes)
    if decomposable or writes.left or any(getattr(t, "__module__", None) in _RETRACED for t in missing):
        program = decomposition.retraced(program, decomposable)
        writes, missing = _checked(program)
    tried = set(decomposable)
    while decomposable := {t: d for t, d in decomposition.decompositions(missing).items() if t not in tried}:
        tried |= set(decomposable)
        program = decomposition.retraced(program, decomposable)
        writes, missing = _checked(program)
    if missing:
        raise UnsupportedOpsError({_unsupported_name(t, nodes[0]): (len(nodes), describe(nodes[0]))
                                   for t, nodes in missing.items()})
    uncarried = writes.left
    if uncarried:
        raise LoweringError(f"{len(uncarried)} in-place write(s) cannot be carried, e.g. {op_name(uncarried[0].target)} "
                            f"at {describe(uncarried[0])} ({uncarried[0].format_node()}): it writes part of a tensor "
                            "that is read again through another alias, or state torch did not functionalise; "
                            "write the whole tensor (index_copy_, copy_) instead")
    return program, writes


_RETRACED = ("torch._functorch.predispatch",)
"""Modules of the functions a pre-dispatch program calls that the re-trace traces through (vmap's
batching markers: the retraced program computes the batch directly)."""


def _unsupported_name(target, node: torch.fx.Node) -> str:
    """The op's name; a functionalised custom op's (``auto_functionalized_v2``) with the op it wraps."""
    wrapped = node.args[0] if node.args and isinstance(node.args[0], torch._ops.OpOverload) else None
    return f"{op_name(target)}({op_name(wrapped)})" if wrapped is not None and "auto_functionalized" in \
        op_name(target) else op_name(target)


def _refuse_uncarried_constants(program: ExportedProgram, writes: InPlaceWrites) -> None:
    """Raise LoweringError for a write the walk cannot carry (part of a tensor, through a view) into a lifted
    constant: the re-trace cannot functionalise those either."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    constants = {n: spec.target for n, spec in zip(placeholders, program.graph_signature.input_specs)
                 if kind_name(spec) == CONSTANT}
    for node in writes.left:
        for placeholder in writes.written.get(node, set()) & set(constants):
            raise LoweringError(
                f"{op_name(node.target)} at {describe(node)} writes part of the lifted constant "
                f"'{constants[placeholder]}' through a view ({node.format_node()}): that state cannot be carried "
                "from call to call (the walk carries whole-tensor writes such as index_copy_ and copy_; torch "
                "cannot functionalise writes to constants); register the tensor as a buffer "
                "(register_buffer(..., persistent=False)) or write the whole tensor")


def _checked(program: ExportedProgram) -> tuple[InPlaceWrites, dict]:
    """What the program's graph writes, and the targets in it without a lowering (reading that)."""
    writes = InPlaceWrites.of_program(program)
    return writes, unsupported_targets(program.graph_module, writes.functional)


def _on_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])
