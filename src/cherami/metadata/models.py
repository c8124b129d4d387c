"""Metadata records: queues, consumer groups, extents, ack levels and hosts."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from cherami.errors import InvalidName, InvalidRequest

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # a queue's or group's name
_NAME = re.compile(NAME_PATTERN)

Seconds = Annotated[float, msgspec.Meta(ge=0, le=365 * 86400)]
Extents = Annotated[int, msgspec.Meta(ge=1, le=64)]
# a queue's min_extents: 0 only for a dead-letter queue that nothing was moved to yet (it
# holds no extent until its first dead letter; the controller refuses 0 for any other)
MinExtents = Annotated[int, msgspec.Meta(ge=0, le=64)]
TargetRate = Annotated[float, msgspec.Meta(gt=0, le=10_000_000)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=1e12)]  # per second (or a burst); 0: none

OPEN, SEALED, CONSUMED, DELETED = "open", "sealed", "consumed", "deleted"
FAILING = "failing"  # open, but its input host saw a replica fail: the controller seals it
COMPETING, STREAM = "competing", "stream"


def check_competing(group: Group) -> Group:
    """The group, if receives and consume streams serve it: a stream-mode group is read
    by offsets (the Spark source); a receive of one answered nothing, forever."""
    if group.config.type == STREAM:
        raise InvalidRequest(
            f"group {group.name} is a stream-mode group: it is read by offsets (the Spark "
            "source, docs/spark.md), not by receive or a consume stream"
        )
    return group


def check_name(kind: str, name: str) -> str:
    if not _NAME.fullmatch(name):  # match with $ took a trailing newline
        raise InvalidName(
            f"{kind} name {name!r} must be 1-128 characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return name


class QueueConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["ap", "cp"] = "ap"
    replicas: Annotated[int, msgspec.Meta(ge=1, le=9)] | None = None
    # fewest replicas a new extent may have while store hosts are down (None: replicas)
    min_replicas: Annotated[int, msgspec.Meta(ge=1, le=9)] | None = None
    # open plain extents the queue keeps at least (None: 1 on a node, 2 in a cluster,
    # filled in when the queue is created) and at most (scaling by load opens up to it)
    min_extents: MinExtents | None = None
    max_extents: Extents = 16
    extent_target_rate: TargetRate = 20_000  # msgs/s one extent should carry
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] = 0.0
    retention_seconds: Annotated[float, msgspec.Meta(ge=1, le=365 * 86400)] = 7 * 86400.0
    consumed_retention_seconds: Seconds = 0.0
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1, le=8 << 20)] = 1 << 20
    # a message whose dedup_id the queue took this recently is not stored again (0: off)
    dedup_window_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 600.0
    # publish limits (0: none): messages and body bytes per second, token buckets that
    # hold up to the bursts (0: one second's worth); and the unconsumed bytes beyond
    # which publishes are refused (docs/api.md, "Throttling and back-pressure")
    publish_rate: Rate = 0.0
    publish_burst: Rate = 0.0
    publish_bytes_rate: Rate = 0.0
    publish_bytes_burst: Rate = 0.0
    max_backlog_bytes: Annotated[int, msgspec.Meta(ge=0, le=1 << 60)] = 0


class QueuePatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    min_replicas: Annotated[int, msgspec.Meta(ge=1, le=9)] | None = None
    min_extents: Extents | None = None
    max_extents: Extents | None = None
    extent_target_rate: TargetRate | None = None
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] | None = None
    retention_seconds: Annotated[float, msgspec.Meta(ge=1, le=365 * 86400)] | None = None
    consumed_retention_seconds: Seconds | None = None
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1, le=8 << 20)] | None = None
    dedup_window_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] | None = None
    publish_rate: Rate | None = None
    publish_burst: Rate | None = None
    publish_bytes_rate: Rate | None = None
    publish_bytes_burst: Rate | None = None
    max_backlog_bytes: Annotated[int, msgspec.Meta(ge=0, le=1 << 60)] | None = None


class Queue(msgspec.Struct, kw_only=True):
    name: str
    config: QueueConfig
    created_at: float
    dlq_of: str | None = None  # "queue/group" when this queue is that group's DLQ
    # whether the queue keeps timer extents (for delayed messages) beside its plain ones:
    # set when it is made with a delay or takes its first delayed message, never unset
    timers: bool = False
    # whether the queue took a keyed message (an input host marks it before writing its
    # first one): in a cluster each of its groups is then served whole by one output
    # host (docs/design/ordering-keys.md, "A cluster"); never unset
    keyed: bool = False


QueueFlag = Literal["timers", "keyed"]  # what MetadataStore.mark_queue sets
QUEUE_FLAGS = {"timers": "timers", "keyed": "keyed"}  # each one's column


def min_plain(queue: Queue) -> int:
    """The open plain extents the queue keeps at least (0: a dead-letter queue nothing
    was moved to yet)."""
    return 1 if queue.config.min_extents is None else queue.config.min_extents


def wants_timers(queue: Queue) -> bool:
    """Whether the queue keeps a timer extent beside its plain ones: once it was made
    with a delay or took a delayed message (an input host asks for one then:
    ``MetadataStore.mark_queue``); never a dead-letter queue (only the output host
    publishes there, never a delayed message)."""
    return queue.dlq_of is None and queue.timers


class GroupConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    visibility_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=12 * 3600)] = 60.0
    max_delivery_count: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 10
    start_from: str = "earliest"
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] = 0.0
    type: Literal["competing", "stream"] = "competing"


class GroupPatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    visibility_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=12 * 3600)] | None = None
    max_delivery_count: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] | None = None


class Group(msgspec.Struct, kw_only=True):
    queue: str
    name: str
    config: GroupConfig
    created_at: float
    start_ms: int  # messages enqueued before this are skipped (0: from the earliest)
    dlq: str  # name of the group's dead-letter queue


class Extent(msgspec.Struct, kw_only=True):
    id: str
    queue: str
    kind: str  # wire.store.PLAIN or TIMER
    status: str
    input_host: str
    stores: list[str]
    created_at: float
    sealed_seq: int | None = None
    predecessor: str | None = None


class AckLevel(msgspec.Struct, kw_only=True):
    """How far one group has consumed one extent.

    ``level`` is the storage key at or below which every message is acked (empty:
    nothing yet) and ``acked`` how many messages that is. ``limit`` bounds a range of a
    dead-letter extent merged back into the group (the group reads it up to that key).
    """

    queue: str
    group: str
    extent: str
    level: bytes = b""
    acked: int = 0
    limit: bytes | None = None


class Redelivery(msgspec.Struct, kw_only=True):
    """A message of one group that was delivered and not acked ("parked"): how many
    deliveries it has had (counted before each one starts) and when it may be
    delivered again (ms since the epoch). ``key`` is its storage key in ``extent``.
    Written only on redelivery and nack, never on a first delivery."""

    queue: str
    group: str
    extent: str
    key: bytes
    count: int = 0
    due_ms: int = 0


class Fence(msgspec.Struct, frozen=True):
    """A lease's name and the epoch its holder took it in. A write that carries a fence
    is refused (``Fenced``) once the lease has passed to another holder: the epoch grows
    each time the holder changes, never on a renewal."""

    lease: str
    epoch: int


class ExtentLoad(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One extent's traffic on one host over a load report's interval, per second:
    in (appended: input and store hosts) and out (delivered: output hosts; read:
    store hosts)."""

    msgs_in: float = 0.0
    bytes_in: float = 0.0
    msgs_out: float = 0.0
    bytes_out: float = 0.0


class LoadReport(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a host carried over the last ``interval`` seconds, computed every 2 s and
    sent with its heartbeats. A field a role cannot measure is left out (None)."""

    at: float = 0.0  # when it was computed (seconds since the epoch)
    interval: float = 0.0
    cpu: float = 0.0  # process CPU seconds per wall second (1.0: one core busy)
    open_extents: int = 0
    connections: int | None = None  # open streams (API roles) or store connections
    disk_free_bytes: int | None = None  # of the data dir's file system
    disk_total_bytes: int | None = None
    append_p99_ms: float | None = None  # store hosts: p99 of a synced append round
    extents: dict[str, ExtentLoad] = msgspec.field(default_factory=dict)

    def msgs_in(self) -> float:
        return sum(e.msgs_in for e in self.extents.values())


class Host(msgspec.Struct, kw_only=True):
    id: str
    role: str
    address: str
    heartbeat_at: float
    zone: str = ""  # --zone; "" when none was given
    load: LoadReport | None = None  # its latest load report
