"""The two torch programs of an encoder-decoder's generate program: ``Seq2SeqPrefill`` (the source through the
encoder, then the decoder start token through the decoder, which computes each layer's cross-attention keys and
values from the encoder's output, and the first new token) and ``Seq2SeqDecode`` (one token, reading those keys
and values).

The carried state is ``loop_steps``' ``LoopState`` (its ``caches`` the decoder's self-attention cache), the decoder's
prompt being the start token alone (column 0), and what stays fixed is the ``Source``.
Every row's decoder starts at column 0, so a token's position is its column and the decoder's own mask is all ones.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache

from .generation_settings import START_TOKENS, GenerationSettings
from .loop_steps import Carried, CarriedLayer, LoopState, Step, carried_shape


class HeldLayer(DynamicLayer):
    """A cross-attention cache layer that holds the keys and values given to it: the model's own (the prefill's
    ``update``, from the encoder's output), or the carried ones (a decode step's layers are made holding them and
    ``EncoderDecoderCache.is_updated`` tells the model to read them instead of computing them)."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
        super().__init__()
        if keys is not None:
            self.update(keys, values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys, self.values, self.is_initialized = key_states, value_states, True
        return key_states, value_states


class Source(NamedTuple):
    """What an encoder-decoder's loop carries unchanged: the source as the decoder reads it."""
    cross: list                 # each decoder layer's cross-attention keys then values, [batch, heads, source, head
                                # dim], computed once by the prefill and never rewritten
    hidden: torch.Tensor        # [batch, source, width]: the encoder's output, which the decoder takes but, the keys
                                # and values held, reads only the shape of
    source_mask: torch.Tensor   # [batch, source]: the source's attention mask, which cross-attention reads


class CarriedShapes(NamedTuple):
    """The shapes of what an encoder-decoder's loop carries besides the tokens, for one source length."""
    caches: list[tuple[int, ...]]  # the self-attention cache: [batch, heads, max_cache_len, head dim] per tensor
    cross: list[tuple[int, ...]]   # the cross-attention keys and values: [batch, heads, source, head dim]
    hidden: tuple[int, ...]        # the encoder's output: [batch, source, width]


def carried_shapes(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_cache_len: int) -> CarriedShapes:
    """The shapes for the source ``input_ids``, keys then values per decoder layer: read from what the model returns
    running once on it (so no table of layer counts or head shapes per family). Refuses decoders whose
    self-attention cache is not one full-attention layer per decoder layer."""
    start = torch.zeros(input_ids.shape[0], 1, dtype=torch.int64, device=input_ids.device)
    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start, use_cache=True)
    cache = output.cache
    if not isinstance(cache, EncoderDecoderCache):
        raise NotImplementedError(f"export_generate takes encoder-decoders whose decoder caches self- and "
                                  f"cross-attention (an EncoderDecoderCache); this model's is {type(cache).__name__}")
    written = [layer for layer in cache.self_attention_cache.layers if layer.is_initialized]
    other = sorted({type(layer).__name__ for layer in written} - {DynamicLayer.__name__})
    if other:
        raise NotImplementedError(f"export_generate takes encoder-decoders whose decoder layers all use full "
                                  f"attention; this one caches {', '.join(other)} layers")
    cross = [layer for layer in cache.cross_attention_cache.layers if layer.is_initialized]
    own = [(*t.shape[:2], max_cache_len, t.shape[3]) for layer in written for t in (layer.keys, layer.values)]
    return CarriedShapes(own, [tuple(t.shape) for layer in cross for t in (layer.keys, layer.values)],
                         tuple(output.encoder_last_hidden_state.shape))


class Seq2SeqStep(Step):
    """A step of an encoder-decoder: its decoder run on one token over the carried caches."""

    def __init__(self, model, settings: GenerationSettings, cache_shapes: list):
        super().__init__(model, settings)
        self.cache_shapes = cache_shapes  # [batch, heads, max_cache_len, head dim] per self-attention tensor

    def run_decoder(self, input_ids, offset, caches, cross, hidden, source_mask):
        """Last-position logits (float32), the new self-attention caches and the cross-attention keys and values,
        for ``input_ids`` written at column ``offset``; with ``cross`` empty the model computes those from ``hidden``
        (the prefill), else it reads them."""
        batch = input_ids.shape[0]
        layers = [CarriedLayer(caches[i], caches[i + 1], offset, batch, self.cache_shapes[i][1])
                  for i in range(0, len(caches), 2)]
        held = [HeldLayer(cross[i], cross[i + 1]) for i in range(0, len(cross), 2)] or [HeldLayer() for _ in layers]
        cache = EncoderDecoderCache(Cache(layers=layers), Cache(layers=held))
        cache.is_updated = {i: bool(cross) for i in range(len(layers))}
        own_mask = torch.ones(batch, self.settings.max_cache_len, dtype=source_mask.dtype, device=source_mask.device)
        logits = self.model(encoder_outputs=(hidden,), attention_mask=source_mask, decoder_input_ids=input_ids,
                            decoder_attention_mask=own_mask, cache=cache, use_cache=True).logits[:, -1].float()
        return (logits, [t for layer in layers for t in (layer.carried_keys, layer.carried_values)],
                [t for layer in held for t in (layer.keys, layer.values)])


class Seq2SeqPrefill(Seq2SeqStep):
    """The source through the encoder, the start token through the decoder, and the first new token."""

    def forward(self, input_ids, attention_mask):
        settings = self.settings
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        batch, device = input_ids.shape[0], input_ids.device
        start = torch.full((batch, START_TOKENS), settings.decoder_start_token_id, dtype=torch.int64, device=device)
        after = torch.full((batch, settings.max_cache_len - START_TOKENS), settings.pad_token_id, dtype=torch.int64,
                           device=device)
        tokens = torch.cat([start, after], 1)
        zeros = [torch.zeros(carried_shape(shape), dtype=hidden.dtype, device=device) for shape in self.cache_shapes]
        offset = torch.zeros((), dtype=torch.int64, device=device)
        logits, caches, cross = self.run_decoder(start, offset, zeros, [], hidden, attention_mask)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        state = self.choose(logits, tokens, offset + START_TOKENS, START_TOKENS, done, caches)
        return Carried(state, Source(cross, hidden, attention_mask))


class Seq2SeqDecode(Seq2SeqStep):
    """One step: the token at ``cursor`` through the decoder, the next one chosen and written after it."""

    def forward(self, state: LoopState, fixed: Source) -> LoopState:
        cursor = state.cursor
        input_ids = state.tokens.index_select(1, cursor.reshape(1))
        logits, caches, _ = self.run_decoder(input_ids, cursor, state.caches, fixed.cross, fixed.hidden,
                                             fixed.source_mask)
        return self.choose(logits, state.tokens, cursor + 1, START_TOKENS, state.done, caches)
