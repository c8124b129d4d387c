"""One consume stream (docs/protocol.md) as its output host serves it: credit-based
delivery of the group's messages, settled by handle. The frontend owns the WebSocket
and hands its binary frames here (client.OutputHostClient.open_stream)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import msgspec

from cherami.errors import CheramiError, GroupNotFound, QueueNotFound
from cherami.roles.outputhost.entry import Delivered, Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.service import NOT_ACTING_WAIT, OutputHostService
from cherami.wire import close
from cherami.wire import stream as f

MAX_SETTLE_DELAY_MS = 12 * 3600 * 1000
MAX_CREDIT = 100_000
# handles one ack, nack or extend frame may name (what a stream may hold at once): a
# bigger frame is refused whole, so no settled frame lists more than this
MAX_SETTLE_HANDLES = MAX_CREDIT
DELIVER_BATCH = 1000
DELIVER_BYTES = 8 << 20  # a frame holds at least one message, and stops growing past this


class StreamSocket(Protocol):
    """The consumer's end of the stream (an aiohttp WebSocketResponse)."""

    @property
    def closed(self) -> bool: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, *, code: int = ..., message: bytes = ...) -> bool: ...


class ConsumeStream:
    def __init__(
        self, ws: StreamSocket, consumer: GroupConsumer, outputs: OutputHostService
    ) -> None:
        self.ws = ws
        self.consumer = consumer
        self.outputs = outputs  # its fencing: what it may deliver and settle now
        self.credit = 0
        self._credited = asyncio.Event()
        self._detach: Callable[[], None] = outputs.attach(consumer, self._close)

    async def _close(self, code: int, reason: str) -> None:
        await self.ws.close(code=code, message=reason.encode())

    async def start(self) -> None:
        if self.consumer.stopped:  # unloaded while the stream was being opened
            await self._close(close.RECONFIGURE, "group moved; reconnect")

    def end(self) -> None:
        """The stream closed: what it was delivered and did not settle goes back."""
        self._detach()
        self.consumer.release_owner(self)

    async def handle(self, data: bytes) -> None:
        try:
            frame = f.decode_client(data)
        except msgspec.DecodeError as err:
            await self.ws.send_bytes(f.encode(f.Error(0, "invalid_request", f"bad frame: {err}")))
            return
        c = self.consumer
        if isinstance(frame, f.Ack | f.Nack | f.Extend) and len(frame.handles) > MAX_SETTLE_HANDLES:
            kind = type(frame).__name__.lower()
            message = f"{kind}: {len(frame.handles)} handles, at most {MAX_SETTLE_HANDLES} a frame"
            await self.ws.send_bytes(f.encode(f.Error(0, "invalid_request", message)))
            return  # nothing of it applied: the client sends it again in parts
        if isinstance(frame, f.Ack | f.Nack | f.Extend) and not self._may_settle(frame.handles):
            # settling is fenced like delivering: the handles go stale with the move, or
            # with the group, when it was deleted (then the documented close says so)
            if await self._deleted():
                await self.ws.close(code=close.DELETED, message=b"deleted")
            else:
                await self.ws.close(code=close.RECONFIGURE, message=b"group moved; reconnect")
            return
        if isinstance(frame, f.Credit):
            before = self.credit
            self.credit = max(0, min(MAX_CREDIT, self.credit + frame.n))
            if self.credit:
                self._credited.set()
            if frame.n < 0:  # say what came back: some may have gone to deliveries
                await self.ws.send_bytes(f.encode(f.Returned(before - self.credit)))
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
        return self.consumer.may_settle(handles)

    async def pump(self) -> None:
        consumer = self.consumer
        while not self.ws.closed:
            if self.credit <= 0:
                self._credited.clear()
                await self._credited.wait()
                continue
            if not consumer.acts_at_all():
                await asyncio.sleep(NOT_ACTING_WAIT)
                continue
            taken, count = consumer.take_runs(
                min(self.credit, DELIVER_BATCH), owner=self, max_bytes=DELIVER_BYTES
            )
            if not taken:
                if consumer.ready:  # only messages of extents it may not act for now
                    await asyncio.sleep(NOT_ACTING_WAIT)
                else:
                    await consumer.readable.wait()
                continue
            self.credit -= count
            await self.ws.send_bytes(f.encode_deliver(_tuples(taken)))


def _tuples(taken: list[Entry | Delivered]) -> list[f.DeliveryTuple]:
    """What the deliver frame says of each message (wire.stream.encode_deliver)."""
    tuples: list[f.DeliveryTuple] = []
    for e in taken:
        if isinstance(e, Delivered):
            tuples += e.tuples()
        else:
            record = e.record
            if record.key is None:
                tuples.append(
                    (e.no, e.msg_id, record.body, record.attributes, e.count, record.enqueued_ms)
                )
            else:
                tuples.append((e.no, e.msg_id, record.body, record.attributes, e.count,
                               record.enqueued_ms, record.key))  # fmt: skip
    return tuples
