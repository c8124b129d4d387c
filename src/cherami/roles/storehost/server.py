"""The store host service: serves the store protocol (wire/store.py) over TCP for one
ExtentStore. Appends from every connection are committed together, one synced write per
round (group commit); reads can wait for new appends to the extent they tail.

An append round runs on the event loop itself, not in a writer thread: the loop only
waits for it while the fsync runs with the GIL released (reads in the read pool go on),
and on this kind of machine a hand-off to a thread and back cost more CPU than the
round's own work (docs/operations.md). Seals, creates and drops still run in a thread;
a lock keeps every write of the store in order."""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from cherami.errors import ProtocolError
from cherami.loadmeter import Activity, Counts, LatencyRing, disk_floor
from cherami.periodic import Background
from cherami.storage.base import AppendOp, ExtentStore, StorageError
from cherami.telemetry import BATCH_BUCKETS, Histogram
from cherami.wire import grants
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import MAX_FRAME, Cork, FrameReader, FrameWriter, start_framed_server

log = logging.getLogger("cherami.storehost.server")

MAX_READ_WAIT_MS = 600_000  # a read waits at most this long for records (10 min)
# ... but this long when the replica holds records after the read's position and knows
# of no commit of its extent (it restarted, see _read): the reader tries another replica
UNKNOWN_COMMIT_WAIT = 1.0
DISK_CHECK = 0.1  # seconds between looks at the free disk (one statvfs)
DISK_STEP = 256 << 10  # bytes appended after which it is looked at again sooner
T = TypeVar("T")
REFUSALS_LOGGED = 10.0  # seconds between log lines of refused connections


def _append_op(request: w.Append) -> AppendOp:
    """A plain extent's append with its size given is kept packed, as it came (no
    record-by-record decode and encode again); the rest are taken apart. A malformed
    records array raises (msgspec.DecodeError, ValueError) like a malformed frame."""
    if request.size >= 0 and request.delivery_ms is None:
        packed = bytes(request.records)
        return AppendOp.of_packed(request.extent, request.first_seq, packed, request.size)
    records = w.unpack_records(request.records)
    return AppendOp(request.extent, request.first_seq, records, request.delivery_ms)


class _Refusals:
    """How many refusals a log line names: the first at once, then the others of each
    REFUSALS_LOGGED seconds in one line (a flood of connects logs a line, not thousands)."""

    def __init__(self) -> None:
        self.unlogged, self.logged_at = 0, -REFUSALS_LOGGED

    def due(self, now: float) -> int:
        """One more refusal: how many to log now (0: not yet)."""
        self.unlogged += 1
        if now - self.logged_at < REFUSALS_LOGGED:
            return 0
        many, self.unlogged, self.logged_at = self.unlogged, 0, now
        return many


@dataclass(slots=True)
class _PendingAppend:
    op: AppendOp
    rid: int
    writer: FrameWriter


DiskUsage = tuple[int, int]  # free bytes, total bytes


def _usage(path: str | None) -> DiskUsage:
    assert path is not None
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


class _DiskGuard:
    """The store's free disk: below one and a half times the floor no replica is
    created, below the floor nothing is appended. It is looked at (one statvfs) every
    DISK_CHECK seconds or once DISK_STEP bytes were appended since; in between, what was
    appended since the last look counts as used, and so does what the store will write
    again before it can free it (a RocksDB flush of what only its journal holds): a
    fast writer filled a small disk between two looks, and the flush then failed for
    want of room."""

    def __init__(
        self, path: str | None, store: ExtentStore, usage: Callable[[], DiskUsage] | None = None
    ) -> None:
        self.path = path
        self._usage = usage
        self._store = store
        self._at = -DISK_CHECK
        self._written = 0  # bytes appended since the last look
        self.free = self.total = 0

    def _look(self) -> None:
        now = time.monotonic()
        watched = self.path is not None or self._usage is not None
        if watched and (now >= self._at + DISK_CHECK or self._written >= DISK_STEP):
            self._at = now
            try:
                free, total = self._usage() if self._usage else _usage(self.path)
            except OSError:
                return
            self.free, self.total, self._written = free, total, 0
            # each store host sharing the disk (a node's) may flush at once: a small share
            self._store.limit_unflushed((self.free - disk_floor(self.total)) // 8)

    def wrote(self, size: int) -> None:
        self._written += size

    def room(self, hard: bool, incoming: int = 0) -> bool:
        """Whether ``incoming`` more bytes leave the disk above its floor (``hard``, for
        appends; else above 1.5 times it, for a new replica)."""
        self._look()
        if not self.total:
            return True
        floor = disk_floor(self.total)
        left = self.free - self._written - incoming - self._store.unflushed_bytes()
        return left >= (floor if hard else floor * 3 // 2)

    def why(self) -> str:
        return (
            f"store host disk: {self.free - self._written:,} bytes free of {self.total:,} "
            f"({self._store.unflushed_bytes():,} kept for flushing), below its floor of "
            f"{disk_floor(self.total):,}"
        )


class StoreHostService:
    def __init__(
        self,
        store: ExtentStore,
        host: str = "127.0.0.1",
        port: int = 0,
        key: bytes | None = None,
        tls: ssl.SSLContext | None = None,
        data_dir: str | None = None,
        disk_usage: Callable[[], DiskUsage] | None = None,
        hello_timeout: float = h.HELLO_TIMEOUT,
        max_greeting: int = h.MAX_GREETING,
    ) -> None:
        """``key``: the cluster key connections must prove (default: this process's,
        wire/handshake.py); ``tls``: serve over TLS with this context (wire/tls.py);
        ``data_dir``: where the store writes, whose free disk is guarded (loadmeter.py);
        ``disk_usage``: (free, total) bytes of a disk that is not ``data_dir``'s (an
        in-process store host's, inprocess.py); ``hello_timeout``: how long a connection
        may take to say its hello; ``max_greeting``: how many connections may be waiting
        to say it (one more is closed at once)."""
        self.store = store
        self._disk = _DiskGuard(data_dir, store, disk_usage)
        self._tls = tls
        self._hellos = h.HelloChecker(key if key is not None else h.cluster_key())
        self.refused = 0  # connections closed without a valid cluster hello
        self._hello_timeout, self._max_greeting = hello_timeout, max_greeting
        self._greeting = 0  # connections that have not said their hello yet
        self._refusals = _Refusals()
        self._host, self._port = host, port
        self._server: asyncio.Server | None = None
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="cherami-store-write")
        self._write_lock = asyncio.Lock()  # append rounds, seals, creates, drops: one at a time
        self._reads = ThreadPoolExecutor(2, thread_name_prefix="cherami-store-read")
        self._pending: list[_PendingAppend] = []
        self._kick = asyncio.Event()
        self._tail_events: dict[str, asyncio.Event] = {}
        self._committed: dict[str, int] = {}  # open extents: what every replica holds
        self._committer: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.background = Background("store host")  # answers other than appends
        self._replies = Cork()  # a connection's replies of one loop turn: one write
        # load reports: per extent [msgs in, bytes in, msgs out, bytes out] since start,
        # and how long the last synced append rounds took
        self._counts: dict[str, list[int]] = {}
        self.activity = Activity()  # the extents whose counts moved, newest last
        self.appends = LatencyRing()
        self.round_seconds = Histogram()  # /metrics (roles/storehost/metrics.py)
        self.round_messages = Histogram(BATCH_BUCKETS)

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def extent_changes(self, version: int) -> tuple[int, dict[Hashable, tuple[str, Counts] | None]]:
        """The counts of each extent appended to or read from since ``version`` of the
        activity (None for one dropped), for load reports (loadmeter.py): O(extents
        that moved). A report copied every extent's counts before, every 2 s: a store
        host's idle CPU grew with the extents it holds."""
        changed: dict[Hashable, tuple[str, Counts] | None] = {}
        for key in self.activity.since(version):
            c = self._counts.get(str(key))
            changed[key] = None if c is None else (str(key), (c[0], c[1], c[2], c[3]))
        return self.activity.version, changed

    def open_extents(self) -> int:
        """Open extents appended to since this process started."""
        return len(self._committed)

    def connections(self) -> int:
        return len(self._conns)

    async def start(self, listen: bool = True) -> None:
        """Start serving; without ``listen``, only the connections given to
        ``serve_connection`` (an in-process store host's, inprocess.py)."""
        self._committer = asyncio.create_task(self._commit_loop())
        if listen:
            self._server = await start_framed_server(
                self.serve_connection, self._host, self._port, h.HELLO_SIZE, grants.MAX_TOKEN,
                ssl=self._tls,
                # a TLS handshake comes before the hello: bounded by the hello's time too
                ssl_handshake_timeout=self._hello_timeout if self._tls else None,
            )  # fmt: skip

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._committer is not None:
            self._committer.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        await self.background.stop()
        self._writes.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self.store.close()

    async def serve_connection(self, reader: FrameReader, writer: FrameWriter) -> None:
        """Serve one connection until it ends (its reader expects the hello first)."""
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            if self._greeting >= self._max_greeting:  # a flood of silent connects
                self._refuse(writer, f"{self._greeting} connections yet to say their hello")
                return
            self._greeting += 1
            try:
                welcomed, grant = await self._welcomed(reader, writer)
            finally:
                self._greeting -= 1
            if not welcomed:
                return
            while True:
                request = w.decode_request(await reader.read_frame())
                if grant is not None and (
                    refused := grants.refusal(grant, request, time.time() * 1000)
                ):
                    self._replies.send(writer, w.encode(refused))
                elif isinstance(request, w.Commit):
                    self._commit(request.extent, request.seq)
                elif isinstance(request, w.Append):
                    self._pending.append(_PendingAppend(_append_op(request), request.rid, writer))
                    self._kick.set()
                else:
                    self.background.spawn(self._answer(request, writer), type(request).__name__)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("store connection failed")
        finally:
            self._conns.discard(task)
            writer.close()

    async def _welcomed(
        self, reader: FrameReader, writer: FrameWriter
    ) -> tuple[bool, grants.GrantBody | None]:
        """Whether the connection opened with a good cluster hello (wire/handshake.py)
        or a good read grant's hello (wire/grants.py), and the grant it then reads under;
        if so it is welcomed. Otherwise nothing is answered and it is closed."""
        nonce = grant = None
        key = self._hellos.key
        try:
            async with asyncio.timeout(self._hello_timeout):
                data = bytes(await reader.read_frame())  # the preamble: HELLO_SIZE bytes
                if data.startswith(h.GRANT_MAGIC):
                    token = bytes(await reader.read_frame())  # at most MAX_TOKEN bytes
                    checked = grants.check(self._hellos, data, token)
                    if checked is not None:
                        (nonce, grant), key = checked, grants.grant_key(key, token)
                else:
                    nonce = self._hellos.check(data)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ProtocolError):
            pass
        if nonce is None:
            self._refuse(writer, "no valid cluster hello or read grant")
            return False, None
        reader.max_frame = MAX_FRAME
        writer.write(h.welcome(key, nonce))
        return True, grant

    def _refuse(self, writer: FrameWriter, why: str) -> None:
        """Count a connection refused (it is closed by its caller) and log it: a line
        at most every REFUSALS_LOGGED seconds, naming how many since the last."""
        self.refused += 1
        many = self._refusals.due(time.monotonic())
        if many:
            log.warning(
                "refused %d connection(s), the last from %s: %s",
                many, writer.get_extra_info("peername"), why,
            )  # fmt: skip

    async def _commit_loop(self) -> None:
        while True:
            await self._kick.wait()
            async with self._write_lock:
                self._kick.clear()
                pending, self._pending = self._pending, []
                self._append_round(pending)

    def _append_round(self, pending: list[_PendingAppend]) -> None:
        """One group commit, on the loop: write and fsync every pending append, then
        queue each one's reply (they leave together at the end of this loop turn)."""
        started = time.perf_counter()
        incoming = sum(p.op.size for p in pending)
        if not self._disk.room(hard=True, incoming=incoming):  # never write the disk full
            full = StorageError("storage_full", self._disk.why())
            for item in pending:
                self._replies.send(item.writer, w.encode(w.Failed(item.rid, full.code, str(full))))
            return
        try:
            results = self.store.append([p.op for p in pending])
            self._disk.wrote(incoming)
            took = time.perf_counter() - started
            self.appends.add(took)
            self.round_seconds.observe(took)
            self.round_messages.observe(sum(p.op.count for p in pending))
            counts = self._counts
            for p in pending:
                c = counts.get(p.op.extent) or counts.setdefault(p.op.extent, [0, 0, 0, 0])
                c[0] += p.op.count
                c[1] += p.op.size
                self.activity.touch(p.op.extent)
        except Exception as err:  # a full disk, an I/O error: refuse the whole round
            log.error("append round of %d failed: %s", len(pending), err)
            results = [StorageError("unavailable", str(err))] * len(pending)
        for item, result in zip(pending, results, strict=True):
            reply: w.Reply = (
                w.Failed(item.rid, result.code, str(result))
                if isinstance(result, StorageError)
                else w.Appended(item.rid, result)
            )
            self._replies.send(item.writer, w.encode(reply))
        # readers wake on commits, not appends: a record is readable once every
        # replica holds it (Commit), or once its extent is sealed

    def _commit(self, extent: str, seq: int) -> None:
        if seq > self._committed.get(extent, 0):
            self._committed[extent] = seq
            self._wake(extent)

    def _wake(self, extent: str) -> None:
        event = self._tail_events.pop(extent, None)
        if event is not None:
            event.set()

    async def _answer(self, request: w.Request, writer: FrameWriter) -> None:
        try:
            reply = await self._handle(request)
        except StorageError as err:
            reply = w.Failed(request.rid, err.code, str(err))
        except Exception as err:
            log.exception("store request failed")
            reply = w.Failed(request.rid, "unavailable", str(err))
        self._replies.send(writer, w.encode(reply))

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """A write other than an append round, in the writer thread, never at the same
        time as a round or another write."""
        async with self._write_lock:
            return await asyncio.get_running_loop().run_in_executor(self._writes, fn, *args)

    async def _handle(self, request: w.Request) -> w.Reply:
        store = self.store
        if isinstance(request, w.Read):
            return await self._read(request)
        if isinstance(request, w.CreateExtent):
            if not self._disk.room(hard=False):  # no new replica below the floor
                raise StorageError("storage_full", self._disk.why())
            await self._write(store.create_extent, request.extent, request.kind)
            return w.Done(request.rid)
        if isinstance(request, w.Seal):
            last = await self._write(store.seal, request.extent, request.at_seq)
            if request.at_seq >= 0:
                # the seal's final point: every replica holds exactly this much, all of
                # it readable. A seal "where it stands" (-1) may be cut back afterwards,
                # so readers stay behind the commit watermark until then.
                self._committed.pop(request.extent, None)
            self._wake(request.extent)
            return w.Done(request.rid, last)
        if isinstance(request, w.Info):
            names = request.extents or store.extents()
            return w.InfoResult(request.rid, [store.info(e) for e in names])
        if isinstance(request, w.Drop):
            await self._write(store.drop, request.extent)
            self._counts.pop(request.extent, None)
            self.activity.gone(request.extent)
            self._committed.pop(request.extent, None)
            self._wake(request.extent)
            return w.Done(request.rid)
        raise StorageError("invalid_request", f"unexpected frame {type(request).__name__}")

    async def _read(self, request: w.Read) -> w.ReadResult:
        """Records after ``request.after``, waiting up to ``wait_ms`` for some: a new
        commit, a seal or a drop wakes the wait, and on a timer extent so does the next
        record coming due (``until_ms`` moves on with the clock while it waits), so a
        reader that waits long costs nothing until there is something to give it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.wait_ms, MAX_READ_WAIT_MS) / 1000
        asked_ms = time.time() * 1000
        while True:
            event = self._tail_events.setdefault(request.extent, asyncio.Event())
            info = self.store.info(request.extent)
            committed = self._committed.get(request.extent)
            if committed is not None:
                max_seq = committed
            else:  # open: nothing is known to be on every replica yet; sealed: all is
                max_seq = 0 if info.exists and not info.sealed else -1
            until_ms = request.until_ms
            if until_ms:  # a timer read: what came due while it waited is due now
                until_ms += int(time.time() * 1000 - asked_ms)
            batch = await loop.run_in_executor(
                self._reads,
                self.store.read,
                request.extent,
                request.after,
                request.max_count,
                until_ms,
                request.max_bytes,
                max_seq,
            )
            remaining = deadline - loop.time()
            if batch.keys:
                c = self._counts.get(request.extent) or self._counts.setdefault(
                    request.extent, [0, 0, 0, 0]
                )
                c[2] += len(batch.records)
                c[3] += sum(map(len, batch.records))
                self.activity.touch(request.extent)
            if batch.keys or batch.end or remaining <= 0:
                if request.joined:
                    joined = w.join_records(batch.records)
                    return w.ReadResult(request.rid, batch.keys, [], batch.end, joined)
                return w.ReadResult(request.rid, batch.keys, batch.records, batch.end)
            if committed is None and max_seq == 0 and await self._holds_after(request):
                # The commit points live in memory: a replica that restarted knows none
                # for its open extents until the next append to each, which may never
                # come (an idle extent), and it shows none of what it holds meanwhile.
                # A reader left waiting here for MAX_READ_WAIT_MS would miss records
                # another replica shows (seen after a store host restart: messages
                # delivered 10 minutes late); answered soon, it tries the next replica.
                deadline = min(deadline, loop.time() + UNKNOWN_COMMIT_WAIT)
                remaining = deadline - loop.time()
            if until_ms:
                remaining = min(remaining, await self._until_due(request, until_ms, max_seq))
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                pass

    async def _holds_after(self, request: w.Read) -> bool:
        """Whether the replica holds a record after the read's position (shown or not)."""
        peek = await asyncio.get_running_loop().run_in_executor(
            self._reads, self.store.read, request.extent, request.after, 1, 0, 1 << 20, -1
        )
        return bool(peek.keys)

    async def _until_due(self, request: w.Read, until_ms: int, max_seq: int) -> float:
        """Seconds until the next record of a timer extent after the read's position
        comes due for it (a long time when there is none)."""
        peek = await asyncio.get_running_loop().run_in_executor(
            self._reads, self.store.read, request.extent, request.after, 1, 0, 1 << 20, max_seq
        )
        if not peek.keys:
            return MAX_READ_WAIT_MS / 1000
        due_ms = int.from_bytes(peek.keys[0][:8], "big")
        return max(0.001, (due_ms - until_ms) / 1000)
