"""The typed client of a store host: one multiplexed, pipelined TCP connection.

Requests are written without waiting for earlier replies; each reply resolves the
future of its request id. Frames made in one event-loop turn leave in one write (a
loopback write costs a system call and a wake-up of the store host; appends, commits and
reads of every group and producer of a node share the connection). When the connection
drops, every pending request fails with Unavailable and the next request reconnects.

Reads may wait long at the store host for records to come (an idle extent then costs
one read per wait); so that a store host cut off is not waited for that long, the
connection itself is watched: while requests wait on it, a cheap request goes every
LIVENESS_INTERVAL, and one not answered in CALL_TIMEOUT drops the connection, unless
other replies came on it meanwhile: a store host that answers is slow, not gone, and
that one request alone fails (dropping the connection failed every read waiting on it,
thousands on a node with many idle groups, and their retries made the host slower
still: creating queues on a loaded machine then failed after a few hundred)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from cherami.errors import CheramiError, ExtentSealed, StorageFull, Unavailable
from cherami.telemetry import PROCESS
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import Cork, FrameReader, FrameWriter, open_framed

log = logging.getLogger("cherami.storehost.client")

_HIGH_WATER = 4 << 20
CALL_TIMEOUT = 3.0
LIVENESS_INTERVAL = 2.0  # while requests wait on a connection, it is asked this often
_PING = "_ping"  # an extent name no extent has: asking about it tests the connection
STORAGE_FULL_RETRY = 2.0  # seconds a publish refused for a store's full disk waits


class StoreError(CheramiError):
    """A store host refused a request; ``code`` is the store's error code, for the codes
    not raised as their own class below. Status 500: a request the server sent a store
    host and the store refused is the server's fault (docs/api.md lists each code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


Opener = Callable[[str], Awaitable[tuple[FrameReader, FrameWriter]]]


def tcp_opener(context: ssl.SSLContext | None) -> Opener:
    """Opens TCP connections; with ``context`` (a cluster with TLS), verifying the host."""

    async def open_tcp(address: str) -> tuple[FrameReader, FrameWriter]:
        host, port = address.rsplit(":", 1)
        return await open_framed(
            host, int(port), h.WELCOME_SIZE, ssl=context,
            server_hostname=host if context else None,
        )  # fmt: skip

    return open_tcp


def _raise_for(reply: w.Reply) -> w.Reply:
    if isinstance(reply, w.Failed):
        if reply.code == "extent_sealed":
            raise ExtentSealed(reply.message)
        if reply.code == "unavailable":
            raise Unavailable(reply.message)
        if reply.code == "storage_full":
            raise StorageFull(reply.message, retry_after=STORAGE_FULL_RETRY)
        raise StoreError(reply.code, reply.message)
    return reply


class StoreClient:
    def __init__(
        self,
        store_id: str,
        address: str,
        connect_timeout: float = 2.0,
        key: bytes | None = None,
        opener: Opener | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``key``: the cluster key to prove (default: the environment's, handshake.py);
        ``opener``: how to open a connection to ``address`` (default: TCP, with TLS
        verifying with ``tls`` when given, wire/tls.py; an in-process store host's pipe,
        inprocess.py)."""
        self.store_id = store_id
        self._key = key
        self._open = opener or tcp_opener(tls)
        self.address = address
        self._timeout = connect_timeout
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[w.Reply]] = {}
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        self._frames = Cork()  # the frames of one loop turn leave in one write
        self._replied_at = 0.0  # monotonic time of the latest reply on the connection
        self.closed = False

    async def _connection(self) -> FrameWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            if self.closed:
                raise Unavailable(f"store {self.store_id} client is closed")
            key = self._key if self._key is not None else h.cluster_key()
            try:
                async with asyncio.timeout(self._timeout):
                    reader, writer = await self._open(self.address)
                    try:  # prove we belong to the cluster, and see that it does
                        hello, nonce = h.hello(key)
                        writer.write(hello)
                        answer = bytes(await reader.read_frame())  # the preamble
                    except BaseException:
                        writer.close()
                        raise
            except asyncio.IncompleteReadError:
                raise Unavailable(
                    f"store {self.store_id} at {self.address} refused this process's cluster "
                    "hello (a different cluster secret, or too many connections yet to say "
                    "theirs?)"
                ) from None
            except (OSError, TimeoutError) as err:
                raise Unavailable(f"store {self.store_id} at {self.address}: {err}") from err
            if not h.welcome_ok(key, nonce, answer):
                writer.close()
                raise Unavailable(
                    f"store {self.store_id} at {self.address} is not of this cluster "
                    "(its welcome does not match our secret)"
                )
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read_replies(reader, writer))
            self._watcher = asyncio.create_task(self._watch(writer))
            return writer

    async def _watch(self, writer: FrameWriter) -> None:
        """Ask the store host something every LIVENESS_INTERVAL while requests wait on
        this connection (``call`` drops it when no answer comes in CALL_TIMEOUT)."""
        while True:
            await asyncio.sleep(LIVENESS_INTERVAL)
            if self._writer is not writer or writer.is_closing():
                return
            if self._pending:
                try:
                    await self.call(w.Info, [_PING])
                except CheramiError:
                    pass

    async def _read_replies(self, reader: FrameReader, writer: FrameWriter) -> None:
        try:
            while True:
                reply = w.decode_reply(await reader.read_frame())
                self._replied_at = time.monotonic()
                future = self._pending.pop(reply.rid, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("store %s reply stream failed", self.store_id)
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            self._fail_pending(Unavailable(f"store {self.store_id} connection lost"))

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def send(self, make: Any, *args: Any, **kwargs: Any) -> asyncio.Future[w.Reply]:
        """Write one request built as ``make(rid, *args)``; the future resolves to its reply."""
        writer = await self._connection()
        future = self._enqueue(writer, make, *args, **kwargs)
        if writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await writer.drain()
        return future

    def _enqueue(
        self, writer: FrameWriter, make: Any, *args: Any, **kwargs: Any
    ) -> asyncio.Future[w.Reply]:
        """Queue ``make(rid, *args)`` for this loop turn's write; its reply's future."""
        return self._expect(writer, lambda rid: (w.encode(make(rid, *args, **kwargs)),))

    def _expect(
        self, writer: FrameWriter, frame: Callable[[int], Sequence[bytes]]
    ) -> asyncio.Future[w.Reply]:
        """Queue the frame ``frame(rid)`` (its body in parts) with a new request id; the
        future of its reply."""
        rid = next(self._rids)
        future: asyncio.Future[w.Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._frames.send_parts(writer, frame(rid))
        return future

    async def call(
        self, make: Any, *args: Any, timeout: float = CALL_TIMEOUT, **kwargs: Any
    ) -> w.Reply:
        """One request and its reply. A store host that does not answer in ``timeout``
        seconds is cut off or stuck: the connection is dropped (failing what else waits
        on it) and the next request connects again."""
        kind = getattr(make, "__name__", "other")  # counted for /metrics
        PROCESS.store_requests[kind] = PROCESS.store_requests.get(kind, 0) + 1
        future = await self.send(make, *args, **kwargs)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            async with asyncio.timeout(timeout):
                reply = await future
        except TimeoutError:
            if time.monotonic() - self._replied_at < min(timeout, CALL_TIMEOUT):
                self._forget(future)  # it answers others: slow, not gone
                raise Unavailable(
                    f"store {self.store_id} did not answer in {timeout}s (it is busy)"
                ) from None
            self.reset(f"no answer in {timeout}s")
            raise Unavailable(f"store {self.store_id} did not answer in {timeout}s") from None
        return _raise_for(reply)

    def _forget(self, future: asyncio.Future[w.Reply]) -> None:
        """Stop waiting for a request's reply (a late one is dropped)."""
        future.cancel()
        for rid, pending in list(self._pending.items()):
            if pending is future:
                del self._pending[rid]
                return

    def reset(self, why: str) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        self._fail_pending(Unavailable(f"store {self.store_id}: {why}"))

    async def connect(self) -> None:
        await self._connection()

    def append_nowait(
        self,
        extent: str,
        first_seq: int,
        records: msgspec.Raw,
        delivery_ms: list[int] | None,
        size: int = -1,
    ) -> asyncio.Future[w.Reply]:
        """Pipelined append (records packed once by ``w.pack_records``; ``size``: their
        total length, which lets the store keep them packed) on the open connection,
        without yielding, so appends reach every replica in the order they were made.
        Await the future for the ack."""
        writer = self._writer
        if writer is None or writer.is_closing():
            raise Unavailable(f"store {self.store_id} is not connected")
        return self._expect(
            writer, lambda rid: w.packed_append(rid, extent, first_seq, records, delivery_ms, size)
        )

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    def commit_nowait(self, extent: str, seq: int) -> None:
        """Tell the replica that every replica holds the extent up to ``seq``."""
        writer = self._writer
        if writer is not None and not writer.is_closing():
            self._frames.send(writer, w.encode(w.Commit(0, extent, seq)))

    async def drain(self) -> None:
        writer = self._writer
        if writer is not None and writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await writer.drain()

    async def create_extent(self, extent: str, kind: str) -> None:
        await self.call(w.CreateExtent, extent, kind)

    async def read(
        self,
        extent: str,
        after: bytes,
        max_count: int,
        until_ms: int = 0,
        wait_ms: int = 0,
        joined: bool = False,
    ) -> w.ReadResult:
        """``joined``: the records come as one array (``ReadResult.joined``) from a store
        host that knows the flag; an older one answers with ``records`` as before."""
        timeout = wait_ms / 1000 + CALL_TIMEOUT
        reply = await self.call(
            w.Read, extent, after, max_count, until_ms, wait_ms, joined=joined, timeout=timeout
        )
        assert isinstance(reply, w.ReadResult)
        return reply

    async def seal(self, extent: str, at_seq: int = -1) -> int:
        reply = await self.call(w.Seal, extent, at_seq)
        assert isinstance(reply, w.Done)
        return reply.last_seq

    async def info(self, extents: list[str], timeout: float = CALL_TIMEOUT) -> list[w.ExtentInfo]:
        reply = await self.call(w.Info, extents, timeout=timeout)
        assert isinstance(reply, w.InfoResult)
        return reply.extents

    async def drop(self, extent: str) -> None:
        await self.call(w.Drop, extent)

    async def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        tasks = [t for t in (self._reader_task, self._watcher) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail_pending(Unavailable(f"store {self.store_id} client closed"))


def check_appended(reply: w.Reply) -> int:
    """The last sequence number an append reply confirms, or the error it reports."""
    result = _raise_for(reply)
    assert isinstance(result, w.Appended)
    return result.last_seq
