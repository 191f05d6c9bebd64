"""``export_generate`` for an encoder-decoder (T5, BART, ...): the source through the encoder, then the decoder's
generate loop, as one StableHLO program (the steps in ``seq2seq_steps``, composed as a causal LM's are)."""
from __future__ import annotations

import math

import torch
from torch.export import Dim

from ..api import export_to_stablehlo
from ..errors import InputError
from .compose import compose
from .generate_artifact import GenerateArtifact, check_tokens, generate_signature, traced_inputs
from .seq2seq_steps import CarriedShapes, Seq2SeqDecode, Seq2SeqPrefill, Source, carried_shapes
from .generation_settings import CACHE_ROUNDING, START_TOKENS, GenerationSettings, resolve_settings
from .loop_steps import LoopState, carried_shape

SOURCE_DIM = "source"


class Seq2SeqGenerateArtifact(GenerateArtifact):
    """An encoder-decoder's generate program: ``art(input_ids, attention_mask=None)`` (the source, padded on
    either side) returns ``[batch, 1 + max_new_tokens]`` tokens like ``model.generate``: the decoder start token,
    then the new tokens (the pad token after a row's eos, and after every row once all are done)."""

    def check_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        check_source(attention_mask)


def check_source(attention_mask) -> None:
    """Raises InputError where a row of ``attention_mask`` is padding alone."""
    if attention_mask is not None and (attention_mask.to(torch.int64).sum(1) == 0).any():
        raise InputError("each row of attention_mask needs a one: a row of padding alone is no source")


def export_seq2seq_generate(model, input_ids: torch.Tensor, max_new_tokens: int,
                            attention_mask: torch.Tensor | None, *, max_cache_len: int | None,
                            max_source_len: int | None, **settings) -> Seq2SeqGenerateArtifact:
    """``model.generate`` of a transformers encoder-decoder (in eval mode) as one program: the source through the
    encoder, the cross-attention keys and values computed once from its output, then one ``stablehlo.while`` over
    the new tokens from ``decoder_start_token_id``. Sources of 1 to ``max_source_len`` tokens (``None``: the
    example's length rounded up to a multiple of 64) run through it, at the example's batch size; the decoder's
    cache holds ``max_cache_len`` tokens (``None``: the start token and ``max_new_tokens``). ``settings``:
    ``export_generate``'s sampling and token arguments."""
    check_tokens(input_ids, attention_mask)
    check_source(attention_mask)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(torch.int64)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    resolved = resolve_settings(model.generation_config, input_ids.shape[1], vocab_size, max_new_tokens=max_new_tokens,
                                max_cache_len=max_cache_len, encoder_decoder=True, **settings)
    max_source_len = _source_bound(model, input_ids.shape[1], max_source_len, resolved)
    source_ids, source_mask = traced_inputs(input_ids, mask)
    shapes = carried_shapes(model, source_ids, source_mask, resolved.max_cache_len)
    source = Dim(SOURCE_DIM, min=1, max=max_source_len)
    prefill = export_to_stablehlo(Seq2SeqPrefill(model, resolved, shapes.caches), (source_ids, source_mask),
                                  dynamic_shapes=({1: source}, {1: source}))
    decode = export_to_stablehlo(Seq2SeqDecode(model, resolved, shapes.caches),
                                 _decode_example(model, shapes, resolved), dynamic_shapes=_decode_dims(shapes, source))
    program = compose(prefill, decode, resolved.max_new_tokens, prompt_input=None)
    signature = generate_signature(program.weight_slots, input_ids.shape[0], resolved, SOURCE_DIM, max_source_len,
                                   START_TOKENS + resolved.max_new_tokens)
    return Seq2SeqGenerateArtifact(program.stablehlo_text, signature, program.weights, resolved)


def _source_bound(model, source_len: int, max_source_len: int | None, settings: GenerationSettings) -> int:
    """The longest source the program takes; refuses a bound below the example or past the model's positions."""
    if max_source_len is None:
        max_source_len = math.ceil(source_len / CACHE_ROUNDING) * CACHE_ROUNDING
    if not isinstance(max_source_len, int) or max_source_len < source_len:
        raise ValueError(f"max_source_len={max_source_len!r} is shorter than the example's source of {source_len} "
                         "tokens; give an int at least that")
    positions = getattr(model.config, "max_position_embeddings", None)  # learned positions (BART); T5 has none
    if positions is not None and max(max_source_len, settings.max_new_tokens) > positions:
        raise ValueError(f"max_source_len={max_source_len} and max_new_tokens={settings.max_new_tokens} must not "
                         f"exceed the model's {positions} positions (config.max_position_embeddings)")
    return max_source_len


def _decode_example(model, shapes: CarriedShapes, settings: GenerationSettings) -> tuple[LoopState, Source]:
    """Inputs of ``Seq2SeqDecode`` with the shapes and dtypes the loop carries (the values do not matter, but no
    two may be one tensor: torch.export would make them one input)."""
    batch, dtype = shapes.hidden[0], model.dtype
    state = LoopState.example(batch, settings.max_cache_len, [carried_shape(s) for s in shapes.caches], dtype)
    return state, Source([torch.zeros(s, dtype=dtype) for s in shapes.cross], torch.zeros(shapes.hidden, dtype=dtype),
                         torch.ones(batch, shapes.hidden[1], dtype=torch.int64))


def _decode_dims(shapes: CarriedShapes, source: Dim) -> tuple[LoopState, Source]:
    """``Seq2SeqDecode``'s dynamic shapes: the source's length in what cross-attention reads."""
    return (LoopState(None, None, None, None, [None] * len(shapes.caches)),
            Source([{2: source}] * len(shapes.cross), {1: source}, {1: source}))
