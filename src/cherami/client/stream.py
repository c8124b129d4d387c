"""Streaming publish and consume over WebSocket (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import aiohttp

from cherami.client.models import OutgoingMessage, Received
from cherami.errors import CheramiError, Unavailable, error_from_code
from cherami.wire import stream as f

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient

log = logging.getLogger("cherami.client.stream")

WS_MAX_MSG = 64 << 20
RECONNECTS = 20


async def _connect(client: AsyncClient, path: str) -> aiohttp.ClientWebSocketResponse:
    try:
        return await client.session.ws_connect(
            client.ws_url(path), max_msg_size=WS_MAX_MSG, heartbeat=30, autoping=True
        )
    except aiohttp.WSServerHandshakeError as err:
        if 400 <= err.status < 500:
            # the handshake carries no error body: ask the resource for its exact error
            await client.request("GET", path.rsplit("/", 1)[0])
        raise error_from_code(_code_for(err.status), err.message) from None
    except (aiohttp.ClientError, OSError) as err:
        raise Unavailable(f"{client.url}: {err}") from err


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
    return f.OutMessage(body, m.attributes, delay)


class Publisher:
    """Pipelined streaming publisher: up to ``max_in_flight`` batches await their acks at
    once. A batch's future resolves to its message ids once every message is durable.
    If the connection drops, unacked batches are sent again on a new connection (so a
    message may be stored twice, never lost)."""

    def __init__(self, client: AsyncClient, path: str, max_in_flight: int) -> None:
        self._client = client
        self._path = path
        self._slots = asyncio.Semaphore(max_in_flight)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[f.Publish, asyncio.Future[list[str]]]] = {}
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> Publisher:
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _open(self) -> None:
        self._ws = await _connect(self._client, self._path)
        self._reader = asyncio.create_task(self._read(self._ws))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                continue
            frame = f.decode_server(msg.data)
            if isinstance(frame, f.Published | f.Error):
                entry = self._pending.pop(frame.id, None)
                if entry is None:
                    continue
                self._slots.release()
                future = entry[1]
                if future.done():
                    continue
                if isinstance(frame, f.Published):
                    future.set_result(frame.ids)
                else:
                    future.set_exception(error_from_code(frame.code, frame.message))
        if not self._closed:
            asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        for attempt in range(RECONNECTS):
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            try:
                ws = await _connect(self._client, self._path)
            except CheramiError as err:
                log.warning("publisher reconnect failed: %s", err)
                continue
            self._ws = ws
            self._reader = asyncio.create_task(self._read(ws))
            for frame, _ in list(self._pending.values()):
                await ws.send_bytes(f.encode(frame))
            return
        self._fail(Unavailable("publisher connection lost"))

    def _fail(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for _, future in pending.values():
            self._slots.release()
            if not future.done():
                future.set_exception(error)

    async def send(
        self, messages: Iterable[OutgoingMessage | bytes | str]
    ) -> asyncio.Future[list[str]]:
        """Send one batch; returns a future of its ids (waits while too many are in flight)."""
        frame = f.Publish(next(self._ids), [_out(m) for m in messages])
        await self._slots.acquire()
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._pending[frame.id] = (frame, future)
        if self._ws is not None and not self._ws.closed:
            try:
                await self._ws.send_bytes(f.encode(frame))
            except (ConnectionError, aiohttp.ClientError):
                pass  # the reader notices and resends after reconnecting
        return future

    async def publish(self, messages: Iterable[OutgoingMessage | bytes | str]) -> list[str]:
        return await (await self.send(messages))

    async def flush(self) -> None:
        futures = [future for _, future in self._pending.values()]
        await asyncio.gather(*futures)

    async def close(self) -> None:
        self._closed = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._fail(Unavailable("publisher closed"))


class StreamConsumer:
    """Credit-based streaming consumer. Iterate to get messages; settle each with
    ``ack``/``nack``. Acks are sent in batches; credit returns as messages settle, so at
    most ``credit`` messages are held by this consumer at once."""

    def __init__(self, client: AsyncClient, path: str, credit: int) -> None:
        self._client = client
        self._path = path
        self._credit = credit
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._buffer: deque[Received] = deque()
        self._arrived = asyncio.Event()
        self._acks: list[int] = []
        self._returned = 0
        self._flusher: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self.lost = asyncio.Event()

    async def __aenter__(self) -> StreamConsumer:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def open(self) -> None:
        self._ws = await _connect(self._client, self._path)
        self._reader = asyncio.create_task(self._read(self._ws))
        self._flusher = asyncio.create_task(self._flush_loop())
        await self._ws.send_bytes(f.encode(f.Credit(self._credit)))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                continue
            frame = f.decode_server(msg.data)
            if isinstance(frame, f.Deliver):
                self._buffer.extend(
                    Received(m.id, m.body, m.attributes or {}, m.delivery_count,
                             m.enqueued_ms, handle=m.handle)
                    for m in frame.messages
                )  # fmt: skip
                self._arrived.set()
            elif isinstance(frame, f.Error):
                log.warning("consume stream error: %s %s", frame.code, frame.message)
        self.lost.set()
        self._arrived.set()

    async def _reopen(self) -> None:
        """After a lost connection: what this consumer held is redelivered by the server."""
        self._buffer.clear()
        self._acks.clear()
        self._returned = 0
        for attempt in range(RECONNECTS):
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            with contextlib.suppress(CheramiError):
                self.lost.clear()
                self._ws = await _connect(self._client, self._path)
                self._reader = asyncio.create_task(self._read(self._ws))
                await self._ws.send_bytes(f.encode(f.Credit(self._credit)))
                return
        raise Unavailable("consumer connection lost")

    async def get(self, timeout: float | None = None) -> Received | None:
        """The next message, or None after ``timeout`` seconds without one."""
        while not self._buffer:
            if self._closed:
                return None
            if self.lost.is_set():
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
        batch = [first]
        while self._buffer and len(batch) < max_messages:
            batch.append(self._buffer.popleft())
        return batch

    def __aiter__(self) -> AsyncIterator[Received]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Received]:
        while True:
            message = await self.get()
            if message is None:
                return
            yield message

    def ack(self, *messages: Received) -> None:
        for m in messages:
            assert m.handle is not None
            self._acks.append(m.handle)
        self._returned += len(messages)

    async def nack(self, *messages: Received, delay_seconds: float = 0) -> None:
        handles = [m.handle for m in messages if m.handle is not None]
        self._returned += len(handles)
        await self._send(f.Nack(handles, int(delay_seconds * 1000)))

    async def extend(self, *messages: Received, visibility_timeout_seconds: float) -> None:
        handles = [m.handle for m in messages if m.handle is not None]
        await self._send(f.Extend(handles, int(visibility_timeout_seconds * 1000)))

    async def _send(self, frame: f.ClientFrame) -> None:
        ws = self._ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                await ws.send_bytes(f.encode(frame))

    async def flush(self) -> None:
        if self._acks:
            acks, self._acks = self._acks, []
            await self._send(f.Ack(acks))
        if self._returned:
            returned, self._returned = self._returned, 0
            await self._send(f.Credit(returned))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(0.005)
            await self.flush()

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()
        with contextlib.suppress(Exception):
            await self.flush()
        if self._flusher is not None:
            self._flusher.cancel()
        if self._ws is not None:
            await self._ws.close()
        for task in (self._flusher, self._reader):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
