"""Request and response bodies of the HTTP API (docs/api.md), validated by msgspec."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from cherami.wire.grants import DEFAULT_LIFETIME, MAX_LIFETIME
from cherami.wire.records import OrderingKey

Attributes = dict[str, str]
MAX_TTL_SECONDS = 10 * 365 * 86400


class PublishMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    body: str | None = None
    body_b64: bytes | None = None  # base64 in JSON (msgspec: C)
    attributes: Attributes | None = None
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] | None = (
        None  # None: queue default
    )
    dedup_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    key: OrderingKey | None = None  # docs/api.md, "Ordering keys"
    # its TTL (at most one of the two; docs/api.md "Per-message TTL")
    expires_in_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_TTL_SECONDS)] | UnsetType = UNSET
    expires_at: Annotated[str, msgspec.Meta(max_length=64)] | UnsetType = UNSET  # RFC 3339 or ms


class PublishRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[PublishMessage], msgspec.Meta(min_length=1, max_length=1000)]


class PublishResponse(msgspec.Struct):
    ids: list[str]


class ReceiveRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_messages: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 10
    wait_seconds: Annotated[float, msgspec.Meta(ge=0, le=20)] = 0.0
    visibility_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=12 * 3600)] | None = None


Receipt = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]  # docs/api.md "Receipts"
Receipts = Annotated[list[Receipt], msgspec.Meta(min_length=1, max_length=10000)]


class ReceivedMessage(msgspec.Struct, omit_defaults=True):
    id: str
    receipt: str
    attributes: Attributes
    delivery_count: int
    enqueued_at: str
    body: str | None = None
    body_b64: bytes | None = None  # base64 in JSON (msgspec: C)
    key: str | None = None  # its ordering key, when it has one
    expires_at: str | None = None  # its TTL, when it has one


class ReceiveResponse(msgspec.Struct):
    messages: list[ReceivedMessage]


class AckRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    receipts: Receipts


class NackRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    receipts: Receipts
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=12 * 3600)] = 0.0


class VisibilityRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    receipts: Receipts
    visibility_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=12 * 3600)]


class AckResponse(msgspec.Struct):
    acked: int
    stale: list[str]


class NackResponse(msgspec.Struct):
    nacked: int
    stale: list[str]


class VisibilityResponse(msgspec.Struct):
    extended: int
    stale: list[str]


class DlqMessage(msgspec.Struct, omit_defaults=True):
    id: str
    attributes: Attributes
    enqueued_at: str
    body: str | None = None
    body_b64: bytes | None = None  # base64 in JSON (msgspec: C)
    expires_at: str | None = None


class DlqResponse(msgspec.Struct):
    messages: list[DlqMessage]
    depth: int


class QueuePage(msgspec.Struct):
    """A page of ``GET /v1/queues``: each queue as ``GET /v1/queues/{queue}`` shows it
    without stats; ``cursor`` asks for the next page (null: this is the last)."""

    queues: list[dict[str, Any]]
    cursor: str | None


class GroupPage(msgspec.Struct):
    """A page of ``GET /v1/queues/{queue}/groups``, as ``QueuePage``."""

    groups: list[dict[str, Any]]
    cursor: str | None


class QueueStats(msgspec.Struct):
    messages_published: int
    open_extents: int
    sealed_extents: int
    bytes_stored: int
    unconsumed_bytes: int  # what max_backlog_bytes is compared with (docs/api.md, "Stats")


class KeyBacklog(msgspec.Struct):
    key: str
    backlog: int  # its messages read ahead and not settled (the one delivered or due first too)


class GroupStats(msgspec.Struct):
    backlog: int
    in_flight: int
    dlq_depth: int
    oldest_unacked_age_seconds: float
    delivered: int
    acked: int
    redelivered: int
    top_keys: list[KeyBacklog] = []  # ordering keys with the most backlog, most first
    expired: int = 0  # acked past unseen: their own TTL had passed (docs/api.md)
    cancelled: int = 0  # delayed messages cancelled before they were due


def top_keys(parts: list[list[KeyBacklog]], n: int) -> list[KeyBacklog]:
    """The ``n`` keys with the most backlog over several output hosts' lists."""
    total: dict[str, int] = {}
    for part in parts:
        for k in part:
            total[k.key] = total.get(k.key, 0) + k.backlog
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [KeyBacklog(k, b) for k, b in ranked]


NextSeq = Annotated[int, msgspec.Meta(ge=1, le=(1 << 63) - 1)]


class OffsetsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Offsets of a stream-mode group: for each plain extent, the next sequence to read."""

    offsets: dict[str, NextSeq]


class ReadGrantsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/queues/{queue}/read-grants``: the extents to read (none: every extent
    the queue has now) and how long the grants last (docs/api.md, "Read grants")."""

    extents: Annotated[list[str], msgspec.Meta(max_length=1000)] = msgspec.field(
        default_factory=list
    )
    lifetime_seconds: Annotated[float, msgspec.Meta(ge=1, le=MAX_LIFETIME)] = DEFAULT_LIFETIME


class ReadGrantOut(msgspec.Struct):
    extent: str
    token: bytes  # base64 in JSON: shown to the store host in the grant hello
    key: bytes  # base64: proves the token; a secret, never sent to a store host


class ReadGrantsResponse(msgspec.Struct):
    queue: str
    expires_at: str
    lifetime_seconds: float
    grants: list[ReadGrantOut]
