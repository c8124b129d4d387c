"""WebSocket streaming publish and consume (docs/protocol.md): binary msgpack frames,
many messages per frame, pipelined publish acks, credit-based delivery."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import TYPE_CHECKING

import msgspec
from aiohttp import WSMsgType, web

from cherami.errors import (
    CheramiError,
    GroupNotFound,
    InvalidRequest,
    Moved,
    QueueNotFound,
    Throttled,
    Unauthorized,
)
from cherami.metadata.models import Queue
from cherami.roles.frontend.consumerrouting import is_direct
from cherami.roles.frontend.convert import check_size
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.service import NOT_ACTING_WAIT, OutputHostService
from cherami.wire import close
from cherami.wire import stream as f
from cherami.wire.records import Message

if TYPE_CHECKING:
    from cherami.roles.frontend.app import Frontend

log = logging.getLogger("cherami.frontend.streams")

MAX_BATCHES_IN_FLIGHT = 64
RECONFIGURE = close.RECONFIGURE  # publish or consume elsewhere: reconnect (and resend)
QUEUE_CHECK_INTERVAL = 1.0  # how often a publish stream checks that its queue still exists
MAX_BATCH = 1000
MAX_DELAY_MS = 30 * 86400 * 1000
MAX_SETTLE_DELAY_MS = 12 * 3600 * 1000
MAX_CREDIT = 100_000
DELIVER_BATCH = 1000
DELIVER_BYTES = 8 << 20  # a frame holds at least one message, and stops growing past this
WS_MAX_MSG = 64 << 20


def _check(queue: Queue, messages: list[f.OutMessage]) -> None:
    """Refuse the whole batch for one oversized message or delay out of range."""
    limit = queue.config.max_message_bytes
    if max(len(m.body) for m in messages) > limit:
        for i, m in enumerate(messages):
            check_size(queue, i, len(m.body), limit)
    for i, m in enumerate(messages):
        if m.delay_ms is not None and not 0 <= m.delay_ms <= MAX_DELAY_MS:
            raise InvalidRequest(f"messages[{i}].delay_ms must be 0 to {MAX_DELAY_MS}")


class StreamHandlers:
    def __init__(self, frontend: Frontend) -> None:
        self.f = frontend
        self.open: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()

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
            current = await self.f.r.metadata.get_queue(queue.name)
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

    async def publish(self, request: web.Request) -> web.StreamResponse:
        queue = await self.f.queue(request, "produce")
        inputs = await self.f.input_host(queue)
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await ws.prepare(request)
        self.open.add(ws)
        slots = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        watcher = asyncio.create_task(self._watch_queue(ws, queue))
        keys, header = self.f.r.keys, request.headers.get("Authorization")

        async def handle(frame: f.Publish) -> None:
            started = time.perf_counter()
            try:
                if not 1 <= len(frame.messages) <= MAX_BATCH:
                    raise InvalidRequest(f"a batch holds 1 to {MAX_BATCH} messages")
                _check(queue, frame.messages)
                messages = [Message(m.body, m.attributes, m.delay_ms, dedup_id=m.dedup_id)
                            for m in frame.messages]  # fmt: skip
                key = keys.find(header)  # each batch: a key a reload removed stops here
                if key is None and keys.enabled:
                    raise Unauthorized("the stream's API key is no longer in the auth file")
                size = sum(len(m.body) for m in messages)
                await self.f.throttle.admit(queue, key, len(messages), size, fresh=False)
                ids = await inputs.publish(queue, messages)
                self.f.r.metrics.published(queue.name, len(ids), time.perf_counter() - started)
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
        """A consume stream of the extents of the group this output host holds. A
        direct stream (a consumer that connects to every output host of the group)
        to a host that holds none of them is closed at once with RECONFIGURE: the
        client reads the route again. Another stream is forwarded to a holder."""
        if is_direct(request):
            group = await self.f.group_record(request, "consume")
            consumer = await self.f.local_consumer(group)
        else:
            consumer = await self.f.consumer(request, "consume")
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await ws.prepare(request)
        self.open.add(ws)
        outputs = self.f.r.outputs
        if consumer is None or outputs is None:
            await ws.close(code=RECONFIGURE, message=b"no extent of the group here; reconnect")
            return ws

        async def closer(code: int, reason: str) -> None:
            await ws.close(code=code, message=reason.encode())

        detach = outputs.attach(consumer, closer)
        if consumer.stopped:  # unloaded while the stream was being opened
            await closer(close.RECONFIGURE, "group moved; reconnect")
        stream = _ConsumeStream(ws, consumer, outputs)
        pump = asyncio.create_task(stream.pump())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await stream.handle(msg.data)
        finally:
            detach()
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            consumer.release_owner(stream)
        return ws


class _ConsumeStream:
    def __init__(
        self, ws: web.WebSocketResponse, consumer: GroupConsumer, outputs: OutputHostService
    ) -> None:
        self.ws = ws
        self.consumer = consumer
        self.outputs = outputs  # its fencing: what it may deliver and settle now
        self.credit = 0
        self._credited = asyncio.Event()

    async def handle(self, data: bytes) -> None:
        try:
            frame = f.decode_client(data)
        except msgspec.DecodeError as err:
            await self.ws.send_bytes(f.encode(f.Error(0, "invalid_request", f"bad frame: {err}")))
            return
        c = self.consumer
        if isinstance(frame, f.Ack | f.Nack | f.Extend) and not self._may_settle(frame.handles):
            # settling is fenced like delivering: the handles go stale with the move, or
            # with the group, when it was deleted (then the documented close says so)
            if await self._deleted():
                await self.ws.close(code=close.DELETED, message=b"deleted")
            else:
                await self.ws.close(code=close.RECONFIGURE, message=b"group moved; reconnect")
            return
        if isinstance(frame, f.Credit):
            self.credit = max(0, min(MAX_CREDIT, self.credit + frame.n))
            if self.credit:
                self._credited.set()
        elif isinstance(frame, f.Ack):
            stale = c.ack(frame.handles, owner=self)
            if stale:
                await self.ws.send_bytes(f.encode(f.Settled("ack", stale)))
        elif isinstance(frame, f.Nack):
            delay = min(max(0, frame.delay_ms), MAX_SETTLE_DELAY_MS) / 1000
            stale = c.nack(frame.handles, delay, owner=self)
            if stale:
                await self.ws.send_bytes(f.encode(f.Settled("nack", stale)))
        elif isinstance(frame, f.Extend):
            visibility = min(max(1, frame.visibility_ms), MAX_SETTLE_DELAY_MS) / 1000
            stale = c.extend(frame.handles, visibility, owner=self)
            if stale:
                await self.ws.send_bytes(f.encode(f.Settled("extend", stale)))
        else:
            await self.ws.send_bytes(f.encode(f.Error(0, "invalid_request", "unexpected frame")))

    async def _deleted(self) -> bool:
        """Whether the stream's group is gone (a group made again under its name since
        is another group)."""
        group = self.consumer.group
        try:
            current = await self.outputs.metadata.get_group(group.queue, group.name)
        except (GroupNotFound, QueueNotFound):
            return True
        except CheramiError:
            return False  # the metadata store cannot tell: moved, reconnect
        return current.created_at != group.created_at

    def _may_settle(self, handles: list[int]) -> bool:
        self.outputs.stamp_acting(self.consumer)
        return not self.consumer.stopped and self.consumer.may_settle(handles)

    async def pump(self) -> None:
        consumer = self.consumer
        while not self.ws.closed:
            if self.credit <= 0:
                self._credited.clear()
                await self._credited.wait()
                continue
            if not self.outputs.stamp_acting(consumer):
                await asyncio.sleep(NOT_ACTING_WAIT)
                continue
            taken = consumer.take(
                min(self.credit, DELIVER_BATCH), None, owner=self, max_bytes=DELIVER_BYTES
            )
            if not taken:
                if consumer.ready:  # only messages of extents it may not act for now
                    await asyncio.sleep(NOT_ACTING_WAIT)
                else:
                    await consumer.readable.wait()
                continue
            self.credit -= len(taken)
            frame = f.Deliver([
                f.InMessage(e.no, e.msg_id, e.record.body, e.record.attributes, e.count,
                            e.record.enqueued_ms)
                for e in taken
            ])  # fmt: skip
            await self.ws.send_bytes(f.encode(frame))
