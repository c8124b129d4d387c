"""How a streaming consumer splits its credit over its streams (docs/protocol.md): a
pure ledger, no I/O and no tasks. The consumer tells it what happened on each stream
(opened, delivered again, settled, credit returned, ended) and asks it which credit
frames to send; it sends them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class CreditPolicy(Generic[K]):
    """The credit a consumer holds at most (``credit``), split over the streams the route
    lists (``expected``). For each stream it keeps the credit granted on it and not
    returned yet (the server's unused credit plus the messages it delivered that are
    held here unsettled), and whether a credit asked back is still unanswered.

    Streams are any hashable keys. A stream it does not know (never opened, or dropped)
    is ignored by ``superseded``, ``settled`` and ``returned``: what it held went with it."""

    __slots__ = ("_granted", "_reclaiming", "credit", "expected")

    def __init__(self, credit: int) -> None:
        self.credit = credit
        self.expected = 0  # streams the last route listed (credit is split over them)
        self._granted: dict[K, int] = {}
        self._reclaiming: set[K] = set()

    # what a caller can read
    def granted(self, stream: K) -> int:
        """Credit given on ``stream`` and not returned: server credit + held here."""
        return self._granted.get(stream, 0)

    def reclaiming(self, stream: K) -> bool:
        """A negative credit went out on ``stream`` and its ``returned`` answer is not in."""
        return stream in self._reclaiming

    def held(self, streams: Sequence[K]) -> int:
        """The credit granted on ``streams`` together."""
        return sum(self.granted(s) for s in streams)

    # what happened on the streams
    def open(self, stream: K) -> None:
        """A new stream: it holds no credit yet."""
        self._granted.setdefault(stream, 0)

    def drop(self, stream: K) -> None:
        """A stream ended: what it held is free (the server delivers its messages again)."""
        self._granted.pop(stream, None)
        self._reclaiming.discard(stream)

    def superseded(self, stream: K) -> None:
        """A message ``stream`` delivered came again (from another output host after a
        failover, or after its visibility timeout): the earlier delivery is void and its
        credit returns (else every such delivery leaked one, and a stream whose credit
        had leaked away got nothing more: its extents starved)."""
        if stream in self._granted:
            self._granted[stream] = max(0, self._granted[stream] - 1)

    def settled(self, stream: K, n: int) -> None:
        """``n`` messages ``stream`` delivered were acked or nacked: their credit returns."""
        if stream in self._granted:
            self._granted[stream] -= n

    def returned(self, stream: K, n: int) -> None:
        """The server's answer to a credit asked back: ``n`` is free again (the next
        grant hands it to the streams short of their share)."""
        if stream in self._granted:
            self._granted[stream] = max(0, self._granted[stream] - n)
            self._reclaiming.discard(stream)

    # what to send
    def shares(self, count: int) -> list[int]:
        """The share of each of ``count`` open streams: the credit split over the streams
        the route lists (``expected``) or the open ones if more, at least 1 each."""
        share, extra = divmod(self.credit, max(count, self.expected))
        return [max(1, share + (i < extra)) for i in range(count)]

    def grant(self, streams: Sequence[K]) -> list[tuple[K, int]]:
        """The credit frames to send now, in order, over the open ``streams``; each one's
        ``n`` is already counted as granted (a positive one) or being asked back (a
        negative one).

        Each open stream gets its share as far as the credit that others still hold
        allows. A listed stream that is reconnecting (``expected`` counts it, ``streams``
        does not) keeps its share free: credit once granted returns only as that stream's
        messages settle, so handing it to the others meanwhile let a stream with nothing
        left to deliver hold it for good, and the reconnected stream starved (seen when
        an extent moved just as a consumer started).

        When the shares shrink (the route lists another host) and a stream still holds
        more than its new share while another is short, the excess is asked back (a
        negative credit) once until the server answers with what it took back
        (``returned``); the next grant hands that out."""
        if not streams:
            return []
        granted = self._granted
        for stream in streams:
            granted.setdefault(stream, 0)
        spare = self.credit - sum(granted[s] for s in streams)
        shares = self.shares(len(streams))
        frames: list[tuple[K, int]] = []
        short = 0
        for stream, due in zip(streams, shares, strict=True):
            give = min(due - granted[stream], spare)
            if give > 0:
                granted[stream] += give
                spare -= give
                frames.append((stream, give))
            short += max(0, due - granted[stream])
        if short:
            for stream, due in zip(streams, shares, strict=True):
                if granted[stream] > due and stream not in self._reclaiming:
                    self._reclaiming.add(stream)
                    frames.append((stream, due - granted[stream]))
        return frames
