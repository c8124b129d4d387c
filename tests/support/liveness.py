"""An independent workload and checker for liveness and exclusivity under faults, in the
manner of Jepsen: it knows the cluster only through its public API (HTTP, the streams of
the Python client) and watches the stream frames on the wire itself.

Producers publish unique bodies (``{producer}-{n}``) with retries: HTTP producers retry a
batch until it is acked; a streaming publisher sends the same batch again when its
future fails. Consumers of one competing group ack what they get: stream consumers
(``AsyncClient.consumer``: one connection that must reconnect by itself) and HTTP
consumers (receive + ack).

Every delivery is recorded: body, message id, consumer, the connection it came on, the
wall time it arrived, its ``delivery_count``, and how it was settled (the time the ack or
nack was sent and whether the server accepted it). An HTTP ack answers with its stale
receipts; a stream ack has no positive answer: it is stale when a ``settled`` frame
names its handle, accepted when the server went on after it (a frame arrived on its
connection more than ``ACK_GRACE`` seconds after it was sent, or the client closed the
connection cleanly later: the server reads frames in order and answers the close after
the ack), and *unknown* otherwise (for example when the host was paused or lost).

``History.report`` gives attempted, acked (by the publish), delivered, lost (acked but
never delivered to the application), unexpected, duplicated (delivered more than once),
and **concurrent duplicates**: two deliveries of one message to different consumers
where the later one arrived while the earlier one was still held. A delivery is held
from its arrival until the first of: its ack or nack was sent (the earliest moment the
server can have applied it; a stale or unknown settlement releases it there too, so a
pair is only counted when the overlap is certain), its visibility timeout ran out, or
its stream connection was lost (the client's view; the server redelivers what a
connection held once it is gone). It also counts pairs of deliveries of one message
whose acks were both accepted, the longest stall (the longest time during which no
consumer got anything while some acked message waited for its first delivery) and,
per producer, the longest wait for a publish ack (from the first attempt of a batch to
its ack, retries included)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received
from cherami.errors import CheramiError
from cherami.wire import stream as f

ACK_GRACE = 0.5  # a frame this long after a stream ack shows the server ran past it
CLOSED_TYPES = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                          aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR})  # fmt: skip


def error_kind(err: BaseException) -> str:
    """``transport`` for a request that got no answer (refused, timed out), else the
    API error code the server answered with (``internal`` for a 500)."""
    if isinstance(err.__cause__, aiohttp.ClientError | TimeoutError | OSError):
        return "transport"
    return getattr(err, "code", type(err).__name__)


# --- what is recorded ------------------------------------------------------------------


@dataclass
class Connection:
    """One WebSocket connection of a stream client, as seen on the wire."""

    owner: str
    index: int
    opened: float
    closed: float | None = None
    last_frame: float = 0.0  # when the last binary frame arrived
    closing: bool = False  # the client is closing it (the end of the run)
    by_handle: dict[int, Delivery] = field(default_factory=dict)
    ws: aiohttp.ClientWebSocketResponse | None = field(default=None, repr=False)

    @property
    def close_code(self) -> int | None:
        """The close code (read from the socket: aiohttp sets it after the close frame
        when another task is closing the socket at the same time)."""
        return None if self.ws is None else self.ws.close_code

    @property
    def name(self) -> str:
        return f"{self.owner}#{self.index}"

    def went_on_after(self, sent: float) -> bool:
        """Whether the server certainly read a frame the client sent at ``sent``."""
        if self.last_frame - sent > ACK_GRACE:
            return True
        clean = self.closing and self.close_code == 1000
        return clean and self.closed is not None and self.closed > sent


@dataclass
class Delivery:
    body: str
    msg_id: str
    consumer: str
    via: str  # "stream" or "http"
    at: float  # wall time it arrived at the client
    count: int  # its delivery_count
    conn: Connection | None = None  # stream deliveries: the connection it came on
    seen: bool = False  # handed to the application (stream: taken from the consumer)
    settle: str | None = None  # "ack" or "nack"
    settled_at: float | None = None  # when the settlement was sent
    outcome: str | None = None  # "accepted", "stale" or "unknown" (None: not settled)

    def result(self) -> str | None:
        if self.settle is None:
            return None
        if self.outcome is not None:
            return self.outcome
        # a stream settlement without a stale answer
        assert self.settled_at is not None
        if self.conn is not None and self.conn.went_on_after(self.settled_at):
            return "accepted"
        return "unknown"

    def held_until(self, visibility: float) -> float:
        end = self.at + visibility
        if self.settled_at is not None:
            end = min(end, self.settled_at)
        if self.conn is not None and self.conn.closed is not None:
            end = min(end, self.conn.closed)
        return end


@dataclass
class Producer:
    name: str
    longest_wait: float = 0.0
    batches: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def waited(self, seconds: float) -> None:
        self.batches += 1
        self.longest_wait = max(self.longest_wait, seconds)


@dataclass
class History:
    visibility: float  # the group's visibility timeout
    attempted: set[str] = field(default_factory=set)
    acked: dict[str, float] = field(default_factory=dict)  # body -> publish ack time
    deliveries: list[Delivery] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    producers: dict[str, Producer] = field(default_factory=dict)
    # (operation, error kind) -> how many; e.g. ("ack", "unavailable")
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    # (operation, error kind, started, ended) of every failed request, for windows
    error_log: list[tuple[str, str, float, float]] = field(default_factory=list)
    error_samples: dict[str, str] = field(default_factory=dict)  # "op:kind" -> a message
    consumer_failures: dict[str, str] = field(default_factory=dict)

    def failed(self, op: str, err: BaseException, started: float) -> str:
        kind = error_kind(err)
        self.errors[(op, kind)] += 1
        self.error_log.append((op, kind, started, time.time()))
        self.error_samples.setdefault(f"{op}:{kind}", str(err)[:200])
        return kind

    def producer(self, name: str) -> Producer:
        return self.producers.setdefault(name, Producer(name))

    def published(self, producer: str, bodies: list[str], first: float) -> None:
        """A batch was acked; ``first``: when its first attempt started."""
        now = time.time()
        self.producer(producer).waited(now - first)
        for b in bodies:
            self.acked.setdefault(b, now)

    # -- the checker ------------------------------------------------------------------

    def seen(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.seen]

    def concurrent_pairs(self, by_connection: bool = False) -> list[tuple[Delivery, Delivery]]:
        """Pairs (earlier, later) of deliveries of one body to different consumers (or,
        ``by_connection``, on different connections of one consumer too: one consumer
        connected to several output hosts), the later arriving while the earlier was
        still held."""
        by_body: dict[str, list[Delivery]] = defaultdict(list)
        for d in self.deliveries:
            by_body[d.body].append(d)
        pairs = []
        for ds in by_body.values():
            if len(ds) < 2:
                continue
            ds.sort(key=lambda d: d.at)
            for i, a in enumerate(ds):
                end = a.held_until(self.visibility)
                for b in ds[i + 1 :]:
                    if b.at >= end:
                        break
                    if b.consumer != a.consumer or (by_connection and b.conn is not a.conn):
                        pairs.append((a, b))
        return pairs

    def both_accepted(self) -> int:
        by_body: dict[str, list[Delivery]] = defaultdict(list)
        for d in self.deliveries:
            if d.settle == "ack" and d.result() == "accepted":
                by_body[d.body].append(d)
        return sum(len(v) * (len(v) - 1) // 2 for v in by_body.values())

    def longest_stall(self, since: float | None = None) -> float:
        """The longest time no consumer got anything while an acked message waited for
        its first delivery."""
        first: dict[str, float] = {}
        for d in self.deliveries:
            if d.body not in first or d.at < first[d.body]:
                first[d.body] = d.at
        end_of_run = max([d.at for d in self.deliveries], default=time.time())
        waiting = sorted((t, first.get(body, max(end_of_run, t))) for body, t in self.acked.items())
        intervals: list[list[float]] = []  # union of [published, first delivered)
        for start, stop in waiting:
            if stop <= start:
                continue
            if intervals and start <= intervals[-1][1]:
                intervals[-1][1] = max(intervals[-1][1], stop)
            else:
                intervals.append([start, stop])
        arrivals = sorted(d.at for d in self.deliveries)
        longest = 0.0
        j = 0
        for start, stop in intervals:
            if since is not None and stop < since:
                continue
            last = start if since is None else max(start, since)
            while j < len(arrivals) and arrivals[j] <= last:
                j += 1
            k = j
            while k < len(arrivals) and arrivals[k] < stop:
                longest = max(longest, arrivals[k] - last)
                last = arrivals[k]
                k += 1
            longest = max(longest, stop - last)
        return longest

    def report(self, exclude: set[str] | None = None) -> dict[str, Any]:
        """The accounting; ``exclude``: acked bodies not expected to be delivered (for
        example those published into a queue that was then deleted)."""
        seen = Counter(d.body for d in self.seen())
        acked = set(self.acked) - (exclude or set())
        pairs = self.concurrent_pairs()
        return {
            "attempted": len(self.attempted),
            "acked": len(acked),
            "delivered": len(seen),
            "deliveries": len(self.deliveries),
            "lost": len(acked - set(seen)),
            "unexpected": len(set(seen) - self.attempted),
            "duplicated": sum(1 for n in seen.values() if n > 1),
            "concurrent_duplicates": len(pairs),
            "concurrent_bodies": len({a.body for a, _ in pairs}),
            "both_acks_accepted": self.both_accepted(),
            "settlements": dict(Counter(d.result() for d in self.deliveries if d.settle)),
            "longest_stall_s": round(self.longest_stall(), 2),
            "longest_publish_wait_s": {
                p.name: round(p.longest_wait, 2) for p in self.producers.values()
            },
            "errors": {f"{op}:{kind}": n for (op, kind), n in sorted(self.errors.items())},
            "close_codes": dict(Counter(c.close_code for c in self.connections if c.closed)),
        }

    def describe_pairs(self, limit: int = 5) -> list[str]:
        out = []
        for a, b in self.concurrent_pairs()[:limit]:
            out.append(
                f"{a.body}: {a.consumer}({a.via} count {a.count} at {a.at:.3f}, "
                f"{a.settle or 'unsettled'} {a.result()} at {a.settled_at}) then "
                f"{b.consumer}({b.via} count {b.count} at {b.at:.3f}, +{b.at - a.at:.3f}s)"
            )
        return out

    def describe_duplicates(self, limit: int = 3) -> list[str]:
        """The deliveries of a few bodies delivered more than once."""
        by_body: dict[str, list[Delivery]] = defaultdict(list)
        for d in self.seen():
            by_body[d.body].append(d)
        out = []
        for body, ds in by_body.items():
            if len(ds) > 1 and len(out) < limit:
                ds.sort(key=lambda d: d.at)
                out.append(f"{body}: " + "; ".join(
                    f"{d.consumer}{'#' + str(d.conn.index) if d.conn else ''} {d.msg_id} "
                    f"count {d.count} +{d.at - ds[0].at:.3f}s {d.settle} {d.result()}"
                    for d in ds
                ))  # fmt: skip
        return out

    def lost_bodies(self, exclude: set[str] | None = None, limit: int = 10) -> list[str]:
        seen = {d.body for d in self.seen()}
        return sorted(set(self.acked) - (exclude or set()) - seen)[:limit]


# --- a client whose stream connections are watched on the wire -------------------------


class _TapWS(aiohttp.ClientWebSocketResponse):
    """Sees every frame a stream client receives: deliveries, stale settlements, the
    close. Set ``_tap`` on a subclass."""

    _tap: Tap

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tap_conn = self._tap.opened()
        self._tap_conn.ws = self

    async def receive(self, *args: Any, **kwargs: Any) -> aiohttp.WSMessage:
        msg = await super().receive(*args, **kwargs)
        if msg.type == aiohttp.WSMsgType.BINARY:
            self._tap_conn.last_frame = time.time()
            self._tap.frame(self._tap_conn, msg.data)
        elif msg.type in CLOSED_TYPES and self._tap_conn.closed is None:
            self._tap_conn.closed = time.time()
        return msg


class Tap:
    """The connections of one stream client (a consumer or a publisher)."""

    def __init__(self, history: History, owner: str) -> None:
        self.history = history
        self.owner = owner
        self.conns: list[Connection] = []
        self.frames = 0

    def opened(self) -> Connection:
        conn = Connection(self.owner, len(self.conns), time.time())
        self.conns.append(conn)
        self.history.connections.append(conn)
        return conn

    @property
    def first(self) -> Connection | None:
        return self.conns[0] if self.conns else None

    @property
    def current(self) -> Connection | None:
        return self.conns[-1] if self.conns else None

    def frame(self, conn: Connection, data: bytes) -> None:
        self.frames += 1
        try:
            frame = f.decode_server(data)
        except msgspec.DecodeError:
            return
        if isinstance(frame, f.Deliver):
            now = time.time()
            for m in frame.messages:
                d = Delivery(
                    m.body.decode(errors="replace"), m.id, self.owner, "stream", now,
                    m.delivery_count, conn,
                )  # fmt: skip
                conn.by_handle[m.handle] = d
                self.history.deliveries.append(d)
        elif isinstance(frame, f.Settled) and frame.kind in ("ack", "nack"):
            for handle in frame.stale:
                d = conn.by_handle.get(handle)
                if d is not None:
                    d.outcome = "stale"

    def delivery(self, m: Received) -> Delivery | None:
        """The recorded delivery of a message the application took from the consumer."""
        for conn in reversed(self.conns):
            d = conn.by_handle.get(m.handle or 0)
            if d is not None and d.msg_id == m.id:
                return d
        return None

    def closing(self) -> None:
        """The client is about to close its current connection itself."""
        if self.conns:
            self.conns[-1].closing = True

    def closes(self) -> list[int | None]:
        return [c.close_code for c in self.conns if c.closed is not None]

    def closes_since(self, moment: float) -> list[int | None]:
        """The close codes of connections that closed at ``moment`` or later, in order."""
        ended = sorted((c for c in self.conns if c.closed is not None), key=lambda c: c.closed or 0)
        return [c.close_code for c in ended if c.closed is not None and c.closed >= moment]


class TapClient(AsyncClient):
    """An AsyncClient whose stream connections report to a Tap."""

    def __init__(self, url: str, tap: Tap, timeout: float = 30.0) -> None:
        super().__init__(url, timeout=timeout)
        self.tap = tap
        self._ws_class = type("TapWS", (_TapWS,), {"_tap": tap})

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, ws_response_class=self._ws_class
            )
        return self._session


# --- the workload ----------------------------------------------------------------------


class Workload:
    """Producers and consumers of one queue and one competing group. Start tasks with
    ``start_*``; ``stop_producing`` / ``stop_consuming`` end them."""

    def __init__(
        self, url: str, queue: str, group: str, visibility: float, batch: int = 20,
        pace: float = 0.02, client_timeout: float = 30.0,
    ) -> None:  # fmt: skip
        self.url = url
        self.queue = queue
        self.group = group
        self.batch = batch
        self.pace = pace  # seconds between batches of one producer
        self.client_timeout = client_timeout
        self.history = History(visibility)
        self.producing = asyncio.Event()  # set: producers publish; clear: they idle
        self.producing.set()
        self.stopped_producing = asyncio.Event()
        self.stopped_consuming: dict[str, asyncio.Event] = {}
        self.producer_tasks: list[asyncio.Task[None]] = []
        self.consumer_tasks: dict[str, asyncio.Task[None]] = {}
        self.taps: dict[str, Tap] = {}
        self.prefix = ""  # prepended to every body from now on
        self._serial = itertools.count()

    # producers
    def _bodies(self, name: str) -> list[str]:
        return [f"{self.prefix}{name}-{next(self._serial)}" for _ in range(self.batch)]

    def start_http_producer(self, name: str) -> None:
        self.producer_tasks.append(asyncio.create_task(self._http_producer(name)))

    def start_stream_producer(self, name: str, max_in_flight: int = 4) -> None:
        self.producer_tasks.append(asyncio.create_task(self._stream_producer(name, max_in_flight)))

    async def _idle(self) -> bool:
        """Wait while production is paused; False once it is to stop."""
        while not self.producing.is_set():
            if self.stopped_producing.is_set():
                return False
            await asyncio.sleep(0.05)
        return not self.stopped_producing.is_set()

    async def _http_producer(self, name: str) -> None:
        h = self.history
        p = h.producer(name)
        async with AsyncClient(self.url, timeout=self.client_timeout) as client:
            while await self._idle():
                bodies = self._bodies(name)
                h.attempted.update(bodies)
                first = time.time()
                while True:  # the same batch until it is acked
                    started = time.time()
                    try:
                        await client.publish(self.queue, bodies)
                    except CheramiError as err:
                        p.failures[h.failed("publish", err, started)] += 1
                        if self.stopped_producing.is_set() and time.time() - first > 60:
                            break
                        await asyncio.sleep(0.2)
                        continue
                    h.published(name, bodies, first)
                    break
                await asyncio.sleep(self.pace)

    async def _stream_producer(self, name: str, max_in_flight: int) -> None:
        """Pipelined: up to ``max_in_flight`` batches await their acks; a batch whose
        future fails is sent again (on the same publisher: it reconnects by itself)."""
        h = self.history
        p = h.producer(name)
        tap = self.taps[name] = Tap(h, name)
        slots = asyncio.Semaphore(max_in_flight)
        pending: set[asyncio.Task[None]] = set()
        gone = asyncio.Event()  # the queue is gone: send nothing more, wait for the close
        async with TapClient(self.url, tap, timeout=self.client_timeout) as client:
            publisher = client.publisher(self.queue, max_in_flight=max_in_flight)
            try:
                await publisher.__aenter__()
            except CheramiError as err:
                h.consumer_failures[name] = f"open: {err!r}"
                return

            async def one(bodies: list[str]) -> None:
                first = time.time()
                try:
                    while not gone.is_set():
                        started = time.time()
                        try:
                            await asyncio.wait_for(publisher.publish(bodies), 60)
                        except (CheramiError, TimeoutError) as err:
                            kind = h.failed("stream-publish", err, started)
                            p.failures[kind] += 1
                            if kind == "queue_not_found":
                                gone.set()
                            if self.stopped_producing.is_set():
                                return
                            await asyncio.sleep(0.2)
                            continue
                        h.published(name, bodies, first)
                        return
                finally:
                    slots.release()

            try:
                while await self._idle() and not gone.is_set():
                    await slots.acquire()
                    bodies = self._bodies(name)
                    h.attempted.update(bodies)
                    task = asyncio.create_task(one(bodies))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    await asyncio.sleep(self.pace)
                # the publisher stays open until the workload stops: what the server does
                # with the stream meanwhile (a close code) is seen by the tap
                await self.stopped_producing.wait()
                await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 70)
            finally:
                for task in pending:
                    task.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(publisher.close(), 10)

    async def stop_producers(self) -> None:
        self.producing.set()
        self.stopped_producing.set()
        await asyncio.gather(*self.producer_tasks, return_exceptions=True)

    # consumers
    def start_stream_consumer(self, name: str, credit: int = 500) -> None:
        self.stopped_consuming[name] = asyncio.Event()
        self.consumer_tasks[name] = asyncio.create_task(self._stream_consumer(name, credit))

    def start_http_consumer(self, name: str, max_messages: int = 50) -> None:
        self.stopped_consuming[name] = asyncio.Event()
        self.consumer_tasks[name] = asyncio.create_task(self._http_consumer(name, max_messages))

    async def _stream_consumer(self, name: str, credit: int) -> None:
        """One consumer object for the whole run: it must get over every fault by itself
        (it is never opened again by the workload)."""
        h = self.history
        stop = self.stopped_consuming[name]
        tap = self.taps[name] = Tap(h, name)
        async with TapClient(self.url, tap, timeout=self.client_timeout) as client:
            consumer = client.consumer(self.queue, self.group, credit=credit)
            try:
                await consumer.open()
            except CheramiError as err:
                h.consumer_failures[name] = f"open: {err!r}"
                return
            try:
                while not stop.is_set():
                    try:
                        got = await consumer.get_batch(1000, timeout=0.5)
                    except CheramiError as err:  # it gave up: recorded, never reopened
                        h.failed("consume", err, time.time())
                        h.consumer_failures[name] = repr(err)
                        return
                    now = time.time()
                    for m in got:
                        d = tap.delivery(m)
                        if d is None:  # not seen on the wire: cannot happen
                            d = Delivery(m.text, m.id, name, "stream", now, m.delivery_count)
                            h.deliveries.append(d)
                        d.seen = True
                        d.settle, d.settled_at = "ack", now
                    if got:
                        consumer.ack(*got)
            finally:
                tap.closing()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.close(), 10)

    async def _http_consumer(self, name: str, max_messages: int) -> None:
        h = self.history
        stop = self.stopped_consuming[name]
        async with AsyncClient(self.url, timeout=self.client_timeout) as client:
            while not stop.is_set():
                started = time.time()
                try:
                    got = await client.receive(
                        self.queue, self.group, max_messages=max_messages, wait_seconds=1
                    )
                except CheramiError as err:
                    h.failed("receive", err, started)
                    await asyncio.sleep(0.2)
                    continue
                now = time.time()
                ds = [
                    Delivery(m.text, m.id, name, "http", now, m.delivery_count, seen=True)
                    for m in got
                ]
                h.deliveries.extend(ds)
                if got:
                    await self.http_settle(client, "ack", got, ds)

    async def http_settle(
        self, client: AsyncClient, kind: str, got: list[Received], ds: list[Delivery],
        delay: float = 0.0,
    ) -> None:  # fmt: skip
        h = self.history
        sent = time.time()
        for d in ds:
            d.settle, d.settled_at = kind, sent
        receipts = [m.receipt or "" for m in got]
        try:
            if kind == "ack":
                reply = await client.ack(self.queue, self.group, receipts)
            else:
                reply = await client.nack(self.queue, self.group, receipts, delay_seconds=delay)
        except CheramiError as err:
            h.failed(kind, err, sent)
            for d in ds:
                d.outcome = "unknown"
            return
        stale = set(reply.get("stale", ()))
        for m, d in zip(got, ds, strict=True):
            d.outcome = "stale" if m.receipt in stale else "accepted"

    async def stop_consumers(self, names: list[str] | None = None) -> None:
        for name in names or list(self.consumer_tasks):
            self.stopped_consuming[name].set()
        await asyncio.gather(
            *(self.consumer_tasks[n] for n in names or list(self.consumer_tasks)),
            return_exceptions=True,
        )

    async def until_delivered(self, timeout: float, exclude: set[str] | None = None) -> bool:
        """Wait until every acked body was handed to a consumer; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {d.body for d in self.history.deliveries if d.seen}
            if not (set(self.history.acked) - (exclude or set()) - seen):
                return True
            await asyncio.sleep(0.2)
        return False

    def delivered_to(self, names: set[str], after: float) -> int:
        """How many deliveries the named consumers took after ``after``."""
        return sum(1 for d in self.history.seen() if d.consumer in names and d.at > after)
