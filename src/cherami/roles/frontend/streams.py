"""WebSocket streaming publish and consume (docs/protocol.md): binary msgpack frames,
many messages per frame, pipelined publish acks, credit-based delivery."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from aiohttp import WSMsgType, web

from cherami.errors import CheramiError, InvalidRequest, Moved
from cherami.metadata.models import Queue
from cherami.roles.frontend.convert import check_size
from cherami.roles.inputhost.service import Message
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.wire import stream as f

if TYPE_CHECKING:
    from cherami.roles.frontend.app import Frontend

log = logging.getLogger("cherami.frontend.streams")

MAX_BATCHES_IN_FLIGHT = 64
RECONFIGURE = 4000  # close code: publish elsewhere; reconnect and resend unacked batches
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

    async def publish(self, request: web.Request) -> web.StreamResponse:
        queue = await self.f.queue(request, "produce")
        inputs = await self.f.input_host(queue)
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await ws.prepare(request)
        slots = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def handle(frame: f.Publish) -> None:
            try:
                if not 1 <= len(frame.messages) <= MAX_BATCH:
                    raise InvalidRequest(f"a batch holds 1 to {MAX_BATCH} messages")
                _check(queue, frame.messages)
                messages = [Message(m.body, m.attributes, m.delay_ms) for m in frame.messages]
                ids = await inputs.publish(queue, messages)
                self.f.r.metrics.published(queue.name, len(ids))
                reply: f.ServerFrame = f.Published(frame.id, ids)
            except Moved:
                # reconfigure: the producer reconnects and sends its unacked batches again
                await ws.close(code=RECONFIGURE, message=b"reconfigure")
                return
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
        await asyncio.gather(*tasks, return_exceptions=True)
        return ws

    async def consume(self, request: web.Request) -> web.StreamResponse:
        consumer = await self.f.consumer(request, "consume")
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MSG, heartbeat=30)
        await ws.prepare(request)
        stream = _ConsumeStream(ws, consumer)
        pump = asyncio.create_task(stream.pump())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await stream.handle(msg.data)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            consumer.release_owner(stream)
        return ws


class _ConsumeStream:
    def __init__(self, ws: web.WebSocketResponse, consumer: GroupConsumer) -> None:
        self.ws = ws
        self.consumer = consumer
        self.credit = 0
        self._credited = asyncio.Event()

    async def handle(self, data: bytes) -> None:
        try:
            frame = f.decode_client(data)
        except msgspec.DecodeError as err:
            await self.ws.send_bytes(f.encode(f.Error(0, "invalid_request", f"bad frame: {err}")))
            return
        c = self.consumer
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

    async def pump(self) -> None:
        consumer = self.consumer
        while not self.ws.closed:
            if self.credit <= 0:
                self._credited.clear()
                await self._credited.wait()
                continue
            taken = consumer.take(
                min(self.credit, DELIVER_BATCH), None, owner=self, max_bytes=DELIVER_BYTES
            )
            if not taken:
                await consumer.readable.wait()
                continue
            self.credit -= len(taken)
            frame = f.Deliver([
                f.InMessage(e.no, e.msg_id, e.record.body, e.record.attributes, e.count,
                            e.record.enqueued_ms)
                for e in taken
            ])  # fmt: skip
            await self.ws.send_bytes(f.encode(frame))
