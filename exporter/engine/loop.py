"""The engine's generate entry point: the converted one-step program (``steps.EngineStep``) called inside one
``stablehlo.while`` up to ``steps_per_call`` times, as ``generate.compose`` calls the decode step.

``@main`` takes the step's weights, the state's leaves and ``steps`` (an int64 scalar, 1 to ``steps_per_call``); it
returns the state's leaves and the tokens [steps_per_call, slots] (the pad token in the rows of steps not run).
Its calling convention is ``steps.EngineGenerate``'s, whose export gives the signature; the loop is built here, on
the converted step, so torch traces the model once, outside any loop (a ``torch.while_loop`` over the model would
trace it again through dynamo, more than half again the export's time).
"""
from __future__ import annotations

import dataclasses

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from torch_stablehlo.aten_lowerings import constant, while_loop
from torch_stablehlo.stablehlo_ir.functions import move_functions
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.shardy import declare_mesh

from ..formats.artifact import StableHLOArtifact
from ..generate.compose import callee_module

STEP = "step"


def looped(step: StableHLOArtifact, convention: StableHLOArtifact, pad_token_id: int) -> StableHLOArtifact:
    """``step`` (weights, state leaves -> state leaves, tokens [slots]) called ``steps`` times in a
    ``stablehlo.while``, with ``convention``'s signature (its user inputs and outputs) over ``step``'s weights."""
    weights = len(step.signature.weights)
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        called = move_functions(callee_module(step), STEP, module.body)
        step_type = ir.FunctionType(ir.TypeAttr(called.attributes["function_type"]).value)
        leaves = list(step_type.results[:-1])
        chosen = ir.RankedTensorType(step_type.results[-1])
        i64 = ir.IntegerType.get_signless(64)
        scalar = ir.RankedTensorType.get([], i64)
        made_type = ir.RankedTensorType.get([_steps_per_call(convention), chosen.shape[0]], i64)
        with ir.InsertionPoint.at_block_begin(module.body):
            main = func.FuncOp("main", (list(step_type.inputs) + [scalar], leaves + [made_type]))
            main.attributes["sym_visibility"] = ir.StringAttr.get("public")
            block = main.add_entry_block()
        with ir.InsertionPoint(block):
            arguments = list(block.arguments)
            held, steps = arguments[:weights], arguments[-1]

            def body(index, made, *state):
                results = func.CallOp(list(step_type.results), ir.FlatSymbolRefAttr.get(STEP), [*held, *state]).results
                row = stablehlo.reshape(ir.RankedTensorType.get([1, chosen.shape[0]], i64), results[-1])
                made = stablehlo.dynamic_update_slice(made, row, [index, constant(0, torch.int64)])
                return [stablehlo.add(index, constant(1, torch.int64)), made, *results[:-1]]

            start = [constant(0, torch.int64), constant(pad_token_id, torch.int64, made_type.shape),
                     *arguments[weights:-1]]
            final = while_loop(start, lambda index, *_: stablehlo.compare(
                index, steps, stablehlo.ComparisonDirectionAttr.get("LT")), body)
            func.ReturnOp([*final[2:], final[1]])
        if step.signature.mesh:  # the step's layouts hold inside; @main's are the engine's (``mesh.sharded_entry``)
            declare_mesh(module, step.signature.mesh)
        text = module.operation.get_asm(enable_debug_info=True)
    signature = dataclasses.replace(convention.signature, inputs=[*step.signature.weights,
                                                                  *convention.signature.user_inputs], live_trees=None)
    return StableHLOArtifact(text, signature, step.weights, platform=step.platform)


def _steps_per_call(convention: StableHLOArtifact) -> int:
    return convention.signature.main_outputs[-1].tensor.shape[0]
