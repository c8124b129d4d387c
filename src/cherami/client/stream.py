"""Streaming publish and consume over WebSocket (docs/protocol.md).

The code lives in ``publisher`` (Publisher), ``consumer`` (StreamConsumer), ``credit``
(the consumer's credit policy) and ``links`` (what both streams share); this module
keeps the names that were imported from here working."""

from __future__ import annotations

from cherami.client.consumer import CONSUMER_ROUTE_REFRESH, REDIAL_PAUSE, StreamConsumer
from cherami.client.credit import CreditPolicy
from cherami.client.links import DIAL_TIMEOUT, HEARTBEAT, RECONNECT_PATIENCE, WS_MAX_MSG
from cherami.client.publisher import (
    DIRECT_HEARTBEAT,
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    MERGE_MESSAGES,
    ROUTE_REFRESH,
    Publisher,
    least_outstanding,
)

__all__ = [
    "CONSUMER_ROUTE_REFRESH",
    "DIAL_TIMEOUT",
    "DIRECT_HEARTBEAT",
    "HEARTBEAT",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_MESSAGES",
    "MERGE_MESSAGES",
    "RECONNECT_PATIENCE",
    "REDIAL_PAUSE",
    "ROUTE_REFRESH",
    "WS_MAX_MSG",
    "CreditPolicy",
    "Publisher",
    "StreamConsumer",
    "least_outstanding",
]
