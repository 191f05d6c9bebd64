"""The generate module: ``@main`` calls the converted prefill, then one ``stablehlo.while`` whose body calls the
converted decode step while a step is due, and returns the tokens up to the decoder's prompt plus ``max_new_tokens``.

The two steps are artifacts of ``export_to_stablehlo`` (a causal LM's ``loop_steps.Prefill`` and
``loop_steps.Decode``, an encoder-decoder's ``seq2seq_steps.Seq2SeqPrefill`` and ``Seq2SeqDecode``); ``@main``
takes the prefill's inputs, and the decode step takes the two parts of what the prefill returns
(``loop_steps.Carried``: the loop state and what stays fixed), read from the steps' pytrees by their fields.
Their functions are moved into one module, private. Their weights become ``@main``'s leading arguments once each: parameters and
buffers are shared by name (the same model's tensors), each step's lifted constants stay its own
(``prefill.lifted_tensor_0``). The loop carries every value the prefill returns (the decode step rewrites the
state; what stays fixed, such as an encoder-decoder's cross-attention keys and values, is carried unchanged); it
adds nothing of its own, so the module's size does not depend on ``max_new_tokens``.
The decode step's cache writes (one column, a scatter that XLA makes an in-place update slice) update the
carried cache in place: the step is called once per iteration and the cache is carried in the form attention
reads (``loop_steps.CarriedLayer``), so no copy of it is made.

Where the program samples, ``@main`` takes ``rng_seed`` and gives each step a seed of its own (the step's cursor
mixed in), so every step draws new numbers and one seed reproduces them all.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from torch_stablehlo.aten_lowerings import RNG_SEED_DTYPE, constant, while_loop
from torch_stablehlo.stablehlo_ir.functions import move_functions
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.shardy import as_callee, shard_main

from torch_stablehlo.exported_program import CONSTANT

from ..conversion.signature import RNG_SEED, InputSlot
from ..formats.artifact import StableHLOArtifact
from .generation_settings import START_TOKENS
from .loop_steps import Carried

STEP_SEEDS = 1 << 20  # per-step seeds: rng_seed * STEP_SEEDS + the step's cursor (cursors stay below this)


@dataclasses.dataclass
class ComposedProgram:
    """The generate module's text and the weights its ``@main`` takes first."""
    stablehlo_text: str
    weight_slots: list[InputSlot]        # @main's leading arguments
    weights: dict[str, torch.Tensor]     # by slot target


def merged_weights(steps: dict[str, StableHLOArtifact]) -> tuple[list[InputSlot], dict, dict[str, list[str]]]:
    """(the weight slots of ``@main``, their tensors, per step the targets its ``@main`` takes in order)."""
    slots: dict[str, InputSlot] = {}
    weights: dict[str, torch.Tensor] = {}
    taken: dict[str, list[str]] = {}
    for step, artifact in steps.items():
        taken[step] = []
        for slot in artifact.signature.weights:
            target = f"{step}.{slot.target}" if slot.kind == CONSTANT else slot.target
            if target not in slots:  # a parameter or buffer the other step has too: the same model's tensor
                slots[target] = dataclasses.replace(slot, name=target, target=target,
                                                    tensor=dataclasses.replace(slot.tensor, name=target))
                weights[target] = artifact.weights[slot.target]
            taken[step].append(target)
    return list(slots.values()), weights, taken


def compose(prefill: StableHLOArtifact, decode: StableHLOArtifact, max_new_tokens: int,
            prompt_input: str | None = "input_ids") -> ComposedProgram:
    """The generate module over the two converted steps (see the module's docstring). ``@main`` takes the
    prefill's inputs; it returns the tokens up to ``max_new_tokens`` after the decoder's prompt, which is the user
    input ``prompt_input`` (a causal LM's prompt: its columns start the tokens) or, with ``None``, an
    encoder-decoder's start token (``START_TOKENS`` columns)."""
    steps = {"prefill": prefill, "decode": decode}
    weight_slots, weights, taken = merged_weights(steps)
    sampling = prefill.signature.takes_rng_seed or decode.signature.takes_rng_seed
    inputs = [s.tensor.name for s in prefill.signature.user_inputs]
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        functions = {step: move_functions(callee_module(a), step, module.body) for step, a in steps.items()}
        argument_types = {step: ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value).inputs
                          for step, f in functions.items()}
        weight_types = {t: ty for step in steps for t, ty in zip(taken[step], argument_types[step])}
        input_types = argument_types["prefill"][len(taken["prefill"]):][:len(inputs)]
        seed_types = [ir.RankedTensorType.get([], ir.IntegerType.get_signless(64))] if sampling else []
        names = [s.name for s in weight_slots] + inputs + ([RNG_SEED] if sampling else [])
        batch = ir.RankedTensorType(input_types[0]).shape[0]
        columns = ir.ShapedType.get_dynamic_size() if prompt_input else START_TOKENS + max_new_tokens
        result = ir.RankedTensorType.get([batch, columns], ir.IntegerType.get_signless(64))
        with ir.InsertionPoint.at_block_begin(module.body):
            main = func.FuncOp("main", ([weight_types[s.target] for s in weight_slots] + input_types + seed_types,
                                        [result]))
            main.attributes["sym_visibility"] = ir.StringAttr.get("public")
            block = main.add_entry_block(arg_locs=[ir.Location.name(n) for n in names])
        arguments = dict(zip(names, block.arguments))
        with ir.InsertionPoint(block):
            _GenerateMain(steps, functions, taken, arguments).emit(inputs, max_new_tokens, prompt_input, result)
        if prefill.signature.mesh:  # SPMD: the weights split as the steps take them, the inputs as the prefill does
            given = {s.tensor.name: s.sharding for s in prefill.signature.user_inputs}
            shard_main(module, main, prefill.signature.mesh, [s.sharding for s in weight_slots] +
                       [given.get(name) for name in inputs] + [None] * len(seed_types))
        text = module.operation.get_asm(enable_debug_info=True)
    return ComposedProgram(text, weight_slots, weights)


def callee_module(step: StableHLOArtifact) -> ir.Module:
    """A step's module parsed to have its functions moved into another's (over a mesh: its shardings as
    ``shardy.as_callee`` leaves them, the calling module declaring the mesh)."""
    module = ir.Module.parse(step.stablehlo_text)
    if step.signature.mesh:
        as_callee(module)
    return module


class _GenerateMain:
    """Emits ``@main``'s body at the current insertion point."""

    def __init__(self, steps, functions, taken, arguments):
        self.steps, self.functions, self.taken, self.arguments = steps, functions, taken, arguments

    def call(self, step: str, inputs, cursor: ir.Value | None):
        """Call the ``step`` function on ``inputs`` (the step's positional arguments, a pytree of values) after its
        weights; its results in the pytree the step returns."""
        signature = self.steps[step].signature
        operands = [self.arguments[t] for t in self.taken[step]] + pytree.tree_leaves(inputs)
        if signature.takes_rng_seed:
            operands.append(self.step_seed(cursor))
        function_type = ir.FunctionType(ir.TypeAttr(self.functions[step].attributes["function_type"]).value)
        call = func.CallOp(function_type.results, ir.FlatSymbolRefAttr.get(step), operands)
        return pytree.tree_unflatten(list(call.results), signature.out_tree)

    def step_seed(self, cursor: ir.Value | None) -> ir.Value:
        seed = stablehlo.multiply(self.arguments[RNG_SEED], constant(STEP_SEEDS, RNG_SEED_DTYPE))
        return seed if cursor is None else stablehlo.add(seed, cursor)

    def emit(self, inputs: list[str], max_new_tokens: int, prompt_input: str | None, result: ir.Type) -> None:
        first: Carried = self.call("prefill", [self.arguments[name] for name in inputs], None)
        leaves, tree = pytree.tree_flatten(first)

        def carried(values) -> Carried:
            return pytree.tree_unflatten(list(values), tree)

        def body(*values):
            state, fixed = carried(values)
            return pytree.tree_leaves(Carried(self.call("decode", (state, fixed), state.cursor), fixed))

        tokens = carried(while_loop(leaves, lambda *values: carried(values).state.going, body)).state.tokens
        if prompt_input is None:
            func.ReturnOp([stablehlo.slice(tokens, [0, 0], list(ir.RankedTensorType(result).shape), [1, 1])])
        else:
            func.ReturnOp([self.after_prompt(tokens, self.arguments[prompt_input], max_new_tokens, result)])

    @staticmethod
    def after_prompt(tokens: ir.Value, prompt: ir.Value, max_new_tokens: int, result: ir.Type) -> ir.Value:
        """``tokens[:, :prompt's columns + max_new_tokens]``."""
        i64 = torch.int64
        columns = stablehlo.convert(ir.RankedTensorType.get([1], ir.IntegerType.get_signless(64)),
                                    stablehlo.reshape(ir.RankedTensorType.get([1], ir.IntegerType.get_signless(32)),
                                                      stablehlo.get_dimension_size(prompt, 1)))
        batch = ir.RankedTensorType(tokens.type).shape[0]
        limit = stablehlo.concatenate([constant(batch, i64, [1]),
                                       stablehlo.add(columns, constant(max_new_tokens, i64, [1]))], 0)
        return stablehlo.real_dynamic_slice(result, tokens, constant(0, i64, [2]), limit, constant(1, i64, [2]))

