"""A checker of ordering keys (docs/api.md, "Ordering keys") for tests on real
processes: competing consumers, HTTP and stream, that record when they begin and end
each message, nack some, and report per key the order of first successful processing
and any two messages of a key in hand at once."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received


@dataclass
class KeyOrder:
    """What the consumers saw. ``poison`` bodies are always nacked; any other message is
    nacked with probability ``nack_rate`` on its first delivery only (so none of them
    reaches the DLQ)."""

    nack_rate: float = 0.1
    poison: frozenset[str] = frozenset()
    max_processing: float = 0.002  # seconds a message takes at most (uniformly random)
    acked: dict[str | None, list[str]] = field(default_factory=dict)  # key -> bodies acked
    spans: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)  # two of a key in hand at once
    redelivered_after_ack: list[str] = field(default_factory=list)
    nacks = 0
    deliveries = 0
    _busy: dict[str, str] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=lambda: random.Random(7))

    def begin(self, m: Received) -> None:
        self.deliveries += 1
        if m.key is None:
            return
        other = self._busy.get(m.key)
        if other is not None:
            self.overlaps.append(f"key {m.key}: {m.text} began while {other} was in hand")
        self._busy[m.key] = m.text

    def end(self, m: Received, began: float) -> bool:
        """The message is processed: True to ack it, False to nack it."""
        ok = m.text not in self.poison and not (
            m.delivery_count == 1 and self._rng.random() < self.nack_rate
        )
        if m.key is not None:
            self._busy.pop(m.key, None)
            self.spans.setdefault(m.key, []).append((began, time.monotonic(), m.text))
        if ok:
            done = self.acked.setdefault(m.key, [])
            if m.text in done:
                self.redelivered_after_ack.append(m.text)
            else:
                done.append(m.text)
        else:
            self.nacks += 1
        return ok

    async def process(self, m: Received) -> bool:
        began = time.monotonic()
        self.begin(m)
        await asyncio.sleep(self._rng.random() * self.max_processing)  # the "work"
        return self.end(m, began)

    def span_overlaps(self) -> list[str]:
        """Pairs of a key's recorded (begin, end) spans that overlap."""
        found = []
        for key, spans in self.spans.items():
            ordered = sorted(spans)
            for (_, end, a), (begin, _, b) in zip(ordered, ordered[1:], strict=False):
                if begin < end:
                    found.append(f"key {key}: {b} began before {a} ended")
        return found


async def http_consumer(
    client: AsyncClient, queue: str, group: str, check: KeyOrder, stop: Callable[[], bool]
) -> None:
    """Receives up to 10 at a time over HTTP, processes them one after another, then
    acks and nacks them."""
    while not stop():
        got = await client.receive(queue, group, max_messages=10, wait_seconds=0.5)
        acks, nacks = [], []
        for m in got:
            (acks if await check.process(m) else nacks).append(m.receipt or "")
        if acks:
            await client.ack(queue, group, acks)
        if nacks:
            await client.nack(queue, group, nacks)


async def stream_consumer(
    client: AsyncClient, queue: str, group: str, check: KeyOrder, stop: Callable[[], bool]
) -> None:
    """A consume stream with credit 10: processes what comes, settling each as it ends."""
    async with client.consumer(queue, group, credit=10) as stream:
        while not stop():
            for m in await stream.get_batch(10, timeout=0.5):
                if await check.process(m):
                    stream.ack(m)
                else:
                    stream.nack(m)
        await stream.flush()
