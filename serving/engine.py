"""``Engine``: continuous batching over an exported engine (``exporter.export_engine``) on one scheduler thread.

The thread loops: it drops cancelled requests, admits waiting ones into free slots (prefill, then insert, shifting
the rows first where the cursor needs room: ``scheduler.SlotTable``), runs a generate call of a few steps over all
slots (``_steps_due``) and hands each live request its tokens at once, retiring it at its eos or its
``max_new_tokens``. Requests wait in a bounded first-come queue (``QueueFull`` past it); a bad request is refused at
``submit`` (``RequestError``) and never reaches the thread.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time

import numpy as np

from torch_stablehlo.exporter.formats.engine_artifact import EngineArtifact

from .requests import (CANCELLED, LENGTH, STOP, QueueFull, Request, checked_max_new_tokens, checked_prompt,
                       resolve_sampling)
from .scheduler import SlotTable

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineStats:
    """Where the scheduler thread's time went since the engine started: wall seconds and calls per entry point
    (``prefill``, ``insert``, ``shift``, ``generate``), the generate steps run and, summed over them, the slots
    that held a live request (``busy_slot_steps / (steps * slots)`` is the mean occupancy)."""
    seconds: dict = dataclasses.field(default_factory=collections.Counter)
    calls: dict = dataclasses.field(default_factory=collections.Counter)
    steps: int = 0
    busy_slot_steps: int = 0


class Engine:
    """Serves an ``EngineArtifact``: ``submit`` requests, read their tokens as they are made. Use it as a context
    manager, or ``close()`` it (waiting and live requests are cancelled). Each generate call runs up to
    ``steps_per_call`` steps (default: as many as the export allows): more amortise the call, fewer let waiting
    requests in sooner and stream tokens more evenly."""

    def __init__(self, artifact: EngineArtifact, max_queue: int = 64, platform: str = "cpu",
                 steps_per_call: int | None = None):
        if not isinstance(artifact, EngineArtifact):
            raise TypeError(f"Engine takes an EngineArtifact (exporter.export_engine, or load_artifact of its bundle), "
                            f"got {type(artifact).__name__}")
        self.config = artifact.config
        self.max_queue = max_queue
        most = self.config.steps_per_call
        if steps_per_call is not None and not (isinstance(steps_per_call, int) and 1 <= steps_per_call <= most):
            raise ValueError(f"steps_per_call must be an int from 1 to {most} (the engine's export), got "
                             f"{steps_per_call!r}")
        self.steps_per_call = steps_per_call or most
        self._runner = artifact.runner(platform)
        self._table = self._empty_table()
        self._waiting: collections.deque[Request] = collections.deque()
        self._live: dict[int, Request] = {}  # by slot
        self._cancelled: set[Request] = set()
        self._lock = threading.Condition()
        self._closed = False
        self._stats = EngineStats()
        self._thread = threading.Thread(target=self._serve, name="torch-stablehlo-engine", daemon=True)
        self._thread.start()

    # -- what the engine is ---------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.config.slots

    @property
    def slots_busy(self) -> int:
        return len(self._live)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def max_prompt_len(self) -> int:
        return self.config.max_prompt_len

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @property
    def stats(self) -> EngineStats:
        """A copy of the time spent per entry point and the steps run so far (``EngineStats``)."""
        with self._lock:
            return EngineStats(collections.Counter(self._stats.seconds), collections.Counter(self._stats.calls),
                               self._stats.steps, self._stats.busy_slot_steps)

    # -- requests -----------------------------------------------------------------
    def submit(self, prompt_ids, max_new_tokens: int = 64, do_sample=None, temperature=None, top_k=None, top_p=None,
               seed=None) -> Request:
        """Queue a request; its tokens stream from the returned ``Request``. Sampling arguments left None take the
        model's ``generation_config`` defaults. RequestError for a bad request, QueueFull when the queue is."""
        prompt = checked_prompt(prompt_ids, self.config)
        max_new_tokens = checked_max_new_tokens(max_new_tokens, len(prompt), self.config)
        sampling = resolve_sampling(self.config.defaults, self.config.vocab_size, do_sample, temperature, top_k,
                                    top_p, seed)
        request = Request(prompt, max_new_tokens, sampling, self)
        with self._lock:
            if self._closed:
                raise RuntimeError("this engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting, the most this engine queues "
                                f"(max_queue={self.max_queue}); retry later")
            self._waiting.append(request)
            self._lock.notify_all()
        return request

    def _cancel(self, request: Request) -> None:
        """The request ends at once (``cancelled``: no token after this reaches it); a live one's slot is freed by
        the thread before its next generate call."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
            else:
                self._cancelled.add(request)
            request._finish(CANCELLED)
            self._lock.notify_all()

    def close(self) -> None:
        """Stop the scheduler thread; every request not done is cancelled."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join()
        for request in [*self._waiting, *self._live.values()]:
            request._finish(CANCELLED)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the scheduler thread -----------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._waiting and not self._live:
                    self._lock.wait()
                if self._closed:
                    return
                self._retire_cancelled()
            try:
                self._admit()
                if self._live:
                    self._step()
            except Exception:  # a fault of the runtime, not of a request: end the live ones, start afresh
                LOG.exception("the engine's step failed; its live requests are cancelled")
                for slot in list(self._live):
                    self._retire(slot, CANCELLED)
                self._runner.reset()
                self._table = self._empty_table()

    def _empty_table(self) -> SlotTable:
        """The slot table of a fresh state: every slot free, the cursor at the longest bucket, where shifts leave
        it (so a request of any prompt length finds room before it)."""
        longest = self.config.max_prompt_len
        return SlotTable(self.config.slots, self.config.max_cache_len, longest, floor=longest)

    def _retire_cancelled(self) -> None:
        for slot, request in list(self._live.items()):
            if request in self._cancelled:
                self._retire(slot, CANCELLED)
        self._cancelled.clear()

    def _admit(self) -> None:
        """Prefill and insert waiting requests, first come first served, while slots are free and the cursor has
        room for the next one."""
        while self._table.free:
            with self._lock:
                if not self._waiting:
                    return
                request = self._waiting[0]
                shift = self._table.shift_for(self.config.bucket(request.prompt_tokens), request.max_new_tokens)
                if shift is None:
                    return
                self._waiting.popleft()
            try:
                self._place(request, shift)
            except Exception:  # taken from the queue, not yet live: ended here, or its reader would wait forever
                request._finish(CANCELLED)
                raise

    def _place(self, request: Request, shift: int) -> None:
        """Shift the rows by ``shift``, prefill ``request`` and, unless its first token ends it, insert it."""
        if shift:
            with self._timed("shift"):
                self._runner.shift(shift)
            self._table.shifted(shift)
        with self._timed("prefill"):
            prefilled = self._runner.prefill(request.prompt, request.sampling, request.max_new_tokens)
        first = int(np.asarray(prefilled.first_token)[0])
        finish = self._finish_reason(request, first, 1)
        request._push(first, finish)
        if finish is None:
            slot = self._table.insert(request.prompt_tokens, request.max_new_tokens)
            with self._timed("insert"):
                self._runner.insert(slot, request.prompt, request.max_new_tokens, request.sampling, prefilled)
            self._live[slot] = request

    def _step(self) -> None:
        steps = self._steps_due()
        with self._timed("generate"):
            tokens = self._runner.generate(steps)
        with self._lock:
            self._stats.steps += steps
            self._stats.busy_slot_steps += steps * len(self._live)
        self._table.stepped(steps)
        for slot, request in list(self._live.items()):
            for token in tokens[:, slot].tolist():
                finish = self._finish_reason(request, token, request.completion_tokens + 1)
                request._push(token, finish)
                if finish is not None:
                    self._retire(slot, finish)
                    break

    def _steps_due(self) -> int:
        """How many steps the next generate call runs: at most ``steps_per_call``, and no more than any live
        request still needs (the cursor stays inside every slot's columns); where a request waits, no more than
        the first to end needs, so its slot is free for the waiting one at once."""
        left = [request.max_new_tokens - request.completion_tokens for request in self._live.values()]
        with self._lock:
            waiting = bool(self._waiting)
        return max(1, min(self.steps_per_call, min(left) if waiting else max(left)))

    @contextlib.contextmanager
    def _timed(self, entry_point: str):
        """Count the wall time of the block as a call of ``entry_point`` (``EngineStats``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._stats.seconds[entry_point] += time.perf_counter() - start
                self._stats.calls[entry_point] += 1

    def _finish_reason(self, request: Request, token: int, made: int) -> str | None:
        if token in self.config.eos_token_ids:
            return STOP
        return LENGTH if made >= request.max_new_tokens else None

    def _retire(self, slot: int, reason: str) -> None:
        request = self._live.pop(slot)
        request._finish(reason)
        self._table.release(slot)
