"""The decode state an engine carries on the device between calls, as one typed structure (``DecodeState``) whose
fields are named here once: the torch steps take and return it, ``export_engine`` builds the examples and the
specs from it, and the runtime (``formats.engine_artifact``) holds its leaves in this order, donated to each call.

Cache layout: per-slot rows with one shared write column, as JetStream's engine does. Every slot's keys and values
sit in row ``slot`` of a ``[slots, kv heads, max_cache_len, head dim]`` tensor per layer; all slots write the
column ``cursor`` at each step, so a step writes one column (an in-place update slice) and reads the columns up to
the cursor, as ``export_generate``'s decode does. A request is inserted so that its prompt ends just before the
cursor (the columns before it are its left padding: ``padding`` is 0 there), so its positions and its sliding
windows are counted as in a left-padded batch. Cost: memory is ``slots x max_cache_len`` columns whatever the
requests' lengths (no pages), and each step reads every slot's columns from the oldest live request's start up
to the cursor; ``shift`` moves all rows left (one copy of the caches) when the cursor nears the end or the
padding before the live requests grows, which keeps that read short.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Sampling(NamedTuple):
    """Per-row sampling settings: one value per slot (per request in a prefill)."""
    do_sample: torch.Tensor    # bool
    temperature: torch.Tensor  # float32, > 0
    top_k: torch.Tensor        # int64, the vocabulary size where none
    top_p: torch.Tensor        # float32, 1.0 where none
    seed: torch.Tensor         # int64: a row's random numbers depend only on it and the token's position


class DecodeState(NamedTuple):
    """Everything the generate step reads and writes, per slot where it has a slot dim."""
    tokens: torch.Tensor       # [slots, max_cache_len] int64: each slot's token at a column (the last one at cursor)
    cursor: torch.Tensor       # () int64: the column every slot's next token is read from and its cache written at
    done: torch.Tensor         # [slots] bool: the slot holds no request still making tokens
    padding: torch.Tensor      # [slots, max_cache_len] int64: 0 before a slot's request, 1 from its first token on
    last_column: torch.Tensor  # [slots] int64: the column of a request's last allowed token
    first_column: torch.Tensor  # [slots] int64: the column of a request's first new token (its prefill's)
    sampling: Sampling         # [slots] each
    caches: tuple              # per layer keys then values, [slots, kv heads, max_cache_len, head dim] (carried)


class Generated(NamedTuple):
    """What the generate call returns."""
    state: DecodeState
    tokens: torch.Tensor          # [steps_per_call, slots] int64: each step's tokens (pad where done or not run)


class Prompt(NamedTuple):
    """What the prefill takes: one prompt, left-padded to a bucket's length."""
    input_ids: torch.Tensor       # [1, bucket] int64
    attention_mask: torch.Tensor  # [1, bucket] int64: 0 on the padding, then 1
    max_new_tokens: torch.Tensor  # [1] int64: the request's (its first token may be its last)
    sampling: Sampling            # [1] each: the first new token's


class Prefilled(NamedTuple):
    """What the prefill returns."""
    first_token: torch.Tensor     # [1] int64
    caches: tuple                 # per layer keys then values of the bucket's columns (carried, batch dim dropped)


class Admission(NamedTuple):
    """What the insert takes besides the state: a prefilled request and the slot it goes to."""
    slot: torch.Tensor            # () int64
    prompt_ids: torch.Tensor      # [1, bucket] int64: the prompt as prefilled (left-padded to its bucket)
    prompt_len: torch.Tensor      # () int64: the prompt's real tokens
    max_new_tokens: torch.Tensor  # () int64
    sampling: Sampling            # [1] each
    prefilled: Prefilled


def sampling_rows(rows: int, vocab_size: int, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                  seed=0) -> Sampling:
    """``rows`` rows of the same sampling settings (``None``: no top-k / top-p cut)."""
    return Sampling(do_sample=torch.full((rows,), bool(do_sample)),
                    temperature=torch.full((rows,), float(temperature)),
                    top_k=torch.full((rows,), int(vocab_size if top_k is None else top_k), dtype=torch.int64),
                    top_p=torch.full((rows,), float(1.0 if top_p is None else top_p)),
                    seed=torch.full((rows,), int(seed), dtype=torch.int64))


def empty_state(slots: int, max_cache_len: int, cache_shapes: list, cache_dtype: torch.dtype, vocab_size: int,
                pad_token_id: int, cursor: int) -> DecodeState:
    """The state of an engine with every slot free. Free rows attend to their own (zero) columns so that nothing
    they compute is NaN (a NaN left in a masked column would reach a later request through 0 * NaN)."""
    return DecodeState(tokens=torch.full((slots, max_cache_len), pad_token_id, dtype=torch.int64),
                       cursor=torch.tensor(cursor, dtype=torch.int64),
                       done=torch.ones(slots, dtype=torch.bool),
                       padding=torch.ones(slots, max_cache_len, dtype=torch.int64),
                       last_column=torch.zeros(slots, dtype=torch.int64),
                       first_column=torch.zeros(slots, dtype=torch.int64),
                       sampling=sampling_rows(slots, vocab_size),
                       caches=tuple(torch.zeros(shape, dtype=cache_dtype) for shape in cache_shapes))
