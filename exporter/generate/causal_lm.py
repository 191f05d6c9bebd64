"""``export_generate``: a transformers model's whole generate loop as one StableHLO program; a causal LM's here,
an encoder-decoder's in ``seq2seq``."""
from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from ..api import export_to_stablehlo
from ..plans import StepLayouts, auto_shardings, step_layouts
from .compose import compose
from .generate_artifact import GenerateArtifact, check_left_padding, check_tokens, generate_signature, traced_inputs
from .seq2seq import export_seq2seq_generate
from .generation_settings import resolve_settings
from .loop_steps import Decode, LoopState, Prefill, Prompt, cache_shapes

PROMPT_DIM = "prompt"


def export_generate(model, input_ids: torch.Tensor, max_new_tokens: int = 64, max_cache_len: int | None = None,
                    attention_mask: torch.Tensor | None = None, do_sample: bool | None = None,
                    temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                    eos_token_id=None,
                    pad_token_id: int | None = None, *, max_source_len: int | None = None, mesh=None,
                    shardings=None) -> GenerateArtifact:
    """``model.generate`` (a transformers causal LM in eval mode, its layers full or sliding-window attention) as one
    program: the prompt through the model, then one ``stablehlo.while`` over the new tokens that stops once every row
    has produced an eos, the KV cache made and updated inside. Prompts of any length up to ``max_cache_len -
    max_new_tokens`` (``max_cache_len=None``: the example's length plus ``max_new_tokens``, rounded up to a
    multiple of 64) run through it, at the example's batch size. ``do_sample``, ``temperature``, ``top_k`` and
    ``top_p`` as ``model.generate`` takes them: each one not given is ``model.generation_config``'s, else
    generate's default (greedy; ``generation_settings.resolve_sampling``); sampling draws from the artifact's seed
    (``art.manual_seed``). ``eos_token_id`` (an id or a list) and ``pad_token_id`` default to
    ``model.generation_config``'s too, whose other settings are honoured or refused
    (``generation_settings.py``).
    An encoder-decoder goes to ``seq2seq.export_seq2seq_generate`` (``input_ids`` is its source, of up to
    ``max_source_len`` tokens), which alone takes ``max_source_len``.

    ``mesh`` and ``shardings`` (as ``export_to_stablehlo`` takes them; ``"auto"``: searched) make the program
    SPMD over the mesh: the plan is the decode step's (its weights, the KV cache, the tokens), named as that step
    (``Decode``) names them (weights ``model.<the model's name>``, the cache ``state_caches_<i>``), searched with
    the state priced as carried (``auto_shardings(loop_carried=...)``: the KV cache split over heads where that
    wins); the prefill takes the weights and makes the cache laid out as the step takes them
    (``plans.step_layouts``). ``art.sharding_plan``: the decode step's plan."""
    if model.training:
        raise ValueError("export_generate takes a model in eval mode (call model.eval() first)")
    sampling = {"do_sample": do_sample, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    if model.config.is_encoder_decoder:
        if mesh is not None:
            raise NotImplementedError("export_generate over a mesh takes a causal LM; an encoder-decoder's generate "
                                      "program runs on one device")
        return export_seq2seq_generate(model, input_ids, max_new_tokens, attention_mask, max_cache_len=max_cache_len,
                                       max_source_len=max_source_len, eos_token_id=eos_token_id,
                                       pad_token_id=pad_token_id, **sampling)
    if max_source_len is not None:
        raise ValueError("max_source_len bounds an encoder-decoder's source; a causal LM's prompt is bounded by "
                         "max_cache_len")
    check_tokens(input_ids, attention_mask)
    check_left_padding(attention_mask)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    settings = resolve_settings(model.generation_config, input_ids.shape[1], vocab_size, max_new_tokens=max_new_tokens,
                                max_cache_len=max_cache_len, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                                **sampling)
    batch = input_ids.shape[0]
    shapes = cache_shapes(model, batch, settings.max_cache_len)
    prompt = Dim(PROMPT_DIM, min=1, max=settings.max_prompt_len)
    size = settings.max_cache_len
    example = (LoopState.example(batch, size, shapes, model.dtype), Prompt.example(batch, size))
    step = Decode(model, settings)
    if shardings == "auto" and mesh is not None:  # searched with the state kept where the step leaves it
        shardings = auto_shardings(step, example, mesh=mesh, loop_carried=len(pytree.tree_leaves(example[0])))
    decode = export_to_stablehlo(step, example, mesh=mesh, shardings=shardings)
    layouts = step_layouts(decode, example) if mesh is not None else None
    prefill = export_to_stablehlo(Prefill(model, settings, shapes, layouts and layouts.inputs[0].caches),
                                  traced_inputs(input_ids, attention_mask), dynamic_shapes=({1: prompt}, {1: prompt}),
                                  mesh=mesh, shardings=layouts and _prefill_shardings(layouts))
    program = compose(prefill, decode, settings.max_new_tokens)
    signature = generate_signature(program.weight_slots, batch, settings, PROMPT_DIM, settings.max_prompt_len,
                                   f"{PROMPT_DIM} + {settings.max_new_tokens}")
    if mesh is not None:
        signature = dataclasses.replace(signature, mesh=dict(mesh))  # the weight slots carry the prefill's shardings
    return GenerateArtifact(program.stablehlo_text, signature, program.weights, settings,
                            sharding_plan=decode.sharding_plan)


def _prefill_shardings(layouts: StepLayouts) -> dict:
    """The prefill's shardings: the decode step's weights', its prompt's rows split as the step's tokens are."""
    rows = (layouts.inputs[0].tokens or ((),))[:1]
    return {**layouts.weights, "input_ids": rows, "attention_mask": rows}

