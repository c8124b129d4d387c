"""The streaming consumer (docs/protocol.md): a stream from each output host the
group's route lists, its credit split over them (client/credit.py), each message
settled on the stream that delivered it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from cherami.client.credit import CreditPolicy
from cherami.client.links import (
    HEARTBEAT,
    Patience,
    connect,
    deleted,
    dial,
    incoming,
    keep,
    log,
)
from cherami.client.models import Received
from cherami.errors import CheramiError, NotFound, Unavailable
from cherami.wire import stream as f

OPEN_PATIENCE = 30.0  # seconds a first open tries again while the server answers 503

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient


class _Deliver(msgspec.Struct, array_like=True, tag="deliver", frozen=True, gc=False):
    """``f.Deliver`` as a consumer decodes it: straight into what user code gets."""

    messages: list[Received]


_consumed_decoder: msgspec.msgpack.Decoder[
    _Deliver | f.Published | f.Settled | f.Returned | f.Error
] = msgspec.msgpack.Decoder(_Deliver | f.Published | f.Settled | f.Returned | f.Error)
_decode_consumed = _consumed_decoder.decode


CONSUMER_ROUTE_REFRESH = 10.0  # unless the routing call says otherwise
REDIAL_PAUSE = 0.5  # after a stream ended, the route is read again this much later
FLUSH_INTERVAL = 0.005  # seconds between flushes of acks and credit (keyed acks: at once)


class _Conn:
    """One consume stream: straight to an output host the route lists, or (address "")
    through the client's own URL."""

    __slots__ = ("acks", "address", "lost", "ws")

    def __init__(self, address: str, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.address = address
        self.ws = ws
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
        self._credit: CreditPolicy[_Conn] = CreditPolicy(credit)  # what each stream holds
        self._conns: dict[str, _Conn] = {}  # by address
        self._buffer: deque[Received] = deque()
        self._via: dict[str, tuple[_Conn, int | None]] = {}  # message id -> stream, handle
        self._arrived = asyncio.Event()
        self._routing = asyncio.Lock()
        self._refresh = CONSUMER_ROUTE_REFRESH
        self._reroute_soon = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._acks_soon = False  # acks of keyed messages wait to be sent
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
        await self._first_route()
        self._flusher = self._spawn(self._flush_loop(), "consumer flush")
        self._refresher = self._spawn(self._refresh_loop(), "consumer route refresh")

    async def _first_route(self) -> None:
        """The first connect, tried again with back-off for up to OPEN_PATIENCE while a
        server that answered refuses it as unavailable (a 503 at the upgrade: the group's
        extents not placed yet, in a cluster just made or restarting). A server never
        reached fails at once (most likely a wrong URL), as any other refusal does."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + OPEN_PATIENCE, 0.1
        while True:
            try:
                return await self._reroute()
            except Unavailable:
                if not self._client.reached or loop.time() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        return keep(self._tasks, work, f"consumer: {what}")

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
            self._credit.expected = len(route)
            dialed = await asyncio.gather(*(self._dial(a) for a in route if a not in self._conns))
            new = [conn for conn in dialed if conn is not None]
            if not new and not self._conns:
                new.append(_Conn("", await connect(self._client, self._path)))
            for conn in new:
                self._conns[conn.address] = conn
                self._credit.open(conn)
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
        ws = await dial(self._client, address, self._path + "?direct=1", HEARTBEAT, "consumer")
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
        patience = Patience()
        while not self._conns and not self._closed:
            await patience.pause()
            try:
                await self._reroute()
            except NotFound:
                raise
            except CheramiError as err:
                if patience.over:
                    raise Unavailable(f"consumer connection lost: {err}") from err
                log.warning("consumer reconnect failed: %s", err)

    # streams
    async def _read(self, conn: _Conn) -> None:
        try:
            async for data in incoming(conn.ws):
                frame = _decode_consumed(data)
                if isinstance(frame, _Deliver):
                    self._take_in(conn, frame.messages)
                elif isinstance(frame, f.Returned):
                    self._returned(conn, frame.n)
                elif isinstance(frame, f.Error):
                    log.warning("consume stream error: %s %s", frame.code, frame.message)
        finally:
            if deleted(conn.ws):
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
        the stream that delivered it (CreditPolicy.superseded), and it leaves the
        buffer if it was not taken yet."""
        self._credit.superseded(conn)
        if any(m.id == msg_id and m.handle == handle for m in self._buffer):
            kept = [m for m in self._buffer if not (m.id == msg_id and m.handle == handle)]
            self._buffer.clear()
            self._buffer.extend(kept)

    def _returned(self, conn: _Conn, n: int) -> None:
        """The server's answer to a credit asked back: ``n`` is free again (the next
        grant hands it to the streams short of their share)."""
        self._credit.returned(conn, n)

    def _drop(self, conn: _Conn) -> None:
        """A stream ended: what it delivered is void here (the server delivers it again)."""
        if conn.lost:
            return
        conn.lost = True
        self._credit.drop(conn)
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
        """Send the credit frames the policy asks for over the open streams: each one's
        share, what a reconnecting stream keeps free, the excess asked back
        (CreditPolicy.grant)."""
        conns = [c for c in self._conns.values() if not c.ws.closed]
        for conn, n in self._credit.grant(conns):
            await self._send(conn, f.Credit(n))

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
            self._credit.settled(conn, len(settled))
        return by_conn

    # ack, nack and extend take effect when called; each returns an awaitable that ends
    # once its frame is written, which a caller may await or leave (a task held here)

    def ack(self, *messages: Received) -> asyncio.Future[None]:
        """Acks go out with the next flush (a few milliseconds; those of keyed messages
        as soon as the caller yields: the next message of each key waits for them);
        ``await`` is optional and returns at once."""
        for conn, handles in self._settled(messages).items():
            conn.acks += handles
        if not self._acks_soon and any(m.key is not None for m in messages):
            self._acks_soon = True
            asyncio.get_running_loop().call_soon(self._send_acks_soon)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def nack(self, *messages: Received, delay_seconds: float = 0) -> asyncio.Task[None]:
        """Deliver these again after ``delay_seconds``; ``await`` it to wait for the send."""
        return keep(self._tasks, self._nack(messages, delay_seconds), "nack")

    def extend(self, *messages: Received, visibility_timeout_seconds: float) -> asyncio.Task[None]:
        """Push back these deliveries' visibility timeouts; ``await`` is optional."""
        return keep(self._tasks, self._extend(messages, visibility_timeout_seconds), "extend")

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
            await asyncio.sleep(FLUSH_INTERVAL)
            await self.flush()

    def _send_acks_soon(self) -> None:
        """Acks of keyed messages, sent once the caller yields (credit waits for the
        next flush)."""
        self._acks_soon = False
        for conn in list(self._conns.values()):
            if conn.acks:
                acks, conn.acks = conn.acks, []
                self._spawn(self._send(conn, f.Ack(acks)), "keyed acks")

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
