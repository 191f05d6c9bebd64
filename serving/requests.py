"""A request to the engine: its checks (``RequestError`` says what is wrong and what is right), its sampling
settings resolved against the model's defaults (``resolve_sampling``), and its token stream (``Request``), read
by a blocking iterator or ``async for``; a stream closed or dropped early cancels the request."""
from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from typing import Iterator

import torch

from torch_stablehlo.exporter.engine.state import Sampling, sampling_rows
from torch_stablehlo.exporter.generate import generation_settings
from torch_stablehlo.exporter.formats.engine_artifact import EngineConfig, SamplingDefaults

STOP, LENGTH, CANCELLED = "stop", "length", "cancelled"  # finish reasons: an eos, max_new_tokens, cancelled
SEED_RANGE = 1 << 63
_IDS = itertools.count()


class RequestError(ValueError):
    """A request the engine cannot take (raised by ``Engine.submit``; the engine goes on serving others)."""


class QueueFull(RuntimeError):
    """The engine's queue of waiting requests is full: try again later (back-pressure)."""


def checked_prompt(prompt_ids, config: EngineConfig) -> list[int]:
    """``prompt_ids`` as a list of ints; RequestError unless it holds 1 to ``max_prompt_len`` ids in the
    vocabulary."""
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.reshape(-1).tolist() if prompt_ids.dim() <= 1 or prompt_ids.shape[0] == 1 else None
    if isinstance(prompt_ids, (str, bytes)) or prompt_ids is None or not hasattr(prompt_ids, "__iter__"):
        raise RequestError(f"prompt_ids must be a list of token ids (ints), got {type(prompt_ids).__name__}")
    prompt = list(prompt_ids)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise RequestError("prompt_ids must hold token ids as ints; got "
                           f"{sorted({type(t).__name__ for t in prompt if not isinstance(t, int)})}")
    if not prompt:
        raise RequestError(f"the prompt is empty: give 1 to {config.max_prompt_len} token ids")
    if len(prompt) > config.max_prompt_len:
        raise RequestError(f"a prompt of {len(prompt)} tokens is too long: this engine takes 1 to "
                           f"{config.max_prompt_len} (export_engine's max_prompt_len)")
    outside = sorted({t for t in prompt if not 0 <= t < config.vocab_size})
    if outside:
        raise RequestError(f"token id(s) {outside[:8]} are outside the vocabulary: ids run from 0 to "
                           f"{config.vocab_size - 1}")
    return prompt


def checked_max_new_tokens(max_new_tokens, prompt_len: int, config: EngineConfig) -> int:
    """RequestError unless ``max_new_tokens`` is an int from 1 to what the cache holds after the prompt's bucket."""
    room = config.max_cache_len - config.bucket(prompt_len)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or not 1 <= max_new_tokens <= room:
        raise RequestError(f"max_new_tokens must be an int from 1 to {room} for a prompt of {prompt_len} tokens "
                           f"(the cache holds {config.max_cache_len}, {config.bucket(prompt_len)} of them for the "
                           f"prompt), got {max_new_tokens!r}")
    return max_new_tokens


def resolve_sampling(defaults: SamplingDefaults, vocab_size: int, do_sample=None, temperature=None, top_k=None,
                     top_p=None, seed=None) -> Sampling:
    """A request's sampling settings as the engine's rows hold them, resolved as ``model.generate`` and
    ``export_generate`` resolve them (``generation_settings.resolve_sampling``: each argument given wins, else the
    model's ``generation_config`` value, else generate's default); RequestError for a value out of range. A
    sampled request without a seed gets a random one."""
    try:
        chosen = generation_settings.resolve_sampling(defaults, do_sample, temperature, top_k, top_p)
    except ValueError as error:
        raise RequestError(str(error)) from None
    if seed is None:
        seed = random.randrange(SEED_RANGE)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_RANGE:
        raise RequestError(f"seed must be an int from 0 to 2**63 - 1, or None (a random one), got {seed!r}")
    return sampling_rows(1, vocab_size, chosen.do_sample, chosen.temperature,
                         min(chosen.top_k or vocab_size, vocab_size), chosen.top_p, seed)


class Request:
    """One request's token stream. ``for token in request`` blocks until each token is made; ``async for``
    awaits them without blocking the event loop; leaving either early (``break``, the iterator closed or
    garbage-collected) cancels the request, as ``cancel()`` does. ``finish_reason`` is ``'stop'`` (an eos),
    ``'length'`` (``max_new_tokens``) or ``'cancelled'`` once it is done, else None."""

    def __init__(self, prompt: list[int], max_new_tokens: int, sampling: Sampling, engine):
        self.id = f"req-{next(_IDS)}"
        self.prompt = prompt
        self.prompt_tokens = len(prompt)
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.tokens: list[int] = []          # made so far
        self.token_times: list[float] = []   # time.perf_counter() as each was made
        self.submitted_at = time.perf_counter()
        self.finish_reason: str | None = None
        self._engine = engine
        self._changed = threading.Condition()
        self._wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    def cancel(self) -> None:
        """Stop making tokens for this request and free its slot (nothing if it is done)."""
        if self.finish_reason is None:
            self._engine._cancel(self)

    # -- the engine's side -------------------------------------------------
    def _push(self, token: int, finish_reason: str | None = None) -> None:
        with self._changed:
            if self.finish_reason is not None:
                return
            self.tokens.append(token)
            self.token_times.append(time.perf_counter())
            self.finish_reason = finish_reason
            self._notify()

    def _finish(self, reason: str) -> None:
        with self._changed:
            if self.finish_reason is None:
                self.finish_reason = reason
                self._notify()

    def _notify(self) -> None:
        self._changed.notify_all()
        wakeups, self._wakeups = self._wakeups, []
        for loop, event in wakeups:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    # -- the consumer's side -----------------------------------------------
    def __iter__(self) -> Iterator[int]:
        index = 0
        try:
            while True:
                with self._changed:
                    while index == len(self.tokens) and self.finish_reason is None:
                        self._changed.wait()
                    if index == len(self.tokens):
                        return
                    token = self.tokens[index]
                index += 1
                yield token
        finally:
            self.cancel()

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        index = 0
        try:
            while True:
                with self._changed:
                    ready = index < len(self.tokens)
                    if not ready and self.finish_reason is not None:
                        return
                    if ready:
                        token = self.tokens[index]
                    else:
                        event = asyncio.Event()
                        self._wakeups.append((loop, event))
                if ready:
                    index += 1
                    yield token
                else:
                    await event.wait()
        finally:
            self.cancel()
