"""Which decomposition an op without a lowering gets, and the re-trace that applies a table of them.

``ExportedProgram.run_decompositions(table)`` costs about 0.3 s even for a three-node program: it lists every
composite-implicit (CIA) op torch knows (over 500) and, twice per call, patches each one's Python kernels to either
the table's decomposition or a "keep this op" marker, then restores them all. Only the CIA ops that the re-trace can
meet matter: those in the graph and those a decomposition calls. ``retraced`` patches just the ones whose keeping
changes the result: the CIA ops in the graph and those we have a lowering for (a decomposition that calls
``aten.linear`` keeps it, as ``run_decompositions`` would); any other CIA op a decomposition calls is decomposed by its
own kernel in the same re-trace, where ``run_decompositions`` would keep it and the pipeline decompose it in a second
one with that same kernel. tests/exporter/conversion/test_decomposition.py checks the graphs equal
``run_decompositions``'s.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch._decomp import decomposition_table
from torch._export.utils import (_collect_all_valid_cia_ops_for_aten_namespace, _get_decomp_for_cia,
                                 _is_preservable_cia_op, _special_op_to_preserve_cia)
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.export import ExportedProgram
from torch.export.exported_program import _decompose_exported_program

from torch_stablehlo.aten_lowerings import lowering_for


def decompositions(targets) -> dict:
    """torch.export's decomposition for each target, else the one in torch's wider table (ops such as
    ``addmv`` that torch.export keeps but core ATen does not have), else the composite implicit kernel."""
    export_table, found = _export_table(), {}
    for target in targets:
        if target in export_table:
            found[target] = export_table[target]
        elif target in decomposition_table:
            found[target] = decomposition_table[target]
        elif isinstance(target, torch._ops.OpOverload) and target._can_decompose():
            found[target] = _get_decomp_for_cia(target)
    return found


def retraced(program: ExportedProgram, table: dict[torch._ops.OperatorBase, Callable]) -> ExportedProgram:
    """``program.run_decompositions(table)``: every op of ``table`` decomposed, every other op kept."""
    composite = {op: fn for op, fn in table.items() if _is_preservable_cia_op(op)}
    kept = {op: _special_op_to_preserve_cia for op in _keepable(program) if op not in composite}
    with unset_fake_temporarily():
        return _decompose_exported_program(
            program, cia_to_decomp={**kept, **composite},
            python_decomp_table={op: fn for op, fn in table.items() if op not in composite},
            joint_loss_index=None, decompose_custom_triton_ops=False)


def _keepable(program: ExportedProgram) -> set:
    """The CIA ops whose keeping can change a re-trace of ``program``: those in its graphs (nested ones too) and
    ATen's that we lower."""
    in_graph = {node.target for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
                for node in module.graph.nodes if node.op == "call_function"}
    lowered = {op for op in _collect_all_valid_cia_ops_for_aten_namespace() if lowering_for(op) is not None}
    return lowered | {op for op in in_graph if isinstance(op, torch._ops.OpOverload) and _is_preservable_cia_op(op)}


@functools.cache
def _export_table() -> dict:
    """``torch.export.default_decompositions()`` read once (reading it walks every registered op: 0.06 s); a custom
    op registered later gets its composite kernel, the value the table would hold for it."""
    return dict(torch.export.default_decompositions().materialize())
