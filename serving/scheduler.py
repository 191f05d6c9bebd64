"""Where requests go in the engine's state: which slots are free, where the shared cursor is, and when the rows
must shift left to make room (pure Python, mirroring what the device state holds; see
``exporter.engine.state`` for the layout).

A request with a prompt of ``length`` tokens in a bucket of ``bucket`` columns is inserted with its bucket just
before the cursor, so its tokens take the columns from ``cursor - length`` (its start) to its last column,
``cursor + max_new_tokens - 1``, which must stay inside the cache. Every step moves the cursor one column on. To
admit a request the cursor must be at least its bucket and leave room for its new tokens: if it does not, the rows
shift left (none of the live requests' columns may fall off the front); with no live request the rows may move
either way. A shift leaves the cursor at ``floor`` (the longest bucket) where it can: left lower, a later request
with a longer prompt would find no room before the cursor, and would wait, holding the queue, until every live
request ended (the rows cannot move right under them).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Placed:
    """A live request's columns."""
    start: int        # the column of its first prompt token
    last_column: int  # the column of its last allowed token


class SlotTable:
    """The free slots, the live requests' columns and the cursor, as the device state has them."""

    def __init__(self, slots: int, max_cache_len: int, cursor: int, compact_at: int | None = None,
                 floor: int | None = None):
        self.max_cache_len = max_cache_len
        self.cursor = cursor
        self.floor = floor  # the lowest cursor a shift aims for (None: the bucket of the request placed)
        self.free = list(range(slots))
        self.live: dict[int, Placed] = {}
        # shift whenever this many columns can go (each step reads every column up to the cursor)
        self.compact_at = compact_at if compact_at is not None else max(1, max_cache_len // 8)

    @property
    def busy(self) -> int:
        return len(self.live)

    def shift_for(self, bucket: int, max_new_tokens: int) -> int | None:
        """How far the rows must shift left (negative: right) before a request of this bucket and length can be
        inserted at the cursor; None if it cannot be now (it can once older requests finish)."""
        needed = self.cursor + max_new_tokens - self.max_cache_len  # at least this far, for its last column
        floor = max(bucket, min(self.floor or bucket, self.max_cache_len - max_new_tokens))
        if not self.live:
            wanted = self.cursor - floor
            return wanted if needed > 0 or self.cursor < bucket or wanted >= self.compact_at else 0
        most = min(min(p.start for p in self.live.values()), self.cursor - bucket)  # keeps the live columns
        if most < max(needed, 0):
            return None
        wanted = min(most, self.cursor - floor)  # no lower than the floor unless the request needs it
        return max(needed, wanted) if needed > 0 or wanted >= self.compact_at else 0

    def shifted(self, by: int) -> None:
        self.cursor -= by
        for placed in self.live.values():
            placed.start -= by
            placed.last_column -= by

    def insert(self, prompt_len: int, max_new_tokens: int) -> int:
        """Take a free slot for a request inserted at the cursor; returns the slot."""
        slot = self.free.pop(0)
        self.live[slot] = Placed(self.cursor - prompt_len, self.cursor + max_new_tokens - 1)
        return slot

    def stepped(self, steps: int = 1) -> None:
        self.cursor += steps

    def release(self, slot: int) -> None:
        if self.live.pop(slot, None) is not None:
            self.free.append(slot)
