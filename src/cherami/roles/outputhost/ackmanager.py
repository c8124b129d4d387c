"""Ack tracking for one consumer group on one extent.

Messages are tracked in read order; acks arrive in any order. The ack level is the
storage key of the last message of the acked prefix, and ``acked`` counts that prefix.
Only the window above the level is kept in memory, and an acked message's holder is
released at once (only its key stays until the level passes it). A holder is what
holds the message now: its entry, or the run it was read or delivered in (entry.py),
one holder for many ordinals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")

_COMPACT_AT = 1024


class AckManager(Generic[E]):
    def __init__(self, level: bytes = b"", acked: int = 0) -> None:
        self.level = level
        self.acked = acked
        self._dirty = False
        self.on_dirty: Callable[[], None] | None = None  # called when the level moves
        self._keys: list[bytes] = []
        self._entries: list[E | None] = []
        self._done = bytearray()
        self._head = 0
        self._base = 0  # ordinal of index 0

    def track(self, key: bytes, entry: E) -> int:
        """Track the next message in read order; returns its ordinal."""
        return self.track_many([key], [entry])

    def next_ordinal(self) -> int:
        """The ordinal the next message tracked gets."""
        return self._base + len(self._keys)

    def track_many(self, keys: list[bytes], entries: list[E]) -> int:
        """Track messages in read order (``keys[i]`` is ``entries[i]``'s); returns the
        ordinal of the first (the rest follow one by one)."""
        first = self.next_ordinal()
        self._keys.extend(keys)
        self._entries.extend(entries)
        self._done.extend(bytes(len(keys)))
        return first

    def hold(self, ordinal: int, holders: Sequence[E]) -> None:
        """The messages from ``ordinal`` on are held by ``holders`` now (those acked
        meanwhile stay released)."""
        index = ordinal - self._base
        done = self._done
        stop = index + len(holders)
        if done.find(1, index, stop) == -1:
            self._entries[index:stop] = holders
            return
        entries = self._entries
        for i, holder in enumerate(holders, index):
            if not done[i]:
                entries[i] = holder

    def ack_range(self, ordinal: int, n: int) -> int:
        """``ack_many(list(range(ordinal, ordinal + n)))``, marked in C when none of
        them was acked before (a run a stream acks as delivered)."""
        first = ordinal - self._base
        stop = first + n
        done = self._done
        if n > 1 and self._head <= first and stop <= len(done) and done.find(1, first, stop) == -1:
            done[first:stop] = b"\x01" * n
            self._entries[first:stop] = [None] * n
            if done[self._head]:
                self._advance()
            return n
        return self.ack_many(list(range(ordinal, ordinal + n)))

    def ack(self, ordinal: int) -> bool:
        """Mark a message acked; true if it was tracked and not acked before."""
        return self.ack_many([ordinal]) == 1

    def ack_many(self, ordinals: list[int]) -> int:
        """``ack`` of each ordinal, the level moved once at the end; returns how many
        were tracked and not acked before."""
        base, head, done, entries = self._base, self._head, self._done, self._entries
        end = len(done)
        n = len(ordinals)
        if n > 1:  # acks mostly come as a run in read order: a range, marked in C
            first = min(ordinals) - base
            stop = first + n
            if (
                head <= first
                and stop <= end
                and max(ordinals) - base == stop - 1
                and len(set(ordinals)) == n  # n distinct values in a span of n
                and done.find(1, first, stop) == -1  # none acked before
            ):
                done[first:stop] = b"\x01" * n
                entries[first:stop] = [None] * n
                if done[head]:
                    self._advance()
                return n
        newly = 0
        for ordinal in ordinals:
            index = ordinal - base
            if index < head or index >= end or done[index]:
                continue
            done[index] = 1
            entries[index] = None
            newly += 1
        if newly and done[head]:
            self._advance()
        return newly

    @property
    def dirty(self) -> bool:
        """Whether the level moved since it was last written."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if value and self.on_dirty is not None:
            self.on_dirty()

    def _advance(self) -> None:
        done = self._done
        head = done.find(0, self._head)  # the first not acked, found in C
        end = len(done)
        if head < 0:
            head = end
        self.acked += head - self._head
        self.level = self._keys[head - 1]
        self._head = head
        self.dirty = True
        if head >= _COMPACT_AT and head * 2 >= end:
            del self._keys[:head]
            del self._entries[:head]
            del done[:head]
            self._base += head
            self._head = 0

    def window(self) -> int:
        """How many messages are tracked above the ack level."""
        return len(self._keys) - self._head

    def acked_above_level(self) -> int:
        return self._done.count(1, self._head)

    def oldest(self) -> tuple[int, E | None] | None:
        """The ordinal and holder of the head of the window: the oldest message not yet
        acked."""
        head = self._head
        return (self._base + head, self._entries[head]) if head < len(self._entries) else None
