"""The streaming publisher (docs/protocol.md): batches merged into frames, spread over
a stream to each input host the queue's route lists, sent again when a stream ends."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from cherami.client.links import (
    Patience,
    connect,
    deleted,
    dial,
    incoming,
    keep,
    log,
    routed,
)
from cherami.client.models import OutgoingMessage, message_list
from cherami.errors import CheramiError, NotFound, QueueNotFound, Unavailable, error_from_code
from cherami.wire import stream as f

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient


def _out(m: OutgoingMessage | bytes | str) -> f.OutMessage:
    if isinstance(m, bytes):
        return f.OutMessage(m)
    if isinstance(m, str):
        return f.OutMessage(m.encode())
    body = m.body.encode() if isinstance(m.body, str) else m.body
    delay = None if m.delay_seconds is None else int(m.delay_seconds * 1000)
    return f.OutMessage(body, m.attributes, delay, m.dedup_id, m.key, *m.stream_ttl())


MAX_FRAME_MESSAGES = 1000  # the server's limit per publish frame
# merged frames stop growing here: a few frames in flight keep the stores' group commit
# busy while the next frame travels (measured: 400 beat 100, 200 and 1,000 here)
MERGE_MESSAGES = 400
MAX_FRAME_BYTES = 1 << 20
# a refusal of one caller's batch: when it came in a merged frame, each batch is retried alone
_PER_BATCH_CODES = frozenset({"invalid_request", "message_too_large"})


class _Batch:
    """One caller's ``send``: its messages and the future of its ids."""

    __slots__ = ("future", "messages", "size")

    def __init__(self, messages: list[f.OutMessage], future: asyncio.Future[list[str]]) -> None:
        self.messages = messages
        self.future = future
        self.size = sum(len(m.body) for m in messages)


ROUTE_REFRESH = 10.0  # seconds between route reads, unless the routing call says otherwise
# a stream straight to an input host pings it this often, so a paused or cut-off host is
# given up on (and its unacked frames go to the others) within 3 s, as a frontend does
DIRECT_HEARTBEAT = 2.0


def least_outstanding(loads: Sequence[int], turn: int) -> int:
    """Which stream takes the next frame: the index of the smallest load (messages sent
    on it and not answered yet); ties go in turn, counting from ``turn``."""
    n = len(loads)
    return min(range(n), key=lambda i: (loads[i], (i - turn) % n))


class _Link:
    """One publish stream: to an input host the route lists, or (address "") through the
    client's own URL."""

    __slots__ = ("address", "outstanding", "ws")

    def __init__(self, address: str, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.address = address
        self.ws = ws
        self.outstanding = 0  # messages sent on it and not answered yet


class _Frame:
    __slots__ = ("batches", "link", "not_before", "publish", "throttled_since")

    def __init__(self, publish: f.Publish, batches: list[_Batch]) -> None:
        self.publish = publish
        self.batches = batches
        self.link: _Link | None = None  # the stream it went on; None: it waits for one
        self.not_before = 0.0  # throttled: not sent again before this (loop time)
        self.throttled_since: float | None = None  # when the server first throttled it


class Publisher:
    """Pipelined streaming publisher: up to ``max_in_flight`` batches await their acks at
    once. A batch's future resolves to its message ids once every message is durable.

    It asks which input hosts hold the queue's open extents (the routing call,
    ``GET /v1/queues/{queue}/publishers``), opens a stream to each, and sends every frame
    on the stream with the fewest unacked messages. With no host listed (a single node)
    or none taking a stream, it publishes through the client's URL. The route is read
    again every ``refresh_seconds`` it gives and whenever a stream ends.

    Batches sent in the same event-loop turn (several tasks publishing at once) travel
    in one frame of up to 400 messages / 1 MiB (a batch larger than that goes in a frame
    of its own, up to the server's 1,000), which the server appends and fsyncs as one;
    each caller still gets exactly its own ids. If the server refuses a merged frame
    for one batch's content (``invalid_request``, ``message_too_large``), every batch of
    it is sent again alone, so only the faulty one fails.

    If a stream ends (its input host moved the queue's extents, stopped or died), its
    unacked batches are sent again on the other streams, or on new ones for up to
    RECONNECT_PATIENCE seconds (so a message may be stored twice, never lost)."""

    def __init__(self, client: AsyncClient, path: str, max_in_flight: int) -> None:
        self._client = client
        self._path = path
        self._queue_path = path.rsplit("/", 1)[0]
        self._slots = asyncio.Semaphore(max_in_flight)
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        self._pending: dict[int, _Frame] = {}
        self._queued: list[_Batch] = []
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._first_error: BaseException | None = None  # since the last flush()
        self._links: dict[str, _Link] = {}  # the streams that take frames, by address
        self._retiring: set[_Link] = set()  # no longer routed to: closed once answered
        self._routing = asyncio.Lock()
        self._opening = asyncio.Lock()
        self._refresh = ROUTE_REFRESH
        self._refresher: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._closed = False
        self._gone: CheramiError | None = None  # deleted, given up or closed: sends fail
        self._created_at: str | None = None  # which queue of that name this publishes to
        self.failovers = 0  # streams that ended under it; their unacked frames went again
        self.throttled = 0  # frames the server throttled (each went again after its wait)

    @property
    def hosts(self) -> list[str]:
        """The input hosts it publishes to now ("": through the client's URL)."""
        return sorted(self._links)

    @property
    def outstanding(self) -> dict[str, int]:
        """Messages sent and not acked yet, per stream (by the address of ``hosts``)."""
        return {address: link.outstanding for address, link in self._links.items()}

    @property
    def _ws(self) -> aiohttp.ClientWebSocketResponse | None:
        """Its first open stream (the only one on a single node)."""
        links = self._usable()
        return links[0].ws if links else None

    async def __aenter__(self) -> Publisher:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect to the queue's input hosts. ``async with`` opens it; so does the first
        ``send`` or ``publish`` of a publisher used without it (its batches waited
        forever for a stream that was never opened). Call ``close`` when done."""
        async with self._opening:
            if self._refresher is not None:
                return
            if self._closed:
                raise Unavailable("publisher closed")
            self._created_at = await self._incarnation()
            await self._reroute(check=False)
            self._refresher = self._spawn(self._refresh_loop(), "route refresh")

    async def _incarnation(self) -> str:
        queue = await self._client.request("GET", self._queue_path)
        return str(queue["created_at"])

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        return keep(self._tasks, work, f"publisher: {what}")

    # routing
    async def _route(self) -> list[str]:
        """The input hosts the routing call lists: none on a single node, or when it
        cannot answer."""
        hosts, refresh = await routed(self._client, self._queue_path + "/publishers", "input_hosts")
        if refresh is not None:
            self._refresh = max(1.0, refresh)
        return hosts

    async def _reroute(self, check: bool = True) -> None:
        """Open a stream to each listed input host not connected yet and retire those to
        hosts no longer listed; with no listed host taking one, publish through the
        client's URL. New streams take frames only once the queue is known to be the one
        this publisher was opened for (``check``)."""
        async with self._routing:
            route = await self._route()
            dialed = await asyncio.gather(*(self._dial(a) for a in route if a not in self._links))
            new = [link for link in dialed if link is not None]
            try:
                if not new and not self._usable():
                    new.append(_Link("", await connect(self._client, self._path)))
                if new and check:
                    await self._same_queue()
            except BaseException:
                await asyncio.gather(*(link.ws.close() for link in new), return_exceptions=True)
                raise
            for link in new:
                self._links[link.address] = link
                self._spawn(self._read(link), f"publish stream to {link.address or 'URL'}")
            if any(address in self._links for address in route):
                for address in [a for a in self._links if a not in route]:
                    self._retire(self._links.pop(address))

    async def _dial(self, address: str) -> _Link | None:
        """A stream straight to a listed input host; None when it does not take one."""
        ws = await dial(self._client, address, self._path, DIRECT_HEARTBEAT, "publisher")
        return None if ws is None else _Link(address, ws)

    async def _same_queue(self) -> None:
        if await self._incarnation() != self._created_at:
            raise QueueNotFound("the queue was deleted and made again while publishing")

    def _retire(self, link: _Link) -> None:
        """No new frames go on the stream; it is closed once its frames are answered."""
        self._retiring.add(link)
        if link.outstanding == 0:
            self._spawn(self._close_link(link), "closing a retired stream")

    async def _close_link(self, link: _Link) -> None:
        await link.ws.close()

    def _usable(self) -> list[_Link]:
        return [link for link in self._links.values() if not link.ws.closed]

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            try:
                await self._reroute()
            except CheramiError as err:
                log.warning("publisher: route refresh failed: %s", err)
            self._resend()

    # streams
    async def _read(self, link: _Link) -> None:
        async for data in incoming(link.ws):
            try:
                frame = f.decode_server(data)
            except msgspec.DecodeError as err:  # its frames go again on another stream
                log.warning("publisher: bad frame from %s: %s", link.address or "URL", err)
                await link.ws.close()
                continue
            if isinstance(frame, f.Published | f.Error):
                entry = self._pending.get(frame.id)
                if entry is not None and entry.link is link:
                    del self._pending[frame.id]
                    link.outstanding -= len(entry.publish.messages)
                    self._settle(entry, frame)
                    if link.outstanding == 0 and link in self._retiring:
                        self._spawn(self._close_link(link), "closing a retired stream")
            elif isinstance(frame, f.Throttled):
                entry = self._pending.get(frame.id)
                if entry is not None and entry.link is link:
                    link.outstanding -= len(entry.publish.messages)
                    self._throttled(entry, frame)
                    if link.outstanding == 0 and link in self._retiring:
                        self._spawn(self._close_link(link), "closing a retired stream")
        self._lost(link)

    def _throttled(self, entry: _Frame, frame: f.Throttled) -> None:
        """The server refused the frame for a publish limit or a full backlog, storing
        nothing of it: it goes again after the wait the server names (plus up to 10%),
        for up to the client's ``throttled_retry_seconds``; then its batches fail."""
        self.throttled += 1
        now = asyncio.get_running_loop().time()
        if entry.throttled_since is None:
            entry.throttled_since = now
        wait = frame.retry_ms / 1000 * (1 + 0.1 * random.random())
        if now + wait - entry.throttled_since > self._client.throttled_retry_seconds:
            del self._pending[frame.id]
            self._settle(entry, f.Error(frame.id, frame.code, frame.message))
            return
        entry.link = None
        entry.not_before = now + wait
        self._spawn(self._resend_after(wait), "sending a throttled frame again")

    async def _resend_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self._resend()

    def _lost(self, link: _Link) -> None:
        """A stream ended: the frames it had not answered wait for another one."""
        if self._links.get(link.address) is link:
            del self._links[link.address]
        retired = link in self._retiring
        self._retiring.discard(link)
        link.outstanding = 0
        orphans = [entry for entry in self._pending.values() if entry.link is link]
        for entry in orphans:
            entry.link = None
        if deleted(link.ws):  # the queue is gone: never resend into a queue of the same name
            self._fail(QueueNotFound(f"queue deleted while publishing: {link.ws.close_code}"))
            return
        if self._closed or (retired and not orphans):
            return
        if not retired:
            self.failovers += 1
            code = getattr(link.ws, "sent_code", None) or link.ws.close_code
            log.info("publisher: stream to %s ended (%s); %d frames go again",
                     link.address or self._client.url, code, len(orphans))  # fmt: skip
        if self._recovery is None or self._recovery.done():
            self._recovery = self._spawn(self._recover(), "recovery")

    async def _recover(self) -> None:
        """Send the frames of an ended stream on the other streams at once and read the
        route again (the queue may have extents elsewhere now). With no stream left,
        connect again with backoff (0.1 s doubling to 2 s) for up to RECONNECT_PATIENCE
        seconds; a queue deleted meanwhile (or made again) fails them QueueNotFound."""
        patience = Patience()
        while not self._closed and self._gone is None:
            self._resend()
            if not self._usable():
                await patience.pause()
            try:
                await self._reroute()
            except NotFound as err:
                self._fail(err)
                return
            except CheramiError as err:
                if not self._usable() and patience.over:
                    self._fail(Unavailable(f"publisher connection lost: {err}"))
                    return
                log.warning("publisher reconnect failed: %s", err)
            self._resend()
            if self._usable():
                return

    def _resend(self) -> None:
        """Send the frames that wait for a stream (theirs ended, or their throttling
        wait is over) on the open ones."""
        now = asyncio.get_running_loop().time()
        waiting = [e for e in self._pending.values() if e.link is None and e.not_before <= now]
        sent = self._assign(waiting) if waiting else []
        if sent:
            self._spawn(self._send(sent), "resending")

    def _assign(self, frames: list[_Frame]) -> list[tuple[_Frame, _Link]]:
        """Give each frame the open stream with the fewest unacked messages; frames that
        find none wait (link None) for one to open."""
        links = self._usable()
        if not links:
            return []
        assigned = []
        for entry in frames:
            link = links[least_outstanding([k.outstanding for k in links], next(self._turn))]
            entry.link = link
            link.outstanding += len(entry.publish.messages)
            assigned.append((entry, link))
        return assigned

    async def _send(self, assigned: list[tuple[_Frame, _Link]]) -> None:
        for entry, link in assigned:
            if entry.link is not link or link.ws.closed:
                continue  # its stream ended: the frame goes again on another one
            try:
                await link.ws.send_bytes(f.encode(entry.publish))
            except (ConnectionError, aiohttp.ClientError):
                continue  # the stream's reader notices, and the frame goes again

    def _settle(self, entry: _Frame, frame: f.Published | f.Error) -> None:
        batches = entry.batches
        if isinstance(frame, f.Error) and len(batches) > 1 and frame.code in _PER_BATCH_CODES:
            for batch in batches:  # find out which batch it was: each goes again, alone
                self._queue_alone(batch)
            return
        start = 0
        for batch in batches:
            self._slots.release()
            count = len(batch.messages)
            if not batch.future.done():
                if isinstance(frame, f.Published):
                    batch.future.set_result(frame.ids[start : start + count])
                else:
                    self._failed(batch, error_from_code(frame.code, frame.message))
            start += count

    def _fail(self, error: CheramiError) -> None:
        self._gone = error
        pending, self._pending = self._pending, {}
        queued, self._queued = self._queued, []
        batches = [b for entry in pending.values() for b in entry.batches] + queued
        for batch in batches:
            self._slots.release()
            if not batch.future.done():
                self._failed(batch, error)

    def _failed(self, batch: _Batch, error: BaseException) -> None:
        batch.future.set_exception(error)
        batch.future.exception()  # flush() reports it: no "never retrieved" warning
        if self._first_error is None:
            self._first_error = error

    async def send(
        self, messages: Iterable[OutgoingMessage | bytes | str]
    ) -> asyncio.Future[list[str]]:
        """Send one batch; returns a future of its ids (waits while too many are in flight).
        Opens the publisher if nothing did; once it is closed, the future fails at once."""
        outs = [_out(m) for m in message_list(messages)]
        if self._refresher is None and not self._closed and self._gone is None:
            await self.open()
        await self._slots.acquire()
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        batch = _Batch(outs, future)
        if self._gone is not None:  # the queue was deleted, or this publisher gave up
            self._slots.release()
            self._failed(batch, self._gone)
            return future
        self._queued.append(batch)
        if self._flusher is None:
            # runs after the tasks already woken in this turn: their batches join the frame
            self._flusher = asyncio.create_task(self._flush_queued())
        return future

    def _queue_alone(self, batch: _Batch) -> None:
        entry = _Frame(f.Publish(next(self._ids), batch.messages), [batch])
        self._pending[entry.publish.id] = entry
        sent = self._assign([entry])
        if sent:
            self._spawn(self._send(sent), "sending a batch alone")

    async def _flush_queued(self) -> None:
        try:
            while self._queued:
                batches, self._queued = self._queued, []
                frames = self._pack(batches)
                for entry in frames:
                    self._pending[entry.publish.id] = entry
                await self._send(self._assign(frames))
        finally:
            self._flusher = None

    def _pack(self, batches: list[_Batch]) -> list[_Frame]:
        frames: list[_Frame] = []
        group: list[_Batch] = []
        count = size = 0
        for batch in batches:
            n = len(batch.messages)
            if group and (count + n > MERGE_MESSAGES or size + batch.size > MAX_FRAME_BYTES):
                frames.append(self._frame(group))
                group, count, size = [], 0, 0
            group.append(batch)
            count += n
            size += batch.size
        if group:
            frames.append(self._frame(group))
        return frames

    def _frame(self, batches: list[_Batch]) -> _Frame:
        messages = (
            batches[0].messages
            if len(batches) == 1
            else [m for batch in batches for m in batch.messages]
        )
        return _Frame(f.Publish(next(self._ids), messages), batches)

    async def publish(self, messages: Iterable[OutgoingMessage | bytes | str]) -> list[str]:
        return await (await self.send(messages))

    async def flush(self) -> None:
        """Wait until every batch sent so far is acked or refused. If any batch failed
        since the last flush (even one whose future nobody awaited), raise the first
        such error, so a bulk publish that only calls ``send`` and ``flush`` cannot lose
        a refused batch silently."""
        futures = [b.future for b in self._queued]
        futures += [b.future for entry in self._pending.values() for b in entry.batches]
        await asyncio.gather(*futures, return_exceptions=True)
        error, self._first_error = self._first_error, None
        if error is not None:
            raise error

    async def close(self) -> None:
        self._closed = True
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        for task in (self._refresher, self._recovery):
            if task is not None:
                task.cancel()
        links = [*self._links.values(), *self._retiring]
        await asyncio.gather(*(link.ws.close() for link in links), return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail(Unavailable("publisher closed"))
