"""Bindings every process sees. kombu keeps a process's exchanges and bindings in memory;
these are also written down in Cherami, as queues and groups, so that a message one
process publishes reaches the queues another bound:

- fanout exchange E: the queue ``kombu.fanout.E``; each queue bound to it is a group of
  it, named as that queue's Cherami queue, and is consumed through that group;
- direct exchange E, routing key K: a group (the bound queue's Cherami name) of the queue
  ``kombu.bind.E.K``;
- topic exchange E: a group ``HEX(PATTERN)-QUEUE`` of the queue ``kombu.topic.E``.

Every group starts from the moment of binding (``start_from: latest``), as a newly bound
AMQP queue does."""

# mypy: disallow-untyped-calls=False
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from cherami.celery.mapping import ROUTE_TTL, cherami_name, fanout_queue, route_queue
from cherami.errors import NotFound

if TYPE_CHECKING:
    from cherami.celery.transport import Transport

LATEST = {"start_from": "latest"}
TOPIC_PREFIX = "kombu.topic."


def topic_queue(exchange: str) -> str:
    return cherami_name(f"{TOPIC_PREFIX}{exchange}")


def topic_group(routing_key: str, queue: str) -> str | None:
    """The group of a topic binding: its pattern in hex, ``-``, the queue's Cherami name
    (None when that is over 128 characters: the binding stays this process's own)."""
    group = f"{routing_key.encode().hex()}-{cherami_name(queue)}"
    return group if len(group) <= 128 else None


def topic_pattern(routing_key: str) -> re.Pattern[str]:
    """A topic binding's key as kombu matches it (``*`` a word, ``#`` anything)."""
    words = [{"*": r".*?[^\.]", "#": r".*?"}.get(w, re.escape(w)) for w in routing_key.split(".")]
    return re.compile("^" + r"\.".join(words) + "$")


class Bindings:
    """A connection's view of the bindings written down in Cherami (cached ROUTE_TTL
    seconds, so a new binding elsewhere is seen within that)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.fanout_of: dict[str, str] = {}  # a queue bound to a fanout exchange -> it
        self._cache: dict[str, tuple[float, Any]] = {}

    def bind(self, kind: str, exchange: str, routing_key: str, queue: str,
             queue_config: dict[str, Any], group_config: dict[str, Any]) -> None:  # fmt: skip
        ensure = self.transport.ensure
        if kind == "fanout":
            self.fanout_of[queue] = exchange
            group = {**group_config, **LATEST}
            ensure(fanout_queue(exchange), cherami_name(queue), queue_config, group)
        elif kind == "direct":
            ensure(route_queue(exchange, routing_key), cherami_name(queue), {}, LATEST)
        elif kind == "topic" and (group_name := topic_group(routing_key, queue)) is not None:
            ensure(topic_queue(exchange), group_name, {}, LATEST)

    def unbind(self, kind: str, exchange: str, routing_key: str, queue: str) -> None:
        """Take a binding back (its queue is being deleted)."""
        client, name = self.transport.cherami, cherami_name(queue)
        if kind == "fanout":
            self.fanout_of.pop(queue, None)
            _ignore_missing(lambda: client.delete_group(fanout_queue(exchange), name))
        elif kind == "direct":
            route = route_queue(exchange, routing_key)
            _ignore_missing(lambda: client.delete_group(route, name))
            self.transport.forget(route)
            try:
                if not client.list_groups(route, limit=1):
                    client.delete_queue(route)
            except NotFound:
                pass
        elif kind == "topic" and (group := topic_group(routing_key, queue)) is not None:
            _ignore_missing(lambda: client.delete_group(topic_queue(exchange), group))
            self.transport.forget(topic_queue(exchange), group)

    def source(self, queue: str, group: str) -> tuple[str, str]:
        """The Cherami queue and group a kombu queue is consumed through."""
        exchange = self.fanout_of.get(queue)
        if exchange is None:
            return cherami_name(queue), group
        return fanout_queue(exchange), cherami_name(queue)

    def direct(self, exchange: str, routing_key: str) -> list[str]:
        """The Cherami queues bound to a direct exchange's key (a binding made a moment
        ago is looked for again rather than taken from the cache as missing)."""
        route = route_queue(exchange, routing_key)
        found: list[str] = self._cached(route, lambda: self._groups(route), keep_empty=False)
        return found

    def topic(self, exchange: str, routing_key: str) -> list[str]:
        """The Cherami queues whose topic bindings match ``routing_key``."""
        queue = topic_queue(exchange)
        bound: list[tuple[re.Pattern[str], str]] = self._cached(queue, lambda: self._topics(queue))
        return sorted({name for pattern, name in bound if pattern.match(routing_key)})

    def is_fanout(self, exchange: str) -> bool:
        """Whether some process made ``exchange`` a fanout exchange (its queue exists)."""
        queue = fanout_queue(exchange)
        found: bool = self._cached("fanout:" + queue, lambda: self._exists(queue), keep_empty=True)
        return found

    def _cached(self, key: str, read: Any, keep_empty: bool = True) -> Any:
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now and (keep_empty or cached[1]):
            return cached[1]
        value = read()
        self._cache[key] = (now + ROUTE_TTL, value)
        return value

    def _groups(self, queue: str) -> list[str]:
        try:
            return [g["name"] for g in self.transport.cherami.list_groups(queue)]
        except NotFound:
            return []

    def _topics(self, queue: str) -> list[tuple[re.Pattern[str], str]]:
        bound = []
        for group in self._groups(queue):
            key, _, name = group.partition("-")
            try:
                bound.append((topic_pattern(bytes.fromhex(key).decode()), name))
            except ValueError:
                continue  # not a binding written here
        return bound

    def _exists(self, queue: str) -> bool:
        try:
            self.transport.cherami.get_queue(queue)
        except NotFound:
            return False
        return True


def _ignore_missing(call: Any) -> None:
    try:
        call()
    except NotFound:
        pass
