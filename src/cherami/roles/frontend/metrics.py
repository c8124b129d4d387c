"""Prometheus metrics of a node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from cherami.roles.outputhost.service import OutputHostService


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._published = Counter(
            "cherami_messages_published", "Messages published durably", ["queue"],
            registry=self.registry,
        )  # fmt: skip
        labels = ["queue", "group"]
        self._delivered = Gauge(
            "cherami_group_delivered", "Deliveries since start", labels, registry=self.registry
        )
        self._acked = Gauge(
            "cherami_group_acked", "Acks since start", labels, registry=self.registry
        )
        self._in_flight = Gauge(
            "cherami_group_in_flight", "Deliveries in flight", labels, registry=self.registry
        )
        self._dead = Gauge(
            "cherami_group_dead_lettered",
            "Moved to the DLQ since start",
            labels,
            registry=self.registry,
        )

        self._refused = Counter(
            "cherami_messages_refused", "Messages of publishes refused 429 (throttled, "
            "backlog_full); each was sent again or failed", ["queue", "code"],
            registry=self.registry,
        )  # fmt: skip
        self._lag = Gauge(
            "cherami_group_lag_messages", "Messages a stream-mode group has not committed",
            labels, registry=self.registry,
        )  # fmt: skip
        self._lag_age = Gauge(
            "cherami_group_lag_seconds", "Age of the oldest message a stream-mode group has "
            "not committed", labels, registry=self.registry,
        )  # fmt: skip

    def lag(self, queue: str, group: str, messages: int, seconds: float) -> None:
        self._lag.labels(queue, group).set(messages)
        self._lag_age.labels(queue, group).set(seconds)

    def published(self, queue: str, n: int) -> None:
        self._published.labels(queue).inc(n)

    def refused(self, queue: str, code: str, n: int) -> None:
        self._refused.labels(queue, code).inc(n)

    def render(self, outputs: OutputHostService | None) -> tuple[bytes, str]:
        for consumer in outputs.groups.values() if outputs else ():
            labels = (consumer.group.queue, consumer.group.name)
            self._delivered.labels(*labels).set(consumer.delivered)
            self._acked.labels(*labels).set(consumer.acked)
            self._in_flight.labels(*labels).set(len(consumer.inflight))
            self._dead.labels(*labels).set(consumer.dead_lettered)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
