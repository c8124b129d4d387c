"""A checker of ordering keys (docs/api.md, "Ordering keys") for tests on real
processes: competing consumers, HTTP and stream, that record when they begin and end
each message, nack some, and report per key the order of first successful processing
and any two messages of a key in hand at once. A fault test bumps ``epoch`` when it
kills something: two messages of a key in hand at once where one was received before
the failure and the other after it is a redelivery after a failure (reported, in
``after_failure``), not a violation."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received
from cherami.errors import CheramiError


@dataclass
class KeyOrder:
    """What the consumers saw. ``poison`` bodies are always nacked; any other message is
    nacked with probability ``nack_rate`` on its first delivery only (so none of them
    reaches the DLQ)."""

    nack_rate: float = 0.1
    poison: frozenset[str] = frozenset()
    max_processing: float = 0.002  # seconds a message takes at most (uniformly random)
    acked: dict[str | None, list[str]] = field(default_factory=dict)  # key -> bodies acked
    spans: dict[str, list[tuple[float, float, str, int]]] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)  # two of a key in hand at once
    redelivered_after_ack: list[str] = field(default_factory=list)
    after_failure: list[str] = field(default_factory=list)
    epoch = 0
    nacks = 0
    deliveries = 0
    errors = 0  # calls that failed (while something was down)
    _busy: dict[str, tuple[str, int]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=lambda: random.Random(7))

    def begin(self, m: Received, epoch: int) -> None:
        self.deliveries += 1
        if m.key is None:
            return
        other = self._busy.get(m.key)
        if other is not None:
            said = f"key {m.key}: {m.text} began while {other[0]} was in hand"
            (self.overlaps if other[1] == epoch else self.after_failure).append(said)
        self._busy[m.key] = (m.text, epoch)

    def end(self, m: Received, began: float, epoch: int) -> bool:
        """The message is processed: True to ack it, False to nack it."""
        ok = m.text not in self.poison and not (
            m.delivery_count == 1 and self._rng.random() < self.nack_rate
        )
        if m.key is not None:
            self._busy.pop(m.key, None)
            self.spans.setdefault(m.key, []).append((began, time.monotonic(), m.text, epoch))
        if ok:
            done = self.acked.setdefault(m.key, [])
            if m.text in done:
                self.redelivered_after_ack.append(m.text)
            else:
                done.append(m.text)
        else:
            self.nacks += 1
        return ok

    async def process(self, m: Received, epoch: int) -> bool:
        """``epoch``: the checker's when ``m`` was received."""
        began = time.monotonic()
        self.begin(m, epoch)
        await asyncio.sleep(self._rng.random() * self.max_processing)  # the "work"
        return self.end(m, began, epoch)

    def span_overlaps(self) -> list[str]:
        """Pairs of a key's recorded (begin, end) spans that overlap (both received in
        the same epoch)."""
        found = []
        for key, spans in self.spans.items():
            ordered = sorted(spans)
            for (_, end, a, ea), (begin, _, b, eb) in zip(ordered, ordered[1:], strict=False):
                if begin < end and ea == eb:
                    found.append(f"key {key}: {b} began before {a} ended")
        return found

    def total_acked(self) -> int:
        return sum(map(len, self.acked.values()))


async def http_consumer(
    client: AsyncClient, queue: str, group: str, check: KeyOrder, stop: Callable[[], bool]
) -> None:
    """Receives up to 10 at a time over HTTP, processes them one after another, then
    acks and nacks them; a failed call (the server down) is counted and tried again."""
    while not stop():
        try:
            got = await client.receive(queue, group, max_messages=10, wait_seconds=0.5)
            epoch = check.epoch
            acks, nacks = [], []
            for m in got:
                (acks if await check.process(m, epoch) else nacks).append(m.receipt or "")
            if acks:
                await client.ack(queue, group, acks)
            if nacks:
                await client.nack(queue, group, nacks)
        except (CheramiError, aiohttp.ClientError, OSError):
            check.errors += 1
            await asyncio.sleep(0.2)


async def stream_consumer(
    client: AsyncClient, queue: str, group: str, check: KeyOrder, stop: Callable[[], bool]
) -> None:
    """A consume stream with credit 10: processes what comes, settling each as it ends;
    opened again when it fails."""
    while not stop():
        try:
            async with client.consumer(queue, group, credit=10) as stream:
                while not stop():
                    got = await stream.get_batch(10, timeout=0.5)
                    epoch = check.epoch
                    for m in got:
                        if await check.process(m, epoch):
                            stream.ack(m)
                        else:
                            stream.nack(m)
                await stream.flush()
        except (CheramiError, aiohttp.ClientError, OSError):
            check.errors += 1
            await asyncio.sleep(0.2)
