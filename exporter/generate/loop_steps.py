"""The two torch programs a generate program is made of: ``Prefill`` (the prompt, any length) and ``Decode`` (one
token), each ending with the same choice of the next token.

Both are functional: the KV cache comes in as tensors and goes out as new ones (``CarriedLayer`` writes it out of
place with ``index_copy``), so the converted functions compose into one ``stablehlo.while`` (``compose.py``).

What the loop carries is one typed structure, ``Carried``: the ``LoopState`` each step rewrites and what stays
fixed (a causal LM's ``Prompt``). ``Prefill`` returns a ``Carried``; ``Decode`` takes its two parts and returns the
new ``LoopState``; ``compose`` reads the same fields from the converted steps' pytrees.

Positions come from the mask as ``model.generate`` makes them: a token's position is the number of real tokens
before it; the attention mask given to the model is ``padding``, so pad columns are never attended to.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from transformers.cache_utils import Cache, StaticLayer, get_layer_types_and_kwargs
from transformers.configuration_utils import get_head_shapes

from torch_stablehlo.aten_lowerings import mark_sharding

from .generation_settings import GenerationSettings, Sampling


class LoopState(NamedTuple):
    """What the loop carries that each step rewrites."""
    tokens: torch.Tensor  # [batch, max_cache_len]: the prompt (left padding included), the tokens chosen, pad after
    cursor: torch.Tensor  # 0-d: the column of the last token written, the one the next step reads
    done: torch.Tensor    # [batch] bool: rows that have produced an eos (they get the pad token from then on)
    going: torch.Tensor   # 0-d bool: another step is due (a token left to make and a row not done)
    caches: list          # each layer's keys then values, [batch, kv heads, max_cache_len, head dim] without unit dims

    @classmethod
    def example(cls, batch: int, max_cache_len: int, cache_shapes: list, dtype: torch.dtype) -> "LoopState":
        """A state of these shapes and dtypes to trace a step with (the values do not matter, but no two leaves
        may be one tensor: torch.export would make them one input)."""
        return cls(torch.zeros(batch, max_cache_len, dtype=torch.int64), torch.tensor(0),
                   torch.zeros(batch, dtype=torch.bool), torch.tensor(True),
                   [torch.zeros(shape, dtype=dtype) for shape in cache_shapes])


class Prompt(NamedTuple):
    """What a causal LM's loop carries unchanged."""
    padding: torch.Tensor     # [batch, max_cache_len]: the prompt's attention mask, ones after it
    prompt_len: torch.Tensor  # 0-d: the prompt's columns

    @classmethod
    def example(cls, batch: int, max_cache_len: int) -> "Prompt":
        return cls(torch.ones(batch, max_cache_len, dtype=torch.int64), torch.tensor(0))


class Carried(NamedTuple):
    """What the prefill returns and the loop carries: the state the steps rewrite and what stays fixed (the model
    kind's: ``Prompt``, ``seq2seq_steps.Source``)."""
    state: LoopState
    fixed: tuple


class CarriedLayer(StaticLayer):
    """A static cache layer over given key and value tensors that writes new entries out of place.

    The tensors are carried without the unit dims of [batch, kv heads, max_cache_len, head dim] (``carried_shape``):
    in that form XLA's attention dot reads them (it drops unit dims), so the written tensor is the one attention
    reads and the one the loop carries, with no reshape between, and XLA updates it in place. The model sees the
    four dims (a free view)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, offset: torch.Tensor, batch: int, heads: int):
        super().__init__(max_cache_len=keys.shape[-2])
        self.cumulative_length = offset
        self.batch_size, self.num_heads = batch, heads
        self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
        self.device = keys.device
        self.is_initialized = True
        self.hold(keys, values)

    def hold(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Carry these tensors (``carried_shape``); the model sees them as [batch, kv heads, ...]."""
        self.carried_keys, self.carried_values = keys, values
        self.keys = keys.view(self.batch_size, self.num_heads, *keys.shape[-2:])
        self.values = values.view(self.batch_size, self.num_heads, *values.shape[-2:])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        columns = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
        self.cumulative_length = self.cumulative_length + key_states.shape[-2]
        along = self.carried_keys.dim() - 2  # the cache's column dim
        keys, values = (states.reshape(carried_shape(states.shape)) for states in (key_states, value_states))
        self.hold(self.carried_keys.index_copy(along, columns, keys),
                  self.carried_values.index_copy(along, columns, values))
        return self.keys, self.values


def carried_shape(shape) -> tuple[int, ...]:
    """[batch, kv heads, length, head dim] without a batch or head dim of 1."""
    return tuple(size for dim, size in enumerate(shape) if dim >= 2 or size != 1)


# the layer types export_generate carries a cache for: a full-length cache each. The model's mask limits a sliding
# layer to its window (counted in cache columns, as transformers' hybrid cache counts them), so the tokens are the
# hybrid cache's; the cost is a whole cache read per step where a window would do.
CACHED_LAYER_TYPES = ("full_attention", "sliding_attention")


def cache_shapes(model, batch: int, max_cache_len: int) -> list[tuple[int, ...]]:
    """The carried shape of each cache tensor: keys and values per layer, each ``max_cache_len`` long."""
    return [carried_shape(shape) for shape in layer_shapes(model, batch, max_cache_len)]


def layer_shapes(model, batch: int, max_cache_len: int) -> list[tuple[int, int, int, int]]:
    """[batch, kv heads, max_cache_len, head dim] of each cache tensor (keys and values per layer); refuses
    models with other layers (chunked or linear attention, shared caches)."""
    config = model.config.get_text_config(decoder=True)
    layer_types, _ = get_layer_types_and_kwargs(config)
    other = sorted(set(layer_types) - set(CACHED_LAYER_TYPES))
    if other:
        raise NotImplementedError(f"export_generate handles decoders whose layers use full or sliding-window "
                                  f"attention; this model has {', '.join(other)} layers")
    head_dim = get_head_shapes(config)[1]
    per_layer = zip(kv_heads(config, len(layer_types)), _per_layer(head_dim, len(layer_types)))
    return [(batch, h, max_cache_len, d) for h, d in per_layer for _ in ("keys", "values")]


def kv_heads(config, layers: int) -> list[int]:
    """Each layer's key and value heads: transformers' count (``get_head_shapes``), but one for Falcon's classic
    multi-query attention, whose config counts query heads (``FalconAttention`` uses a single key and value head
    when ``multi_query`` and not ``new_decoder_architecture``)."""
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", True):
        return [1] * layers
    return _per_layer(get_head_shapes(config)[0], layers)


def _per_layer(value, layers: int) -> list[int]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * layers


class Step(torch.nn.Module):
    """A step of the loop: the model run on some tokens (the subclass's), then the next token chosen as ``generate``
    would (``choose``)."""

    def __init__(self, model, settings: GenerationSettings):
        super().__init__()
        self.model = model
        self.settings = settings

    def choose(self, logits, tokens, column, prompt_len, done, caches) -> LoopState:
        """Write the token for ``column`` (chosen from ``logits``; pad where the row is done) into ``tokens``; the
        carried state after it, with the new ``caches``."""
        settings = self.settings
        scores = self.processed(logits, tokens, column, prompt_len)
        if settings.sampling.do_sample:
            chosen = sampled(scores, settings.sampling)
        else:
            chosen = scores.argmax(-1)
        pad = torch.full_like(chosen, settings.pad_token_id)
        chosen = torch.where(done, pad, chosen)
        if settings.eos_token_ids:
            done = done | one_of(chosen, settings.eos_token_ids)
        tokens = tokens.index_copy(1, column.reshape(1), chosen.unsqueeze(1))
        going = (column < self.last_column(prompt_len)) & ~done.all()
        return LoopState(tokens, column, done, going, caches)

    def processed(self, logits, tokens, column, prompt_len):
        """The scores after the logits processors ``generate`` applies for these settings (``tokens`` before
        ``column`` are the sequence so far, the left padding included, as ``generate`` reads a padded batch)."""
        rows = tokens.shape[0]
        live = (torch.arange(tokens.shape[1], device=tokens.device) < column).expand(rows, -1)
        return processed(logits, self.settings, SequenceSoFar(
            tokens, live, column, (column - prompt_len).expand(rows), column.expand(rows),
            (column == self.last_column(prompt_len)).expand(rows)))

    def last_column(self, prompt_len):
        """The column of the last new token."""
        return prompt_len + self.settings.max_new_tokens - 1


class SequenceSoFar(NamedTuple):
    """What ``generate``'s logits processors read of each row's sequence before the token chosen at column
    ``end``: its columns of ``tokens`` are those ``live`` marks (all before ``end``)."""
    tokens: torch.Tensor  # [rows, columns] int64
    live: torch.Tensor    # [rows, columns] bool: the row's sequence (its prompt and the tokens made so far)
    end: torch.Tensor     # 0-d int64: the column of the token being chosen
    made: torch.Tensor    # [rows] int64: the new tokens made before it
    length: torch.Tensor  # [rows] int64: the sequence's length (``input_ids.shape[-1]`` in ``generate``)
    last: torch.Tensor    # [rows] bool: it is the last token the row may make


def processed(logits, settings: GenerationSettings, sequence: SequenceSoFar):
    """``logits`` [rows, vocab] after the logits processors ``generate`` applies for ``settings``, in its order,
    each row over its own sequence so far."""
    scores = logits
    if settings.repetition_penalty != 1.0:
        seen = torch.zeros_like(scores).scatter_add(1, sequence.tokens, sequence.live.to(scores.dtype)) > 0
        penalised = torch.where(scores < 0, scores * settings.repetition_penalty,
                                scores / settings.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    if settings.no_repeat_ngram_size:
        scores = scores.masked_fill(repeated_ngram_ends(sequence, settings.no_repeat_ngram_size, scores.shape[1]),
                                    float("-inf"))
    banned = [word[-1] for word in settings.bad_words_ids if len(word) == 1]
    if banned:
        scores = scores.masked_fill(in_vocabulary(scores, banned), float("-inf"))
    for word in (w for w in settings.bad_words_ids if len(w) > 1):
        follows = suffix_is(sequence, word[:-1]).unsqueeze(1)
        only = torch.arange(scores.shape[1], device=scores.device) == word[-1]
        scores = scores.masked_fill(follows & only, float("-inf"))
    if settings.eos_token_ids and (settings.min_new_tokens or settings.min_length):
        early = (sequence.made < settings.min_new_tokens) | (sequence.length < settings.min_length)
        scores = scores.masked_fill(early.unsqueeze(1) & in_vocabulary(scores, settings.eos_token_ids),
                                    float("-inf"))
    if settings.forced_bos_token_id is not None:
        scores = forced(scores, [settings.forced_bos_token_id], (sequence.length == 1).unsqueeze(1))
    if settings.forced_eos_token_ids:
        scores = forced(scores, settings.forced_eos_token_ids, sequence.last.unsqueeze(1))
    if settings.suppress_tokens:
        scores = scores.masked_fill(in_vocabulary(scores, settings.suppress_tokens), float("-inf"))
    return scores


def one_of(values, token_ids) -> torch.Tensor:
    """Where ``values`` is one of ``token_ids`` (a list; compares, where ``isin`` and ``index_fill`` would send the
    step through torch's decompositions)."""
    return (values.unsqueeze(-1) == torch.tensor(token_ids, device=values.device)).any(-1)


def in_vocabulary(scores, token_ids) -> torch.Tensor:
    """[vocab]: which columns of ``scores`` are ``token_ids``."""
    return one_of(torch.arange(scores.shape[-1], device=scores.device), token_ids)


def forced(scores, token_ids, when) -> torch.Tensor:
    """``scores``, or where ``when`` (bool, broadcast to ``scores``) -inf but 0 at ``token_ids`` (transformers'
    forced BOS/EOS)."""
    only = torch.where(in_vocabulary(scores, token_ids), 0.0, float("-inf")).to(scores.dtype).expand_as(scores)
    return torch.where(when, only, scores)


def suffix_is(sequence: SequenceSoFar, word) -> torch.Tensor:
    """Per row, whether the tokens of its sequence just before ``sequence.end`` are ``word`` (False where it has
    fewer)."""
    size = len(word)
    where = (sequence.end - size + torch.arange(size, device=sequence.tokens.device)).clamp(min=0)
    recent = sequence.tokens.index_select(1, where)
    return (recent == torch.tensor(word, device=recent.device)).all(1) & \
        sequence.live.index_select(1, where).all(1) & (sequence.end >= size)


def repeated_ngram_ends(sequence: SequenceSoFar, size: int, vocab: int) -> torch.Tensor:
    """[rows, vocab]: the tokens that would complete an n-gram of ``size`` already in a row's sequence
    (transformers' ``NoRepeatNGramLogitsProcessor`` over the sequence so far)."""
    tokens, end = sequence.tokens, sequence.end
    windows = tokens.unfold(1, size, 1)  # [rows, columns - size + 1, size]
    inside = sequence.live.unfold(1, size, 1).all(-1)  # windows wholly in the sequence
    prefix_columns = (end - size + 1 + torch.arange(size - 1, device=tokens.device)).clamp(min=0)
    prefix = tokens.index_select(1, prefix_columns)
    has_prefix = sequence.live.index_select(1, prefix_columns).all(1) & (end >= size)
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(-1) & inside & has_prefix.unsqueeze(1)
    spare = torch.full_like(windows[..., -1], vocab)  # non-matching windows land past the vocabulary
    banned = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.bool, device=tokens.device)
    return banned.scatter(1, torch.where(matches, windows[..., -1], spare), True)[:, :vocab]


def sampled(scores, sampling: Sampling) -> torch.Tensor:
    """One token per row drawn from softmax(scores / temperature) restricted to the top-k, then top-p, set
    (transformers' warpers), by the Gumbel-max trick."""
    scores = scores / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[1]:
        kth = torch.topk(scores, sampling.top_k).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        cumulative = ascending.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - sampling.top_p
        drop[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    uniform = torch.rand_like(scores).clamp(min=torch.finfo(scores.dtype).tiny)
    return (scores - torch.log(-torch.log(uniform))).argmax(-1)


class CausalStep(Step):
    """A step of a causal LM: the model run on ``input_ids`` over the carried cache."""

    def run_model(self, input_ids, padding, positions, offset, caches):
        """Last-position logits (float32) and the new caches, for ``input_ids`` written at columns ``offset``, ..."""
        heads = kv_heads(self.model.config.get_text_config(decoder=True), len(caches) // 2)
        layers = [CarriedLayer(caches[2 * i], caches[2 * i + 1], offset, input_ids.shape[0], heads[i])
                  for i in range(len(caches) // 2)]
        cache = Cache(layers=layers)
        logits = self.model(input_ids=input_ids, attention_mask=padding, position_ids=positions, cache=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1].float()
        return logits, [t for layer in layers for t in (layer.carried_keys, layer.carried_values)]


class Prefill(CausalStep):
    """The prompt through the model from an empty cache, and the first new token. ``cache_layouts``: per cache
    tensor, its spec over the export's mesh (``mark_sharding``: the cache is made and written split so, as the
    decode step takes it); None: left to the partitioner."""

    def __init__(self, model, settings: GenerationSettings, cache_shapes: list, cache_layouts: list | None = None):
        super().__init__(model, settings)
        self.cache_shapes = cache_shapes
        self.cache_layouts = cache_layouts

    def forward(self, input_ids, attention_mask):
        batch, prompt_len = input_ids.shape
        size = self.settings.max_cache_len
        padding = torch.ones(batch, size, dtype=attention_mask.dtype, device=input_ids.device)
        padding = padding.slice_scatter(attention_mask, 1, 0, prompt_len)
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        zeros = [torch.zeros(shape, dtype=self.model.dtype, device=input_ids.device) for shape in self.cache_shapes]
        if self.cache_layouts:
            zeros = [mark_sharding(z, spec) if spec is not None else z for z, spec in zip(zeros, self.cache_layouts)]
        offset = torch.zeros((), dtype=torch.int64, device=input_ids.device)
        logits, caches = self.run_model(input_ids, padding, positions, offset, zeros)
        tokens = torch.full((batch, size), self.settings.pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
        tokens = tokens.slice_scatter(input_ids, 1, 0, prompt_len)
        column = offset + prompt_len
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
        return Carried(self.choose(logits, tokens, column, column, done, caches), Prompt(padding, column))


class Decode(CausalStep):
    """One step: the token at ``cursor`` through the model, the next one chosen and written after it."""

    def forward(self, state: LoopState, fixed: Prompt) -> LoopState:
        cursor = state.cursor
        input_ids = state.tokens.index_select(1, cursor.reshape(1))
        positions = positions_before(fixed.padding, cursor)
        logits, caches = self.run_model(input_ids, fixed.padding, positions, cursor, state.caches)
        return self.choose(logits, state.tokens, cursor + 1, fixed.prompt_len, state.done, caches)


def positions_before(padding, cursor):
    """[batch, 1]: the position of the token at column ``cursor``, the real tokens (``padding`` ones) before it."""
    written = torch.arange(padding.shape[1], device=padding.device) < cursor
    return (padding * written).sum(-1, keepdim=True)
