"""WebSocket streaming publish and consume (docs/protocol.md): binary msgpack frames,
many messages per frame, pipelined publish acks, credit-based delivery. A process holds
at most ``http.max_streams`` streams, ``http.max_streams_per_key`` of them with one API
key (those it forwards to another host included); over either, a new stream is refused
429 ``too_many_streams`` before the upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Iterator

import msgspec
from aiohttp import WSMsgType, web

from cherami.errors import (
    CheramiError,
    InvalidRequest,
    Moved,
    QueueNotFound,
    Throttled,
    TooManyStreams,
    Unauthorized,
)
from cherami.httpbase import HttpLimits, limits, upgrade
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Group, Queue, check_competing
from cherami.roles.frontend.auth import ApiKey, KeyRing
from cherami.roles.frontend.consumerrouting import is_direct
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import check_size, stream_expires_ms
from cherami.roles.frontend.metrics import Metrics
from cherami.roles.frontend.proxy import Forward, forward
from cherami.roles.frontend.throttle import Throttle
from cherami.roles.inputhost.client import InputHostClient
from cherami.roles.outputhost.client import OutputHostClient
from cherami.wire import close
from cherami.wire import stream as f
from cherami.wire.records import Message

log = logging.getLogger("cherami.frontend.streams")

MAX_BATCHES_IN_FLIGHT = 64
RECONFIGURE = close.RECONFIGURE  # publish or consume elsewhere: reconnect (and resend)
QUEUE_CHECK_INTERVAL = 1.0  # how often a publish stream checks that its queue still exists
MAX_BATCH = 1000
MAX_DELAY_MS = 30 * 86400 * 1000
WS_MAX_MSG = 64 << 20


def _check(queue: Queue, messages: list[f.OutMessage]) -> None:
    """Refuse the whole batch for one oversized message or delay out of range."""
    limit = queue.config.max_message_bytes
    if max(len(m.body) for m in messages) > limit:
        for i, m in enumerate(messages):
            check_size(queue, i, len(m.body), limit)
    delays = {m.delay_ms for m in messages if m.delay_ms is not None}
    if delays and not 0 <= min(delays) <= max(delays) <= MAX_DELAY_MS:  # say which
        for i, m in enumerate(messages):
            if m.delay_ms is not None and not 0 <= m.delay_ms <= MAX_DELAY_MS:
                raise InvalidRequest(f"messages[{i}].delay_ms must be 0 to {MAX_DELAY_MS}")


STREAM_RETRY = 1.0  # the Retry-After of too_many_streams: a stream may close any moment


class StreamCaps:
    """The streams a process holds, in all and per API key."""

    def __init__(self) -> None:
        self.total = 0
        self._by_key: dict[bytes, int] = {}

    @contextlib.contextmanager
    def hold(self, key: ApiKey | None, of: HttpLimits) -> Iterator[None]:
        """One stream held while the block runs; TooManyStreams over a cap (a server
        without keys has only its own)."""
        digest = None if key is None else key.digest()
        held = 0 if digest is None else self._by_key.get(digest, 0)
        if key is not None and held >= of.max_streams_per_key:
            raise TooManyStreams(
                f"the API key {key.name} holds {held} streams here, the server's "
                "max_streams_per_key; close one, or open it again later", STREAM_RETRY,
            )  # fmt: skip
        if self.total >= of.max_streams:
            raise TooManyStreams(
                f"this server holds {self.total} streams, its max_streams; "
                "open the stream again later", STREAM_RETRY,
            )  # fmt: skip
        self.total += 1
        if digest is not None:
            self._by_key[digest] = held + 1
        try:
            yield
        finally:
            self.total -= 1
            if digest is not None:
                left = self._by_key[digest] - 1
                if left:
                    self._by_key[digest] = left
                else:
                    del self._by_key[digest]


class StreamHandlers:
    def __init__(
        self,
        lookup: Lookup,
        metadata: MetadataStore,
        keys: KeyRing,
        throttle: Throttle,
        metrics: Metrics,
        outputs: OutputHostClient | None,
    ) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.keys = keys
        self.throttle = throttle
        self.metrics = metrics
        self.outputs = outputs
        self.open: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        self.caps = StreamCaps()

    def count(self) -> int:
        return len(self.open)

    async def close_all(self, app: web.Application) -> None:
        """On shutdown (SIGTERM): every open stream gets a close frame, GOING_AWAY."""
        going = [ws.close(code=close.GOING_AWAY, message=b"server stopping") for ws in self.open]
        await asyncio.gather(*going, return_exceptions=True)

    async def _same_queue(self, queue: Queue) -> bool:
        """Whether the queue a stream was opened for still exists (and is not another
        queue since made under its name)."""
        try:
            current = await self.metadata.get_queue(queue.name)
        except QueueNotFound:
            return False
        return current.created_at == queue.created_at

    async def _watch_queue(self, ws: web.WebSocketResponse, queue: Queue) -> None:
        """Close a publish stream whose queue is deleted: it never outlives it."""
        while not ws.closed:
            await asyncio.sleep(QUEUE_CHECK_INTERVAL)
            try:
                same = await self._same_queue(queue)
            except CheramiError:
                continue  # metadata unreachable: look again later
            if not same:
                await ws.close(code=close.DELETED, message=b"queue deleted")

    def _slot(self, request: web.Request) -> contextlib.AbstractContextManager[None]:
        """A stream slot for the request's key, or TooManyStreams (before the upgrade:
        an HTTP 429 like the lookups' errors, which come first)."""
        key = self.keys.find(request.headers.get("Authorization"))
        return self.caps.hold(key, limits(request.app))

    async def _forward(self, request: web.Request, address: str) -> web.StreamResponse:
        """A stream another host serves, passed on from here in a slot of its own."""
        with self._slot(request):
            return await forward(self.lookup.router(), request, address)

    async def publish(self, request: web.Request) -> web.StreamResponse:
        queue = await self.lookup.queue(request, "produce")
        try:
            inputs = await self.lookup.input_host(queue)
        except Forward as fwd:
            return await self._forward(request, fwd.address)
        with self._slot(request):
            return await self._publish(request, queue, inputs)

    async def _publish(
        self, request: web.Request, queue: Queue, inputs: InputHostClient
    ) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await upgrade(request, ws)
        self.open.add(ws)
        slots = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        watcher = asyncio.create_task(self._watch_queue(ws, queue))
        keys, header = self.keys, request.headers.get("Authorization")

        async def handle(frame: f.Publish) -> None:
            started = time.perf_counter()
            try:
                if not 1 <= len(frame.messages) <= MAX_BATCH:
                    raise InvalidRequest(f"a batch holds 1 to {MAX_BATCH} messages")
                _check(queue, frame.messages)
                now_ms = int(time.time() * 1000)
                messages = [Message(m.body, m.attributes, m.delay_ms, dedup_id=m.dedup_id,
                                    key=m.key,
                                    expires_ms=stream_expires_ms(i, m.ttl_ms, m.expires_ms, now_ms)
                                    if m.ttl_ms is not None or m.expires_ms is not None else None)
                            for i, m in enumerate(frame.messages)]  # fmt: skip
                key = keys.find(header)  # each batch: a key a reload removed stops here
                if key is None and keys.enabled:
                    raise Unauthorized("the stream's API key is no longer in the auth file")
                size = sum(len(m.body) for m in messages)
                await self.throttle.admit(queue, key, len(messages), size, fresh=False)
                ids = await inputs.publish(queue, messages)
                self.metrics.published(queue.name, len(ids), time.perf_counter() - started)
                reply: f.ServerFrame = f.Published(frame.id, ids)
            except Moved:
                # reconfigure: the producer reconnects and sends its unacked batches again,
                # unless the queue is gone (a new queue of the same name is another queue)
                if await self._same_queue(queue):
                    await ws.close(code=RECONFIGURE, message=b"reconfigure")
                else:
                    await ws.close(code=close.DELETED, message=b"queue deleted")
                return
            except Throttled as err:  # nothing of it stored: the producer sends it again
                reply = f.Throttled(frame.id, err.code, err.message, err.retry_after_ms)
            except CheramiError as err:
                reply = f.Error(frame.id, err.code, err.message)
            except Exception:
                log.exception("publish of batch %d failed", frame.id)
                reply = f.Error(frame.id, "internal", "internal error")
            finally:
                slots.release()
            if not ws.closed:
                await ws.send_bytes(f.encode(reply))

        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                if msg.type == WSMsgType.TEXT:
                    await ws.send_bytes(
                        f.encode(f.Error(0, "invalid_request", "binary frames only"))
                    )
                continue
            try:
                frame = f.decode_client(msg.data)
            except f.BadPublish as err:  # the batch gets its own reply
                await ws.send_bytes(f.encode(f.Error(err.id, "invalid_request", err.message)))
                continue
            except msgspec.DecodeError as err:
                await ws.send_bytes(f.encode(f.Error(0, "invalid_request", f"bad frame: {err}")))
                continue
            if not isinstance(frame, f.Publish):
                await ws.send_bytes(f.encode(f.Error(0, "invalid_request", "publish frames only")))
                continue
            await slots.acquire()
            task = asyncio.create_task(handle(frame))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        watcher.cancel()
        await asyncio.gather(watcher, *tasks, return_exceptions=True)
        return ws

    async def consume(self, request: web.Request) -> web.StreamResponse:
        """A consume stream of the extents of the group this output host holds (served
        by the output host, outputhost/consumestream.py). A direct stream (a consumer
        that connects to every output host of the group) to a host that holds none of
        them is closed at once with RECONFIGURE: the client reads the route again.
        Another stream is forwarded to a holder."""
        try:
            if is_direct(request):
                group = await self.lookup.group_record(request, "consume")
            else:
                group = await self.lookup.served_group(request, "consume")
        except Forward as fwd:
            return await self._forward(request, fwd.address)
        check_competing(group)  # before the upgrade: an HTTP 400
        with self._slot(request):
            return await self._consume(request, group)

    async def _consume(self, request: web.Request, group: Group) -> web.StreamResponse:
        outputs = self.outputs
        if outputs is not None:  # before the upgrade: its errors are HTTP answers
            await outputs.load(group.queue, group.name)
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await upgrade(request, ws)
        self.open.add(ws)
        stream = None if outputs is None else await outputs.open_stream(group, ws)
        if stream is None:
            await ws.close(code=RECONFIGURE, message=b"no extent of the group here; reconnect")
            return ws
        pump = asyncio.create_task(stream.pump())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await stream.handle(msg.data)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            stream.end()
        return ws
