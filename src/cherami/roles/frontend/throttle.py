"""Publish limits and back-pressure (docs/api.md, "Throttling and back-pressure").

Checked by the process that appends a publish (the input host of a cluster; the node
itself on a single node), before anything of the batch is stored, so a refused batch
can be sent again without a duplicate:

- a queue's ``publish_rate`` / ``publish_bytes_rate`` (token buckets holding up to
  ``publish_burst`` / ``publish_bytes_burst``, one second's worth by default). An input
  host enforces the share of the queue's limit that its open plain extents of the queue
  are of all of them (the router and the producers' streams spread publishes over the
  extents' input hosts), so the hosts together hold the queue's limit;
- an API key's own limits (the auth file), over every queue the key publishes to
  through this process;
- a queue's ``max_backlog_bytes``: its unconsumed bytes (``Throttle.backlog_bytes``),
  measured at most once a second, plus the body bytes admitted here since.

A batch larger than a bucket holds passes when the bucket is full and leaves it in
debt, so any batch gets through and the long-run rate still holds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cherami.errors import BacklogFull, CheramiError, Throttled
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, SEALED, Extent, Queue, QueueConfig
from cherami.roles.frontend.auth import ApiKey
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.store import PLAIN

log = logging.getLogger("cherami.frontend.throttle")

CONFIG_REFRESH = 1.0  # a stream's queue limits are read again this often (PATCH applies)
SHARE_REFRESH = 2.0  # how often an input host counts its share of the queue's extents
BACKLOG_REFRESH = 1.0  # how often a queue's unconsumed bytes are measured
BACKLOG_RETRY = 1.0  # Retry-After of backlog_full: when the next measurement is due
MAX_RETRY = 3600.0  # the longest wait a refusal names (a tiny rate's would be years)


class TokenBucket:
    """``rate`` tokens a second, holding up to ``capacity`` (``burst``, or one second's
    worth when burst is 0)."""

    __slots__ = ("at", "capacity", "rate", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.capacity = burst or rate
        self.tokens = self.capacity
        self.at = time.monotonic()

    def configure(self, rate: float, burst: float) -> TokenBucket:
        capacity = burst or rate
        if (rate, capacity) != (self.rate, self.capacity):
            self._refill(time.monotonic())
            self.rate, self.capacity = rate, capacity
            self.tokens = min(self.tokens, capacity)
        return self

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` may be taken (0: now). A cost above the capacity
        needs a full bucket."""
        self._refill(now)
        need = min(cost, self.capacity)
        short = need - self.tokens
        return short / self.rate if short > 1e-6 else 0.0  # not a rounding error's wait

    def take(self, cost: float) -> None:
        self.tokens -= cost


@dataclass
class _Queue:
    created_at: float
    config: QueueConfig
    config_at: float = 0.0
    share: float = 1.0
    share_at: float = -SHARE_REFRESH
    backlog: int | None = None  # unconsumed bytes at the last measurement
    backlog_at: float = 0.0
    admitted: int = 0  # bytes admitted here since that measurement began
    measuring: asyncio.Lock = field(default_factory=asyncio.Lock)
    buckets: dict[str, TokenBucket] = field(default_factory=dict)


def _bucket(buckets: dict[str, TokenBucket], name: str, rate: float, burst: float) -> TokenBucket:
    bucket = buckets.get(name)
    if bucket is None:
        bucket = buckets[name] = TokenBucket(rate, burst)
    return bucket.configure(rate, burst)


def _costs(
    limits: QueueConfig | ApiKey, messages: int, size: int
) -> list[tuple[str, float, float, float]]:
    """The set limits of a queue or key: (name, rate, burst, what the batch costs)."""
    return [
        (name, rate, burst, cost)
        for name, rate, burst, cost in (
            ("publish_rate", limits.publish_rate, limits.publish_burst, messages),
            ("publish_bytes_rate", limits.publish_bytes_rate, limits.publish_bytes_burst, size),
        )
        if rate
    ]


class Throttle:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        host_id: str | None,
        refused: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self.metadata = metadata
        self.stores = stores
        self.host_id = host_id  # the input host in this process (its share of extents)
        self.refused = refused  # told (queue, code, messages) of each refused batch
        self._queues: dict[str, _Queue] = {}
        self._keys: dict[bytes, dict[str, TokenBucket]] = {}

    def forget(self, queue: str) -> None:
        """The queue was deleted: its limits' state goes."""
        self._queues.pop(queue, None)

    async def admit(
        self, queue: Queue, key: ApiKey | None, messages: int, size: int, fresh: bool
    ) -> None:
        """Take ``messages`` and ``size`` bytes from every limit that applies, or raise
        Throttled / BacklogFull (taking nothing). ``fresh``: ``queue`` was just read
        (an HTTP publish); otherwise (a stream's) its limits are read again once a
        second, so a PATCH applies to open streams too."""
        try:
            await self._admit(queue, key, messages, size, fresh)
        except Throttled as err:
            if self.refused is not None:
                self.refused(queue.name, err.code, messages)
            raise

    async def _admit(
        self, queue: Queue, key: ApiKey | None, messages: int, size: int, fresh: bool
    ) -> None:
        state = self._queues.get(queue.name)
        if state is None or state.created_at != queue.created_at:
            state = self._queues[queue.name] = _Queue(queue.created_at, queue.config)
        now = time.monotonic()
        if fresh:
            state.config, state.config_at = queue.config, now
        elif now - state.config_at >= CONFIG_REFRESH:
            await self._refresh_config(state, queue.name)
        config = state.config
        if config.max_backlog_bytes:
            backlog = await self._backlog(state, queue.name) + state.admitted
            if backlog > config.max_backlog_bytes:
                raise BacklogFull(
                    f"queue {queue.name} holds {backlog} unconsumed bytes, over its "
                    f"max_backlog_bytes ({config.max_backlog_bytes}); publishing resumes "
                    "as its consumers catch up",
                    retry_after=BACKLOG_RETRY,
                )
        limits: list[tuple[str, TokenBucket, float]] = []
        if config.publish_rate or config.publish_bytes_rate:
            share = await self._share(state, queue.name)
            for name, rate, burst, cost in _costs(config, messages, size):
                bucket = _bucket(state.buckets, name, rate * share, burst * share)
                limits.append((f"the {name} of queue {queue.name}", bucket, cost))
        if key is not None and (key.publish_rate or key.publish_bytes_rate):
            buckets = self._keys.setdefault(key.digest(), {})
            for name, rate, burst, cost in _costs(key, messages, size):
                bucket = _bucket(buckets, name, rate, burst)
                limits.append((f"the {name} of API key {key.name}", bucket, cost))
        if not limits:
            state.admitted += size
            return
        now = time.monotonic()
        wait, what, limit = max((b.wait(c, now), what, b.rate) for what, b, c in limits)
        if wait > 0:
            raise Throttled(
                f"over {what} ({limit:g}/s here): send again in {wait:.3f} s",
                retry_after=min(wait, MAX_RETRY),
            )
        for _, bucket, cost in limits:
            bucket.take(cost)
        state.admitted += size

    async def _refresh_config(self, state: _Queue, name: str) -> None:
        state.config_at = time.monotonic()  # one read at a time; the others use the last
        try:
            queue = await self.metadata.get_queue(name)
        except CheramiError:
            return  # deleted (the stream is closed soon) or unreachable: keep the last
        if queue.created_at == state.created_at:
            state.config = queue.config

    async def _share(self, state: _Queue, name: str) -> float:
        """The part of the queue's open plain extents that this input host holds."""
        now = time.monotonic()
        if now - state.share_at < SHARE_REFRESH:
            return state.share
        state.share_at = now
        try:
            extents = await self.metadata.list_extents(name, (OPEN,))
        except CheramiError:
            return state.share
        plain = [e for e in extents if e.kind == PLAIN]
        mine = sum(e.input_host == self.host_id for e in plain)
        state.share = min(1.0, max(mine, 1) / max(len(plain), 1))
        return state.share

    async def _backlog(self, state: _Queue, name: str) -> int:
        now = time.monotonic()
        if state.backlog is not None and now - state.backlog_at < BACKLOG_REFRESH:
            return state.backlog
        if state.backlog is not None and state.measuring.locked():
            return state.backlog  # being measured: the last value meanwhile
        async with state.measuring:
            if state.backlog is None or time.monotonic() - state.backlog_at >= BACKLOG_REFRESH:
                # what is admitted while it runs may be counted twice: never too little
                before = state.admitted
                try:
                    state.backlog = await self.backlog_bytes(name)
                    state.admitted -= before
                except CheramiError as err:
                    log.warning("queue %s: backlog not measured: %s", name, err)
                    if state.backlog is None:
                        state.backlog = 0
                state.backlog_at = time.monotonic()
        return state.backlog

    async def backlog_bytes(self, name: str) -> int:
        """The queue's unconsumed bytes: of each extent not yet deleted (open, failing or
        sealed, plain or timer), the part the slowest consumer group has not acked,
        ``bytes * (count - acked) / count`` with the group's ack level of the extent
        (every message of it when the queue has no group: nothing consumes them)."""
        extents = await self.metadata.list_extents(name, (OPEN, FAILING, SEALED))
        if not extents:
            return 0
        groups = await self.metadata.list_groups(name)
        acked: dict[str, list[int]] = {}
        for group in groups:
            for level in await self.metadata.get_ack_levels(name, group.name):
                acked.setdefault(level.extent, []).append(level.acked)

        async def unconsumed(extent: Extent) -> int:
            info = await self.stores.info(extent)
            if info.count <= 0:
                return 0
            levels = acked.get(extent.id, [])
            done = min(levels) if groups and len(levels) == len(groups) else 0
            return info.bytes * max(0, info.count - done) // info.count

        return sum(await asyncio.gather(*(unconsumed(e) for e in extents)))
