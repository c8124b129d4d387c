"""Prometheus metrics of a process, read from live state at each scrape: the series of a
deleted queue or group are gone with it. Each process reports what it holds: the
publishes it accepted, the groups its output host serves, the appends its input host
made, its metadata calls; a process that manages extents (a node, a cluster's
controllers) also the queues' extents and the hosts table. docs/operations.md §6 lists
every series."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric

from cherami.errors import CheramiError
from cherami.metadata.models import FAILING, OPEN, SEALED, Extent, Queue
from cherami.roles.frontend.lag import stream_lags
from cherami.telemetry import Histogram, counter, gauge, histogram, process_families, render

if TYPE_CHECKING:
    from cherami.roles.frontend.context import Frontend

QG = ["queue", "group"]


class Metrics:
    """What the frontend counts itself (publishes); the rest is read at scrape time."""

    def __init__(self) -> None:
        self._published: dict[str, int] = {}
        self._refused: dict[tuple[str, str], int] = {}
        self._publish_seconds: dict[str, Histogram] = {}
        self.connections: Callable[[], int] = lambda: 0  # open streams (build_app sets it)
        self.receiving = 0  # receive requests being answered here now (long polls too)

    def published(self, queue: str, n: int, seconds: float | None = None) -> None:
        self._published[queue] = self._published.get(queue, 0) + n
        if seconds is not None:
            hist = self._publish_seconds.get(queue) or self._publish_seconds.setdefault(
                queue, Histogram()
            )
            hist.observe(seconds)

    def forget(self, queue: str) -> None:
        """The queue was deleted: its counts go (a queue made again under its name
        counts from 0)."""
        self._published.pop(queue, None)
        self._publish_seconds.pop(queue, None)
        for key in [k for k in self._refused if k[0] == queue]:
            del self._refused[key]

    def refused(self, queue: str, code: str, n: int) -> None:
        self._refused[queue, code] = self._refused.get((queue, code), 0) + n

    async def scrape(self, f: Frontend) -> tuple[bytes, str]:
        families = await _Scrape(self, f).run()
        # the text in a thread: the loop goes on between its slices (0.4 s of CPU at
        # 10,000 queues), heartbeats and requests are not held up behind it
        return await asyncio.to_thread(render, families)


class _Scrape:
    def __init__(self, metrics: Metrics, f: Frontend) -> None:
        self.m = metrics
        self.f = f
        self.out: list[Metric] = []

    async def run(self) -> list[Metric]:
        """Reads what it shows in bulk: the queues, every live extent, and each store
        host's answer for the extents it holds, once each; only groups with dead
        letters or in stream mode cost a read more (a scrape once read every queue's
        extents and asked a store host about every extent, one at a time)."""
        metadata = self.f.r.metadata
        queues = {q.name: q for q in await metadata.list_queues() if q.dlq_of is None}
        self.extents: dict[str, list[Extent]] = {}
        for extent in await metadata.list_extents_in((OPEN, FAILING, SEALED)):
            self.extents.setdefault(extent.queue, []).append(extent)
        self._publishes(queues)
        if self.f.r.controller.manage_extents:
            await self._queues(queues)
            await self._hosts()
        await self._groups(queues)
        await self._stream_lags()
        self._process()
        return self.out

    def _publishes(self, queues: dict[str, Queue]) -> None:
        m = self.m
        published = counter(
            "cherami_messages_published", "Messages published durably through the API "
            "(HTTP and streams) by this process since it started", ["queue"],
        )  # fmt: skip
        for queue, n in m._published.items():
            if queue in queues:
                published.add_metric([queue], n)
        refused = counter(
            "cherami_messages_refused", "Messages of publishes refused 429 (throttled, "
            "backlog_full) by this process since it started", ["queue", "code"],
        )  # fmt: skip
        for (queue, code), n in m._refused.items():
            if queue in queues:
                refused.add_metric([queue, code], n)
        latency = histogram(
            "cherami_publish_latency_seconds", "Time from a publish request's arrival to "
            "its answer (every message durable on every replica)", ["queue"],
            (([q], h) for q, h in m._publish_seconds.items() if q in queues),
        )  # fmt: skip
        self.out += [published, refused, latency]

    async def _queues(self, queues: dict[str, Queue]) -> None:
        opened = gauge("cherami_queue_open_extents", "Open extents of the queue", ["queue"])
        sealed = gauge("cherami_queue_sealed_extents", "Sealed extents of the queue", ["queue"])
        stored = gauge(
            "cherami_queue_stored_bytes", "Bytes the queue's extents hold (one replica)", ["queue"]
        )
        asked = [e for name in queues for e in self.extents.get(name, ())]
        infos = await self.f.r.stores.infos(asked)  # an extent no replica answers: left out
        for name in queues:
            extents = self.extents.get(name, [])
            size = sum(infos[e.id].bytes for e in extents if e.id in infos)
            opened.add_metric([name], sum(e.status in (OPEN, FAILING) for e in extents))
            sealed.add_metric([name], sum(e.status == SEALED for e in extents))
            stored.add_metric([name], size)
        self.out += [opened, sealed, stored]

    async def _hosts(self) -> None:
        up = gauge(
            "cherami_host_up", "1 while the host heartbeats (within timing.dead_after), else 0",
            ["host", "role", "zone"],
        )  # fmt: skip
        p99 = gauge(
            "cherami_host_append_p99_seconds", "A store host's p99 synced append round "
            "(write and fsync), from its latest load report", ["host"],
        )  # fmt: skip
        now = time.time()
        for host in await self.f.r.metadata.list_hosts(None, alive_within=None):
            alive = now - host.heartbeat_at <= self.f.ctx.timing.dead_after
            up.add_metric([host.id, host.role, host.zone or ""], 1.0 if alive else 0.0)
            if alive and host.load is not None and host.load.append_p99_ms is not None:
                p99.add_metric([host.id], host.load.append_p99_ms / 1000)
        self.out += [up, p99]

    async def _groups(self, queues: dict[str, Queue]) -> None:
        outputs = self.f.r.outputs
        states = await outputs.states(queues) if outputs else []
        g: dict[str, Any] = {
            "backlog": gauge(
                "cherami_group_backlog_messages",
                "Messages published and not yet acked by the group", QG,
            ),
            "in_flight": gauge(
                "cherami_group_in_flight_messages",
                "Deliveries waiting for an ack, a nack or their visibility timeout", QG,
            ),
            "oldest": gauge(
                "cherami_group_oldest_unacked_age_seconds",
                "Age (since publish) of the oldest message the group has not acked", QG,
            ),
            "dlq": gauge("cherami_group_dlq_messages", "Messages in the group's DLQ", QG),
        }  # fmt: skip
        counters = {
            "delivered": "Deliveries (first and repeated) since the group was loaded here",
            "acked": "Acks since the group was loaded here",
            "nacked": "Nacks since the group was loaded here",
            "redelivered": "Deliveries after the first since the group was loaded here",
            "dead_lettered": "Messages moved to the DLQ since the group was loaded here",
            "expired": "Messages never delivered, their TTL passed, since the group was "
            "loaded here",
            "cancelled": "Delayed messages never delivered, cancelled, since the group was "
            "loaded here",
        }
        c = {k: counter(f"cherami_group_{k}", doc, QG) for k, doc in counters.items()}
        for state in states:
            labels = [state.group.queue, state.group.name]
            g["backlog"].add_metric(labels, state.backlog)
            g["in_flight"].add_metric(labels, state.in_flight)
            g["oldest"].add_metric(labels, state.oldest_unacked_age_seconds)
            g["dlq"].add_metric(labels, await self._dlq_depth(state.group.dlq))
            for key, family in c.items():
                family.add_metric(labels, getattr(state, key))
        e2e = histogram(
            "cherami_group_end_to_end_latency_seconds",
            "Time from a message's publish to its ack by the group", QG,
            (([st.group.queue, st.group.name], st.end_to_end) for st in states),
        )  # fmt: skip
        self.out += [*g.values(), *c.values(), e2e]
        if outputs:
            loaded = gauge(
                "cherami_output_loaded_groups", "Consumer groups loaded in this process's "
                "output host (a node loads a group at its first consumer and unloads it "
                "when left idle: timing.group_idle_unload)", [],
            )  # fmt: skip
            loaded.add_metric([], outputs.loaded_groups())
            self.out.append(loaded)

    async def _dlq_depth(self, dlq: str) -> int:
        if dlq not in self.extents:
            return 0  # no dead letter yet: the DLQ has no extent (it opens one at its first)
        try:
            ranges = await self.f.r.controller.dlq_ranges(dlq)
        except CheramiError:
            return 0
        return sum(max(0, last - level.acked) for _, level, last in ranges)

    async def _stream_lags(self) -> None:
        messages = gauge(
            "cherami_group_lag_messages", "Messages a stream-mode group has not committed", QG
        )
        seconds = gauge(
            "cherami_group_lag_seconds", "Age of the oldest message a stream-mode group "
            "has not committed", QG,
        )  # fmt: skip
        for group, lag in await stream_lags(self.f.r.metadata, self.f.r.stores):
            messages.add_metric([group.queue, group.name], lag.messages)
            seconds.add_metric([group.queue, group.name], lag.seconds)
        self.out += [messages, seconds]

    def _process(self) -> None:
        connections = gauge(
            "cherami_stream_connections", "Open publish and consume WebSocket streams", []
        )
        connections.add_metric([], self.m.connections())
        receiving = gauge(
            "cherami_waiting_receive_requests",
            "Receive requests this process is answering now (long polls waiting)", [],
        )  # fmt: skip
        receiving.add_metric([], self.m.receiving)
        self.out += [*process_families(), connections, receiving]
