"""``export_to_stablehlo``: torch model or ExportedProgram -> StableHLOArtifact."""
from __future__ import annotations

import torch
from torch._decomp import decomposition_table
from torch._export.utils import _get_decomp_for_cia
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from torch_stablehlo.aten_lowerings import op_name
from torch_stablehlo.quantize import lowering_graph, plain_quantized_weights, prepare_quantized
from torch_stablehlo.stablehlo_ir.mlir_context import make_context

from .formats.artifact import StableHLOArtifact
from .formats.weights import has_data
from .errors import LoweringError, UnsupportedOpsError
from .conversion.graph_lowering import GraphLowering, unsupported_targets
from .conversion.inplace import unfunctionalised_mutations, written_placeholders
from .conversion.locations import describe
from .conversion.sharding import shard_signature
from .conversion.signature import RETURNED_KINDS, STATE, input_kinds, signature_of
from .conversion.weight_stacks import fold_weight_stacks


def export_to_stablehlo(model, args=(), kwargs=None, *, dynamic_shapes=None, platform: str = "cpu",
                        quantized_ops: str = "fused", mesh=None, shardings=None) -> StableHLOArtifact:
    """Convert ``model`` (an ``nn.Module``, exported here, or an ``ExportedProgram``) to StableHLO.

    Parameters, buffers and lifted constants become leading arguments of
    ``@main``; the artifact keeps their values and passes them on each call.
    Quantized programs (pt2e, torchao weight-only int8) use ``!quant.uniform`` types; ``quantized_ops``
    is ``"fused"`` (products on quantized operands, the form serving compilers take) or ``"unfused"``
    (every dequantize and quantize kept).

    ``mesh`` (axis name -> size, e.g. ``{"data": 2, "model": 4}``) makes ``@main`` an SPMD program over that
    many devices; ``shardings`` maps input and weight names (``fnmatch`` patterns) to specs, one entry per dim:
    a mesh axis, a tuple of axes, or None (see ``exporter.conversion.sharding``; a tensor-parallel plan works too).
    """
    program = convertible_program(model, args, kwargs, dynamic_shapes)
    signature = shard_signature(signature_of(program), mesh, shardings, program.graph_module)
    module = GraphLowering(lowering_graph(program, quantized_ops), signature).lower(make_context())
    text = module.operation.get_asm(enable_debug_info=True)
    return StableHLOArtifact(text, signature, program_weights(program, signature), platform=platform)


def convertible_program(model, args=(), kwargs=None, dynamic_shapes=None) -> ExportedProgram:
    """``model`` as the ExportedProgram the graph walk lowers: exported here if it is an ``nn.Module``, its
    quantization prepared, in-place ops functionalised, ops without a lowering decomposed and stacks of weights
    (``scan_layers``) folded into stored weights."""
    if isinstance(model, ExportedProgram):
        program = model
    elif isinstance(model, torch.nn.Module):
        if _on_meta(model):  # weightless: trace with meta inputs too (torch refuses mixed devices)
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, kwargs))
        program = torch.export.export(plain_quantized_weights(model), tuple(args), kwargs or {},
                                      dynamic_shapes=dynamic_shapes)
    else:
        raise TypeError(f"export_to_stablehlo takes a torch.nn.Module or a torch.export.ExportedProgram, "
                        f"got {type(model).__name__}")
    return fold_weight_stacks(decompose_unsupported(prepare_quantized(program)))


def decompose_unsupported(program: ExportedProgram) -> ExportedProgram:
    """Functionalise in-place ops and decompose only the ops without a lowering.

    ``run_decompositions`` re-traces the whole program (about 1 s for GPT-2), so
    it runs only when the graph has an op we cannot lower or a mutation the walk cannot functionalise
    itself (``exporter.conversion.inplace``: one of a user input or parameter, of part of the state, or of an
    alias read later), again while a decomposition leaves new ops without a lowering; raises once,
    listing every op that has neither a lowering nor a decomposition, and LoweringError for a write that is
    still not carried after it.
    """
    missing = unsupported_targets(program.graph_module, _returned(program))
    decomposable = _decompositions(missing)
    mutations = unfunctionalised_mutations(program.graph_module, _returned(program))
    _refuse_uncarried_constants(program, mutations)
    if decomposable or mutations:
        program = program.run_decompositions(decomposable)
        missing = unsupported_targets(program.graph_module, _returned(program))
    tried = set(decomposable)
    while decomposable := {t: d for t, d in _decompositions(missing).items() if t not in tried}:
        tried |= set(decomposable)
        program = program.run_decompositions(decomposable)
        missing = unsupported_targets(program.graph_module, _returned(program))
    if missing:
        raise UnsupportedOpsError({op_name(t): (len(nodes), describe(nodes[0])) for t, nodes in missing.items()})
    uncarried = unfunctionalised_mutations(program.graph_module, _returned(program))
    if uncarried:
        first = uncarried[0]
        raise LoweringError(f"{len(uncarried)} in-place write(s) cannot be carried, e.g. {op_name(first.target)} at "
                            f"{describe(first)} ({first.format_node()}): it writes part of a tensor that is read "
                            "again through another alias, or state torch did not functionalise; write the whole "
                            "tensor (index_copy_, copy_) instead")
    return program


def _refuse_uncarried_constants(program: ExportedProgram, mutations: list[torch.fx.Node]) -> None:
    """Raise LoweringError for a write the walk cannot carry (part of a tensor, through a view) into a lifted
    constant: ``run_decompositions`` cannot functionalise those either."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    constants = {n: spec.target for n, spec in zip(placeholders, program.graph_signature.input_specs)
                 if spec.kind == InputKind.CONSTANT_TENSOR}
    for node, written in written_placeholders(program.graph_module, mutations).items():
        for placeholder in written & set(constants):
            raise LoweringError(
                f"{op_name(node.target)} at {describe(node)} writes part of the lifted constant "
                f"'{constants[placeholder]}' through a view ({node.format_node()}): that state cannot be carried "
                "from call to call (the walk carries whole-tensor writes such as index_copy_ and copy_; torch "
                "cannot functionalise writes to constants); register the tensor as a buffer "
                "(register_buffer(..., persistent=False)) or write the whole tensor")


def _decompositions(targets) -> dict:
    """torch.export's decomposition for each target, else the one in torch's wider table (ops such as
    ``addmv`` that torch.export keeps but core ATen does not have), else the composite implicit kernel."""
    if not targets:
        return {}
    export_table = torch.export.default_decompositions()
    found = {}
    for target in targets:
        if target in export_table:
            found[target] = export_table[target]
        elif target in decomposition_table:
            found[target] = decomposition_table[target]
        elif isinstance(target, torch._ops.OpOverload) and target._can_decompose():
            found[target] = _get_decomp_for_cia(target)
    return found


def _returned(program: ExportedProgram) -> list[torch.fx.Node]:
    """The placeholders whose writes the program returns as outputs of its own (see ``input_kinds``)."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    return [n for n, kind in zip(placeholders, input_kinds(program)) if kind in RETURNED_KINDS]


def program_weights(program: ExportedProgram, signature) -> dict[str, torch.Tensor]:
    """The values of ``@main``'s held arguments: the weights, the program's own tensors (never copies; tied
    weights stay one object, so meta weights of a weightless export keep their ties too), and the state's
    exported values (copies: running ``ep.module()`` writes the program's own)."""
    weights, plain = {}, {}
    for slot in signature.held_inputs:
        source = program.state_dict if slot.target in program.state_dict else program.constants
        value = source[slot.target]
        if slot.kind == STATE:
            weights[slot.target] = value.detach().clone() if has_data(value) else value
            continue
        if id(value) not in plain:
            plain[id(value)] = value.data if isinstance(value, torch.nn.Parameter) else value
        weights[slot.target] = plain[id(value)]
    return weights


def _on_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])
