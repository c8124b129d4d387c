"""Streaming publish and consume over WebSocket (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from cherami.client.models import OutgoingMessage, Received, message_list
from cherami.errors import (
    CheramiError,
    GroupNotFound,
    InvalidRequest,
    NotFound,
    QueueNotFound,
    Unavailable,
    error_from_code,
)
from cherami.wire import close
from cherami.wire import stream as f


class _Deliver(msgspec.Struct, array_like=True, tag="deliver", frozen=True, gc=False):
    """``f.Deliver`` as a consumer decodes it: straight into what user code gets."""

    messages: list[Received]


_consumed_decoder: msgspec.msgpack.Decoder[
    _Deliver | f.Published | f.Settled | f.Returned | f.Error
] = msgspec.msgpack.Decoder(_Deliver | f.Published | f.Settled | f.Returned | f.Error)
_decode_consumed = _consumed_decoder.decode

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient

log = logging.getLogger("cherami.client.stream")

WS_MAX_MSG = 64 << 20
RECONNECT_PATIENCE = 120.0  # seconds a lost stream keeps trying to reconnect
HEARTBEAT = 5.0  # ping the server this often; a server silent for 1.5x this is lost


async def _connect(client: AsyncClient, path: str) -> aiohttp.ClientWebSocketResponse:
    try:
        return await client.session.ws_connect(
            client.ws_url(path), max_msg_size=WS_MAX_MSG, heartbeat=HEARTBEAT, autoping=True
        )
    except aiohttp.WSServerHandshakeError as err:
        if 400 <= err.status < 500:
            # the handshake carries no error body: ask the resource for its exact error
            resource = await client.request("GET", path.rsplit("/", 1)[0])
            if isinstance(resource, dict) and resource.get("type") == "stream":
                raise InvalidRequest(
                    f"group {resource.get('name')} is a stream-mode group: it is read by "
                    "offsets (the Spark source), not by a consume stream"
                ) from None
        raise error_from_code(_code_for(err.status), err.message) from None
    except (aiohttp.ClientError, OSError) as err:
        raise Unavailable(f"{client.url}: {err}") from err


async def _reconnect(client: AsyncClient, path: str, what: str) -> aiohttp.ClientWebSocketResponse:
    """Connect again with backoff (0.1 s doubling to 2 s) for up to RECONNECT_PATIENCE
    seconds. A queue or group that no longer exists fails at once (NotFound)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + RECONNECT_PATIENCE
    attempt = 0
    while True:
        await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        attempt += 1
        try:
            return await _connect(client, path)
        except NotFound:
            raise
        except CheramiError as err:
            if loop.time() >= give_up:
                raise Unavailable(f"{what} connection lost: {err}") from err
            log.warning("%s reconnect failed: %s", what, err)


async def _messages(ws: aiohttp.ClientWebSocketResponse) -> AsyncIterator[bytes]:
    """The binary messages of a stream until it closes. The close code the server sent
    is kept as ``ws.sent_code`` (aiohttp reports 1006 in ``close_code`` when the server
    drops the connection right after its close frame, before our reply)."""
    ws.sent_code = None  # type: ignore[attr-defined]
    while True:
        msg = await ws.receive()
        if msg.type == aiohttp.WSMsgType.BINARY:
            yield msg.data
        elif msg.type == aiohttp.WSMsgType.CLOSE:
            ws.sent_code = msg.data  # type: ignore[attr-defined]
        elif msg.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                          aiohttp.WSMsgType.ERROR):  # fmt: skip
            return


async def _dial(
    client: AsyncClient, address: str, path: str, heartbeat: float, what: str
) -> aiohttp.ClientWebSocketResponse | None:
    """A stream straight to a host the routing call listed; None when it does not take
    one within DIAL_TIMEOUT."""
    scheme = client.ws_url("").split(":", 1)[0]
    try:
        async with asyncio.timeout(DIAL_TIMEOUT):
            return await client.session.ws_connect(
                f"{scheme}://{address}{path}", max_msg_size=WS_MAX_MSG, heartbeat=heartbeat,
                autoping=True,
            )  # fmt: skip
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        log.info("%s: %s takes no stream: %s", what, address, err)
        return None


def _deleted(ws: aiohttp.ClientWebSocketResponse) -> bool:
    return getattr(ws, "sent_code", None) == close.DELETED or ws.close_code == close.DELETED


def _code_for(status: int) -> str:
    return {400: "invalid_request", 401: "unauthorized", 403: "forbidden",
            404: "queue_not_found", 503: "unavailable"}.get(status, "internal")  # fmt: skip


def _out(m: OutgoingMessage | bytes | str) -> f.OutMessage:
    if isinstance(m, bytes):
        return f.OutMessage(m)
    if isinstance(m, str):
        return f.OutMessage(m.encode())
    body = m.body.encode() if isinstance(m.body, str) else m.body
    delay = None if m.delay_seconds is None else int(m.delay_seconds * 1000)
    return f.OutMessage(body, m.attributes, delay, m.dedup_id)


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
DIAL_TIMEOUT = 3.0  # a listed host that has not taken the upgrade by then is skipped
# a stream straight to an input host pings it this often, so a paused or cut-off host is
# given up on (and its unacked frames go to the others) within 3 s, as a frontend does
DIRECT_HEARTBEAT = 2.0


def _keep(
    tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None], what: str
) -> asyncio.Task[None]:
    """Run ``work`` as a task held in ``tasks`` until it ends; a failure is logged."""
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(functools.partial(_forget, tasks, what))
    return task


def _forget(tasks: set[asyncio.Task[None]], what: str, task: asyncio.Task[None]) -> None:
    tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", what, exc_info=task.exception())


async def _routed(client: AsyncClient, path: str, field: str) -> tuple[list[str], float | None]:
    """The addresses a routing call at ``path`` lists (its ``field``) and the
    ``refresh_seconds`` it gives; ([], None) when it cannot answer (a metadata outage, a
    server without the call). A queue or group that does not exist raises NotFound."""
    try:
        body = await client.request("GET", path)
    except (QueueNotFound, GroupNotFound):
        raise
    except CheramiError as err:
        log.info("no route at %s: %s", path, err)
        return [], None
    try:
        return [str(h["address"]) for h in body[field]], float(body["refresh_seconds"])
    except (KeyError, TypeError, ValueError):
        log.warning("a route it cannot read at %s: %r", path, body)
        return [], None


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
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _open(self) -> None:
        self._created_at = await self._incarnation()
        await self._reroute(check=False)
        self._refresher = self._spawn(self._refresh_loop(), "route refresh")

    async def _incarnation(self) -> str:
        queue = await self._client.request("GET", self._queue_path)
        return str(queue["created_at"])

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        return _keep(self._tasks, work, f"publisher: {what}")

    # routing
    async def _route(self) -> list[str]:
        """The input hosts the routing call lists: none on a single node, or when it
        cannot answer."""
        hosts, refresh = await _routed(
            self._client, self._queue_path + "/publishers", "input_hosts"
        )
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
                    new.append(_Link("", await _connect(self._client, self._path)))
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
        ws = await _dial(self._client, address, self._path, DIRECT_HEARTBEAT, "publisher")
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
        async for data in _messages(link.ws):
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
        if _deleted(link.ws):  # the queue is gone: never resend into a queue of the same name
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
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RECONNECT_PATIENCE
        attempt = 0
        while not self._closed and self._gone is None:
            self._resend()
            if not self._usable():
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
                attempt += 1
            try:
                await self._reroute()
            except NotFound as err:
                self._fail(err)
                return
            except CheramiError as err:
                if not self._usable() and loop.time() >= give_up:
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
        """Send one batch; returns a future of its ids (waits while too many are in flight)."""
        outs = [_out(m) for m in message_list(messages)]
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


CONSUMER_ROUTE_REFRESH = 10.0  # unless the routing call says otherwise
REDIAL_PAUSE = 0.5  # after a stream ended, the route is read again this much later


class _Conn:
    """One consume stream: straight to an output host the route lists, or (address "")
    through the client's own URL."""

    __slots__ = ("acks", "address", "granted", "lost", "reclaiming", "ws")

    def __init__(self, address: str, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.address = address
        self.ws = ws
        self.granted = 0  # credit given on it and not returned: server credit + held here
        self.reclaiming = False  # a negative credit is out; its `returned` answer is not in
        self.acks: list[int] = []
        self.lost = False


class StreamConsumer:
    """Credit-based streaming consumer. Iterate to get messages; settle each with
    ``ack``/``nack``. Acks are sent in batches; credit returns as messages settle, so at
    most ``credit`` messages are held by this consumer at once.

    A cluster spreads a group over its output hosts per extent: the consumer asks which
    output hosts serve the group (the routing call, ``GET .../groups/{group}/consumers``),
    opens a stream straight to each, splits its credit over them, and settles each
    message on the stream that delivered it. The route is read again every
    ``refresh_seconds`` it gives and whenever a stream ends (a reconfigure close, a lost
    host). With no host listed (a single node) it consumes through the client's URL. A
    stream that ends takes what it held with it (the server delivers those again); the
    handles of its messages go void. With no stream left it reconnects for up to
    RECONNECT_PATIENCE seconds; a deleted group or queue fails it with NotFound."""

    def __init__(self, client: AsyncClient, path: str, credit: int) -> None:
        self._client = client
        self._path = path
        self._group_path = path.rsplit("/", 1)[0]
        self._credit = credit
        self._conns: dict[str, _Conn] = {}  # by address
        self._expected = 0  # streams the last route listed (credit is split over them)
        self._buffer: deque[Received] = deque()
        self._via: dict[str, tuple[_Conn, int | None]] = {}  # message id -> stream, handle
        self._arrived = asyncio.Event()
        self._routing = asyncio.Lock()
        self._refresh = CONSUMER_ROUTE_REFRESH
        self._reroute_soon = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False
        self._gone: CheramiError | None = None  # the group or queue was deleted
        self.lost = asyncio.Event()  # set from a stream's end until the route is read again

    @property
    def hosts(self) -> list[str]:
        """The output hosts it consumes from now ("": through the client's URL)."""
        return sorted(self._conns)

    async def __aenter__(self) -> StreamConsumer:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect and start sending settlements. ``async with`` opens it; so does the
        first ``get`` or iteration of a consumer used without it (its acks were never
        sent then, and every message came back after its visibility timeout)."""
        if self._flusher is not None:
            return
        await self._reroute()
        self._flusher = self._spawn(self._flush_loop(), "consumer flush")
        self._refresher = self._spawn(self._refresh_loop(), "consumer route refresh")

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))
        return task

    def _task_done(self, what: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("consumer: %s failed", what, exc_info=task.exception())

    # routing
    async def _route(self) -> list[str]:
        """The output hosts the routing call lists: none on a single node, or when it
        cannot answer (a metadata outage, a server without the call)."""
        try:
            body = await self._client.request("GET", self._group_path + "/consumers")
        except NotFound:
            raise
        except CheramiError as err:
            log.info("consumer: no route for %s: %s", self._group_path, err)
            return []
        self._refresh = max(1.0, float(body.get("refresh_seconds") or CONSUMER_ROUTE_REFRESH))
        return [str(host["address"]) for host in body.get("output_hosts", [])]

    async def _reroute(self) -> None:
        """Open a stream to each listed output host not connected yet; with none
        listed or none taking one, consume through the client's URL."""
        async with self._routing:
            if self._closed:
                return
            route = await self._route()
            self._expected = len(route)
            dialed = await asyncio.gather(*(self._dial(a) for a in route if a not in self._conns))
            new = [conn for conn in dialed if conn is not None]
            if not new and not self._conns:
                new.append(_Conn("", await _connect(self._client, self._path)))
            for conn in new:
                self._conns[conn.address] = conn
                self._spawn(self._read(conn), f"consume stream from {conn.address or 'URL'}")
            through_url = self._conns.get("")
            if through_url is not None and len(self._conns) > 1:  # direct streams took over
                self._drop(through_url)
                await through_url.ws.close()
            if self._conns:
                self.lost.clear()
            await self._grant()

    async def _dial(self, address: str) -> _Conn | None:
        """A stream straight to a listed output host; None when it does not take one."""
        ws = await _dial(self._client, address, self._path + "?direct=1", HEARTBEAT, "consumer")
        return None if ws is None else _Conn(address, ws)

    async def _refresh_loop(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh):
                    await self._reroute_soon.wait()
            if self._reroute_soon.is_set():
                self._reroute_soon.clear()
                await asyncio.sleep(REDIAL_PAUSE)
            if self._closed or not self._conns:  # with none left, get() reconnects
                continue
            try:
                await self._reroute()
            except NotFound as err:
                self._gone = err
                self._arrived.set()
            except CheramiError as err:
                log.info("consumer: route refresh failed: %s", err)

    async def _reopen(self) -> None:
        """No stream is left: read the route and connect again, with backoff (0.1 s
        doubling to 2 s) for up to RECONNECT_PATIENCE seconds. A group or queue that no
        longer exists fails at once (NotFound)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RECONNECT_PATIENCE
        attempt = 0
        while not self._conns and not self._closed:
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1
            try:
                await self._reroute()
            except NotFound:
                raise
            except CheramiError as err:
                if loop.time() >= give_up:
                    raise Unavailable(f"consumer connection lost: {err}") from err
                log.warning("consumer reconnect failed: %s", err)

    # streams
    async def _read(self, conn: _Conn) -> None:
        try:
            async for data in _messages(conn.ws):
                frame = _decode_consumed(data)
                if isinstance(frame, _Deliver):
                    self._take_in(conn, frame.messages)
                elif isinstance(frame, f.Returned):
                    self._returned(conn, frame.n)
                elif isinstance(frame, f.Error):
                    log.warning("consume stream error: %s %s", frame.code, frame.message)
        finally:
            if _deleted(conn.ws):
                self._gone = NotFound("the group or its queue was deleted")
            self._drop(conn)
            self.lost.set()
            self._reroute_soon.set()
            self._arrived.set()

    def _take_in(self, conn: _Conn, messages: list[Received]) -> None:
        """Deliveries of a stream: each remembered with its stream and handle (for its
        settlement), then buffered for ``get``."""
        via = self._via
        for m in messages:
            if m.attributes is None:
                m.attributes = {}
            earlier = via.get(m.id)
            if earlier is not None:
                self._supersede(m.id, *earlier)
            via[m.id] = (conn, m.handle)
        self._buffer.extend(messages)
        self._arrived.set()

    def _supersede(self, msg_id: str, conn: _Conn, handle: int | None) -> None:
        """A message delivered again (by another output host after a failover, or after
        its visibility timeout): the earlier delivery is void. Its credit returns to
        the stream that delivered it (else every such delivery leaked one, and a stream
        whose credit had leaked away got nothing more: its extents starved), and it
        leaves the buffer if it was not taken yet."""
        conn.granted = max(0, conn.granted - 1)
        if any(m.id == msg_id and m.handle == handle for m in self._buffer):
            kept = [m for m in self._buffer if not (m.id == msg_id and m.handle == handle)]
            self._buffer.clear()
            self._buffer.extend(kept)

    def _returned(self, conn: _Conn, n: int) -> None:
        """The server's answer to a credit asked back: ``n`` is free again (the next
        grant hands it to the streams short of their share)."""
        conn.granted = max(0, conn.granted - n)
        conn.reclaiming = False

    def _drop(self, conn: _Conn) -> None:
        """A stream ended: what it delivered is void here (the server delivers it again)."""
        if conn.lost:
            return
        conn.lost = True
        conn.granted = 0
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        void = {i for i, (c, _) in self._via.items() if c is conn}
        for msg_id in void:
            del self._via[msg_id]
        if void:
            kept = [m for m in self._buffer if m.id not in void]
            self._buffer.clear()
            self._buffer.extend(kept)

    async def _grant(self) -> None:
        """Split the credit over the streams the route lists: each open one gets its
        share as far as the credit that others still hold allows. A listed stream that
        is reconnecting keeps its share free: credit once granted returns only as that
        stream's messages settle, so handing it to the others meanwhile let a stream
        with nothing left to deliver hold it for good, and the reconnected stream
        starved (seen when an extent moved just as a consumer started).

        When the shares shrink (the route lists another host) and a stream still holds
        more than its new share, unused at its server while another is short, the
        excess is asked back (a negative credit); the server answers with what it took
        back (``returned``), which the next grant hands out."""
        conns = [c for c in self._conns.values() if not c.ws.closed]
        if not conns:
            return
        spare = self._credit - sum(c.granted for c in conns)
        share, extra = divmod(self._credit, max(len(conns), self._expected))
        shares = [max(1, share + (i < extra)) for i in range(len(conns))]
        short = 0
        for conn, due in zip(conns, shares, strict=True):
            give = min(due - conn.granted, spare)
            if give > 0:
                conn.granted += give
                spare -= give
                await self._send(conn, f.Credit(give))
            short += max(0, due - conn.granted)
        if short:
            for conn, due in zip(conns, shares, strict=True):
                if conn.granted > due and not conn.reclaiming:
                    conn.reclaiming = True
                    await self._send(conn, f.Credit(due - conn.granted))

    # taking messages
    async def get(self, timeout: float | None = None) -> Received | None:
        """The next message, or None after ``timeout`` seconds without one."""
        if self._flusher is None and not self._closed:
            await self.open()
        while not self._buffer:
            if self._closed:
                return None
            if self._gone is not None:
                raise self._gone
            if not self._conns:
                await self._reopen()
                continue
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._arrived.wait()
            except TimeoutError:
                return None
        return self._buffer.popleft()

    async def get_batch(
        self, max_messages: int = 1000, timeout: float | None = None
    ) -> list[Received]:
        first = await self.get(timeout)
        if first is None:
            return []
        buffer = self._buffer
        if len(buffer) < max_messages:  # all that is here (a copy in C)
            batch = [first, *buffer]
            buffer.clear()
            return batch
        batch = [first]
        while buffer and len(batch) < max_messages:
            batch.append(buffer.popleft())
        return batch

    def __aiter__(self) -> AsyncIterator[Received]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Received]:
        while True:
            message = await self.get()
            if message is None:
                return
            yield message

    # settling
    def _settled(self, messages: Iterable[Received]) -> dict[_Conn, list[int]]:
        """The handles of messages settled now, by the stream that delivered them (a
        message whose stream ended is left out: its handle is void); their credit
        returns."""
        by_conn: dict[_Conn, list[int]] = {}
        via = self._via
        last: _Conn | None = None
        handles: list[int] = []
        for m in messages:
            held = via.get(m.id)
            if held is None or held[1] != m.handle or m.handle is None:
                continue  # its stream ended, or this is not its current delivery
            del via[m.id]
            conn = held[0]
            if conn is not last:  # a batch's messages mostly come from one stream
                last = conn
                handles = by_conn.setdefault(conn, [])
            handles.append(m.handle)
        for conn, settled in by_conn.items():
            conn.granted -= len(settled)
        return by_conn

    # ack, nack and extend take effect when called; each returns an awaitable that ends
    # once its frame is written, which a caller may await or leave (a task held here)

    def ack(self, *messages: Received) -> asyncio.Future[None]:
        """Acks go out with the next flush (a few milliseconds); ``await`` is optional
        and returns at once."""
        for conn, handles in self._settled(messages).items():
            conn.acks += handles
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def nack(self, *messages: Received, delay_seconds: float = 0) -> asyncio.Task[None]:
        """Deliver these again after ``delay_seconds``; ``await`` it to wait for the send."""
        return _keep(self._tasks, self._nack(messages, delay_seconds), "nack")

    def extend(self, *messages: Received, visibility_timeout_seconds: float) -> asyncio.Task[None]:
        """Push back these deliveries' visibility timeouts; ``await`` is optional."""
        return _keep(self._tasks, self._extend(messages, visibility_timeout_seconds), "extend")

    async def _nack(self, messages: tuple[Received, ...], delay_seconds: float) -> None:
        delay_ms = int(delay_seconds * 1000)
        for conn, handles in self._settled(messages).items():
            await self._send(conn, f.Nack(handles, delay_ms))

    async def _extend(
        self, messages: tuple[Received, ...], visibility_timeout_seconds: float
    ) -> None:
        by_conn: dict[_Conn, list[int]] = {}
        for m in messages:
            held = self._via.get(m.id)
            if held is not None and held[1] == m.handle and m.handle is not None:
                by_conn.setdefault(held[0], []).append(m.handle)
        for conn, handles in by_conn.items():
            await self._send(conn, f.Extend(handles, int(visibility_timeout_seconds * 1000)))

    async def _send(self, conn: _Conn, frame: f.ClientFrame) -> None:
        if not conn.lost and not conn.ws.closed:
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                await conn.ws.send_bytes(f.encode(frame))

    async def flush(self) -> None:
        for conn in list(self._conns.values()):
            if conn.acks:
                acks, conn.acks = conn.acks, []
                await self._send(conn, f.Ack(acks))
        await self._grant()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(0.005)
            await self.flush()

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()
        with contextlib.suppress(Exception):
            await self.flush()
        for task in (self._flusher, self._refresher):
            if task is not None:
                task.cancel()
        conns = list(self._conns.values())
        await asyncio.gather(*(c.ws.close() for c in conns), return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
