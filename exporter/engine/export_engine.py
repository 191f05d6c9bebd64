"""``export_engine``: a transformers causal LM as the entry points of a continuous-batching engine (see
``formats.engine_artifact``), traced from the torch steps of ``steps.py`` over the typed state of ``state.py``."""
from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree
from jaxlib.mlir import ir
from torch.export import Dim

from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.specs import dtype_name

from ..api import export_to_stablehlo
from ..autoshard.plan import ShardingPlan
from ..formats.artifact import StableHLOArtifact
from ..formats.engine_artifact import (GENERATE, INSERT, PREFILL, SHIFT, EngineArtifact, EngineConfig,
                                       SamplingDefaults)
from ..generate.compose import merged_weights
from ..generate.generation_settings import SAMPLING_DEFAULTS, GenerationSettings, resolve_settings
from ..generate.loop_steps import carried_shape, layer_shapes
from .loop import looped
from .mesh import engine_layouts, sharded_entries, step_shardings
from .state import Admission, Prefilled, Prompt, sampling_rows
from .steps import EngineGenerate, EngineInsert, EnginePrefill, EngineShift, EngineStep

BUCKET_DIM = "bucket"
SMALLEST_BUCKET = 16
STEPS_PER_CALL = 8  # the most generate steps one call runs
ALIASING_ATTR = "tf.aliasing_output"


def export_engine(model, slots: int = 8, max_cache_len: int = 2048, *, max_prompt_len: int | None = None,
                  buckets=None, steps_per_call: int = STEPS_PER_CALL, mesh=None, shardings=None) -> EngineArtifact:
    """The engine of ``model`` (a transformers causal LM in eval mode, its layers full or sliding-window
    attention): ``slots`` requests decoded at once, each holding up to ``max_cache_len`` tokens (its prompt's
    bucket and its new tokens). Prompts of 1 to ``max_prompt_len`` tokens (default ``max_cache_len // 2``) are
    prefilled padded to the shortest of ``buckets`` that holds them (default: powers of two from 16, then
    ``max_prompt_len``).

    ``mesh`` and ``shardings`` (as ``export_to_stablehlo`` takes them: a mapping of names to specs, a
    ``ShardingPlan``, or ``"auto"``: searched) make every entry point SPMD over the mesh with the generate step's
    plan (``mesh.py``): its weights named ``model.<the model's name>``, the state ``state_<field>`` (the caches
    ``state_caches_<i>``), searched with the state priced as carried (the KV cache split over its kv heads where
    that wins); the runner keeps the state split so on the mesh's devices. ``art.sharding_plan``: that plan."""
    if model.training:
        raise ValueError("export_engine takes a model in eval mode (call model.eval() first)")
    if model.config.is_encoder_decoder:
        raise NotImplementedError("export_engine serves decoder-only causal LMs; an encoder-decoder is not supported")
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")
    if not isinstance(steps_per_call, int) or steps_per_call < 1:
        raise ValueError(f"steps_per_call must be a positive int, got {steps_per_call!r}")
    max_prompt_len = max_prompt_len or max_cache_len // 2
    buckets = _buckets(buckets, max_prompt_len, max_cache_len)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    settings = _engine_settings(model, max_cache_len, vocab_size)
    shapes = layer_shapes(model, slots, max_cache_len)
    config = EngineConfig(slots=slots, max_cache_len=max_cache_len, buckets=buckets, vocab_size=vocab_size,
                          eos_token_ids=settings.eos_token_ids, pad_token_id=settings.pad_token_id,
                          cache_dtype=dtype_name(model.dtype), layer_shapes=tuple(shapes),
                          carried_shapes=tuple(carried_shape(s) for s in shapes),
                          defaults=sampling_defaults(model.generation_config), steps_per_call=steps_per_call)
    state = config.empty_state()
    shortest = max(2, settings.no_repeat_ngram_size + 1)  # more than one n-gram (export specializes a dim of 1)
    if buckets[0] < shortest:
        raise ValueError(f"buckets must be at least {shortest} tokens long with generation_config's "
                         f"no_repeat_ngram_size={settings.no_repeat_ngram_size}; got {list(buckets)}")
    one_step = EngineStep(model, settings)
    planned = step_shardings(one_step, state, mesh, shardings)  # the mesh checked before anything is exported
    generate = export_to_stablehlo(one_step, (state,), mesh=mesh, shardings=planned)
    bucket = Dim(BUCKET_DIM, min=shortest, max=buckets[-1])
    prompt = Prompt(torch.ones(1, buckets[0], dtype=torch.int64), torch.ones(1, buckets[0], dtype=torch.int64),
                    torch.ones(1, dtype=torch.int64), sampling_rows(1, vocab_size))
    prefill = export_to_stablehlo(EnginePrefill(model, settings, shapes), (prompt,),
                                  dynamic_shapes=(Prompt({1: bucket}, {1: bucket}, None, _static(prompt.sampling)),))
    prefilled = Prefilled(torch.zeros(1, dtype=torch.int64),
                          tuple(torch.zeros(carried_shape((1, h, buckets[0], d)), dtype=model.dtype)
                                for _, h, _, d in shapes))
    admission = Admission(torch.tensor(0), torch.ones(1, buckets[0], dtype=torch.int64), torch.tensor(1),
                          torch.tensor(1), sampling_rows(1, vocab_size), prefilled)
    admission_dims = Admission(None, {1: bucket}, None, None, _static(admission.sampling),
                               Prefilled(None, tuple({len(c.shape) - 2: bucket} for c in prefilled.caches)))
    steps = {PREFILL: prefill,
             INSERT: export_to_stablehlo(EngineInsert(shapes), (state, admission),
                                         dynamic_shapes=(_static(state), admission_dims)),
             GENERATE: looped(generate,
                             export_to_stablehlo(EngineGenerate(steps_per_call, settings.pad_token_id),
                                                 (state, torch.tensor(1))), settings.pad_token_id),
             SHIFT: export_to_stablehlo(EngineShift(), (state, torch.tensor(1)))}
    weight_slots, weights, taken = merged_weights(steps)
    by_target = {slot.target: slot for slot in weight_slots}
    state_leaves = len(pytree.tree_leaves(state))
    entries = {name: _entry_point(step, [by_target[t] for t in taken[name]], weights,
                                  0 if name == PREFILL else state_leaves)
               for name, step in steps.items()}
    if mesh is not None:
        entries = sharded_entries(entries, engine_layouts(generate, state, shapes),
                                  len(pytree.tree_leaves(admission)))
    searched = planned if isinstance(planned, ShardingPlan) else None
    return EngineArtifact(entries, weights, config, sharding_plan=searched)


def sampling_defaults(generation_config) -> SamplingDefaults:
    """The sampling values ``generation_config`` holds, kept for the requests that name none (``serving``
    resolves each request against them with ``generation_settings.resolve_sampling``, as ``export_generate``)."""
    return SamplingDefaults(**{name: getattr(generation_config, name, None) for name in SAMPLING_DEFAULTS})


def _engine_settings(model, max_cache_len: int, vocab_size: int) -> GenerationSettings:
    """``generation_config``'s eos and pad tokens and logits processors, checked as ``export_generate`` checks
    them (sampling is per request: ``sampling_defaults``)."""
    return resolve_settings(model.generation_config, 1, vocab_size, max_new_tokens=1, max_cache_len=max_cache_len,
                            do_sample=False, temperature=1.0, top_k=None, top_p=None, eos_token_id=None,
                            pad_token_id=None)


def _buckets(buckets, max_prompt_len: int, max_cache_len: int) -> tuple[int, ...]:
    if not isinstance(max_prompt_len, int) or not 2 <= max_prompt_len < max_cache_len:
        raise ValueError(f"max_prompt_len must be an int from 2 to max_cache_len - 1 = {max_cache_len - 1}, got "
                         f"{max_prompt_len!r}")
    if buckets is None:
        buckets, size = [], SMALLEST_BUCKET
        while size < max_prompt_len:
            buckets.append(size)
            size *= 2
        buckets.append(max_prompt_len)
    buckets = tuple(sorted(set(int(b) for b in buckets)))
    if buckets[0] < 2 or buckets[-1] != max_prompt_len:
        raise ValueError(f"buckets must be prompt lengths from 2 up to max_prompt_len={max_prompt_len}, the last "
                         f"equal to it; got {list(buckets)}")
    return buckets


def _static(tree):
    """``tree``'s dynamic shapes where every dim is static (torch.export takes no None for a whole NamedTuple)."""
    return pytree.tree_map(lambda _: None, tree)


def _entry_point(step: StableHLOArtifact, weight_slots: list, weights: dict, state_leaves: int) -> StableHLOArtifact:
    """``step`` over the merged weights (its lifted constants renamed as ``merged_weights`` names them), its first
    ``state_leaves`` inputs donated to its first results."""
    signature = step.signature
    inputs = weight_slots + [slot for slot in signature.inputs if slot not in signature.weights]
    signature = dataclasses.replace(signature, inputs=inputs, live_trees=None)
    text = _donated(step.stablehlo_text, len(weight_slots), state_leaves)
    return StableHLOArtifact(text, signature, {s.target: weights[s.target] for s in weight_slots},
                             platform=step.platform)


def _donated(text: str, first: int, count: int) -> str:
    """``text`` with ``@main``'s arguments ``first`` ... ``first + count - 1`` donated to its results 0 ... ``count
    - 1`` (``tf.aliasing_output``)."""
    if not count:
        return text
    with make_context():
        module = ir.Module.parse(text)
        main = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main")
        count_args = len(main.regions[0].blocks[0].arguments)
        old = main.attributes["arg_attrs"] if "arg_attrs" in main.attributes else None
        i32 = ir.IntegerType.get_signless(32)
        attrs = []
        for i in range(count_args):
            entries = {named.name: named.attr for named in ir.DictAttr(old[i])} if old is not None else {}
            if first <= i < first + count:
                entries[ALIASING_ATTR] = ir.IntegerAttr.get(i32, i - first)
            attrs.append(ir.DictAttr.get(entries))
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
        return module.operation.get_asm(enable_debug_info=True)
