"""The torch programs an engine is made of, each over the typed ``DecodeState`` (``state.py``):

- ``EnginePrefill``: one prompt, left-padded to a bucket's length, through the model from an empty cache: its
  first new token and its caches (the bucket's columns);
- ``EngineInsert``: a prefilled request into a free slot, its prompt (tokens and caches) ending just before the
  shared cursor;
- ``EngineStep``: one step over every slot (``export_generate``'s decode step, with per-slot ends and sampling),
  which ``loop.looped`` calls up to ``steps_per_call`` times in one ``stablehlo.while`` (the generate entry point,
  whose calling convention ``EngineGenerate`` gives);
- ``EngineShift``: every row moved left by some columns, to make room at the end.

The model runs through ``generate.loop_steps.CausalStep`` (the carried cache layers, positions from the padding), so an
engine's logits are ``export_generate``'s, and so are its logits processors (``generation_config``'s repetition
penalty, n-gram and bad-word bans, minimum lengths, forced and suppressed tokens: ``loop_steps.processed``), each
slot over its own sequence so far. Sampling is per row (``choose_rows``): each slot has its own settings
and its own random numbers, drawn from its seed and the token's position by a counter-based hash, so a seeded
request's tokens do not depend on what runs beside it.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ..generate.generation_settings import GenerationSettings
from ..generate.loop_steps import CausalStep, SequenceSoFar, carried_shape, one_of, positions_before, processed
from .state import Admission, DecodeState, Generated, Prefilled, Prompt, Sampling

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # an odd multiplier below 2**31: a 32-bit value times it fits an int64


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 values in [0, 2**32) (two multiply-xorshift rounds)."""
    x = ((x ^ (x >> 16)) * _MIX) & _MASK32
    x = ((x ^ (x >> 16)) * _MIX) & _MASK32
    return x ^ (x >> 16)


def uniform_rows(seed: torch.Tensor, counter: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab] float32 in (0, 1): row r's numbers depend only on ``seed[r]`` and ``counter[r]``."""
    key = mix32(mix32(seed & _MASK32) ^ ((seed >> 32) & _MASK32))
    key = mix32(key ^ (counter & _MASK32))
    bits = mix32(key.unsqueeze(1) ^ torch.arange(vocab_size, device=seed.device))
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def choose_rows(logits: torch.Tensor, sampling: Sampling, counter: torch.Tensor) -> torch.Tensor:
    """One token per row: the argmax where the row is greedy, else a draw (``drawn``). The draw, a sort of the
    vocabulary per row, is made only where some row samples (``torch.cond``: a ``stablehlo.case``)."""
    greedy = logits.argmax(-1)
    return torch.cond(sampling.do_sample.any(), lambda: torch.where(sampling.do_sample, drawn(logits, sampling,
                                                                                            counter), greedy),
                      lambda: greedy.clone(), ())


def drawn(logits: torch.Tensor, sampling: Sampling, counter: torch.Tensor) -> torch.Tensor:
    """Per row, a draw from softmax(logits / temperature) restricted to the row's top-k, then top-p, tokens
    (transformers' warpers) by the Gumbel-max trick, with the row's random numbers (``uniform_rows`` of its seed
    and ``counter``)."""
    vocab = logits.shape[1]
    scores, order = torch.sort(logits / sampling.temperature.unsqueeze(1), dim=1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    scores = scores.masked_fill(rank >= sampling.top_k.unsqueeze(1), float("-inf"))
    probabilities = scores.softmax(-1)
    before = prefix_sums(probabilities) - probabilities  # the mass of the more likely tokens
    scores = scores.masked_fill((before >= sampling.top_p.unsqueeze(1)) & (rank > 0), float("-inf"))
    uniform = uniform_rows(sampling.seed, counter, vocab).gather(1, order)
    return order.gather(1, (scores - torch.log(-torch.log(uniform))).argmax(-1, keepdim=True)).squeeze(1)


def prefix_sums(x: torch.Tensor) -> torch.Tensor:
    """Inclusive sums along the last dim in log2(n) shifted adds (``cumsum`` lowers to a window as wide as the
    row: n**2 adds, seconds for a vocabulary)."""
    shift = 1
    while shift < x.shape[-1]:
        x = x + torch.nn.functional.pad(x[..., :-shift], (shift, 0))
        shift *= 2
    return x


class EnginePrefill(CausalStep):
    """A prompt [1, bucket] left-padded by its ``attention_mask``: its first new token and its caches (the bucket's
    columns, carried as ``generate.loop_steps.CarriedLayer`` carries them)."""

    def __init__(self, model, settings: GenerationSettings, layer_shapes: list):
        super().__init__(model, settings)
        self.layer_shapes = layer_shapes  # [slots, kv heads, max_cache_len, head dim] per cache tensor

    def forward(self, prompt: Prompt) -> Prefilled:
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        bucket = input_ids.shape[1]
        zeros = [torch.zeros(carried_shape((1, heads, bucket, dim)), dtype=self.model.dtype, device=input_ids.device)
                 for _, heads, _, dim in self.layer_shapes]
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        offset = torch.zeros((), dtype=torch.int64, device=input_ids.device)
        logits, caches = self.run_model(input_ids, attention_mask, positions, offset, zeros)
        length = attention_mask.sum(-1)
        end = torch.full((), bucket, dtype=torch.int64, device=input_ids.device)  # the first new token's column
        scores = processed(logits, self.settings, SequenceSoFar(input_ids, attention_mask == 1, end,
                                                                torch.zeros_like(length), length,
                                                                prompt.max_new_tokens == 1))
        return Prefilled(choose_rows(scores, prompt.sampling, length), tuple(caches))


class EngineInsert(torch.nn.Module):
    """A prefilled request into slot ``slot``: its prompt's tokens and caches at the columns just before the
    cursor, its first token at the cursor, its last allowed column ``max_new_tokens - 1`` after it, its sampling
    settings."""

    def __init__(self, layer_shapes: list):
        super().__init__()
        self.layer_shapes = layer_shapes

    def forward(self, state: DecodeState, admission: Admission) -> DecodeState:
        row, prompt_len = admission.slot.reshape(1), admission.prompt_len
        first_token, caches = admission.prefilled
        cursor = state.cursor
        columns = torch.arange(state.tokens.shape[1], device=cursor.device)
        written = []
        for carried, new, (slots, heads, length, dim) in zip(state.caches, caches, self.layer_shapes):
            bucket = new.shape[-2]
            full = carried.reshape(slots, heads, length, dim)
            slot_row = full.index_select(0, row).index_copy(
                2, torch.arange(bucket, device=cursor.device) + (cursor - bucket), new.reshape(1, heads, bucket, dim))
            written.append(full.index_copy(0, row, slot_row).reshape(carried.shape))
        padding = (columns >= cursor - prompt_len).to(state.padding.dtype).unsqueeze(0)
        bucket = admission.prompt_ids.shape[1]
        sequence = torch.cat([admission.prompt_ids, first_token.reshape(1, 1)], 1)  # the prompt, its first token
        tokens = state.tokens.index_select(0, row).index_copy(
            1, torch.arange(bucket + 1, device=cursor.device) + (cursor - bucket), sequence)
        return DecodeState(
            tokens=state.tokens.index_copy(0, row, tokens),
            cursor=cursor,
            done=state.done.index_copy(0, row, torch.zeros(1, dtype=torch.bool, device=cursor.device)),
            padding=state.padding.index_copy(0, row, padding),
            last_column=state.last_column.index_copy(0, row, (cursor + admission.max_new_tokens - 1).reshape(1)),
            first_column=state.first_column.index_copy(0, row, cursor.reshape(1)),
            sampling=Sampling(*(field.index_copy(0, row, new) for field, new in zip(state.sampling, admission.sampling))),
            caches=tuple(written))


class EngineStep(CausalStep):
    """One step over every slot: each slot's token at the cursor through the model, the next one chosen and
    written after it (the pad token where the slot is done); returns (the state, the tokens chosen [slots]).
    ``loop.looped`` calls it up to ``steps_per_call`` times per generate call."""

    def forward(self, state: DecodeState):
        settings = self.settings
        cursor = state.cursor
        input_ids = state.tokens.index_select(1, cursor.reshape(1))
        positions = positions_before(state.padding, cursor)
        logits, caches = self.run_model(input_ids, state.padding, positions, cursor, list(state.caches))
        column = cursor + 1
        length = positions.squeeze(1) + 1
        written = (state.padding == 1) & (torch.arange(state.tokens.shape[1], device=cursor.device) <= cursor)
        scores = processed(logits, settings, SequenceSoFar(state.tokens, written, column, column - state.first_column,
                                                           length, column == state.last_column))
        chosen = choose_rows(scores, state.sampling, length)
        chosen = torch.where(state.done, torch.full_like(chosen, settings.pad_token_id), chosen)
        done = state.done | (column >= state.last_column)
        if settings.eos_token_ids:
            done = done | one_of(chosen, settings.eos_token_ids)
        tokens = state.tokens.index_copy(1, column.reshape(1), chosen.unsqueeze(1))
        return state._replace(tokens=tokens, cursor=column, done=done, caches=tuple(caches)), chosen


class EngineGenerate(torch.nn.Module):
    """The generate entry point's calling convention, exported for its signature only: (the state, ``steps``) ->
    ``Generated`` (the state, tokens [steps_per_call, slots]). Its body here is a stand-in (the state as it was,
    pad tokens); the entry point's module is ``loop.looped`` over the converted ``EngineStep``."""

    def __init__(self, steps_per_call: int, pad_token_id: int):
        super().__init__()
        self.steps_per_call, self.pad_token_id = steps_per_call, pad_token_id

    def forward(self, state: DecodeState, steps: torch.Tensor) -> Generated:
        made = torch.full((self.steps_per_call, state.done.shape[0]), self.pad_token_id, dtype=torch.int64,
                          device=steps.device)
        return Generated(pytree.tree_map(torch.clone, state), made + 0 * steps)


class EngineShift(torch.nn.Module):
    """Every row moved ``by`` columns to the left (right where negative; the columns shifted in repeat the edge one); the cursor and the
    slots' last columns with them. Positions and windows are counted over the padding, so nothing else changes."""

    def forward(self, state: DecodeState, by):
        length = state.tokens.shape[1]
        source = (torch.arange(length, device=by.device) + by).clamp(0, length - 1)
        return state._replace(
            tokens=state.tokens.index_select(1, source), cursor=state.cursor - by,
            padding=state.padding.index_select(1, source), last_column=state.last_column - by,
            first_column=state.first_column - by,
            caches=tuple(cache.index_select(cache.dim() - 2, source) for cache in state.caches))
