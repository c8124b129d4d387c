"""What the controller fills in and checks in a queue's or a group's config, and the
names it gives extents and dead-letter queues."""

from __future__ import annotations

import secrets
import time

from cherami.errors import InvalidRequest
from cherami.metadata.models import QueueConfig


def new_extent_id() -> str:
    return secrets.token_hex(8)


def dlq_name(queue: str, group: str) -> str:
    # the leading "_" keeps it out of the public name space (names start alphanumeric)
    return f"_dlq.{secrets.token_hex(6)}.{queue}.{group}"[:200]


def check_extent_bounds(
    config: QueueConfig, default_min: int = 1, dlq_of: str | None = None
) -> None:
    """Fill ``min_extents`` in (default: 1 on a node, 2 in a cluster) and check it is at
    most ``max_extents``, and 0 only for a dead-letter queue (``dlq_of``)."""
    if config.min_extents is None:
        config.min_extents = min(default_min, config.max_extents)
    if config.min_extents == 0 and dlq_of is None:
        raise InvalidRequest("min_extents must be at least 1")
    if config.min_extents > config.max_extents:
        raise InvalidRequest(
            f"min_extents {config.min_extents} exceeds max_extents {config.max_extents}"
        )


def check_min_replicas(config: QueueConfig) -> None:
    """Fill ``min_replicas`` in (default: ``replicas``) and check it is at most that."""
    replicas = config.replicas or 1
    if config.min_replicas is None:
        config.min_replicas = replicas
    elif config.min_replicas > replicas:
        raise InvalidRequest(f"min_replicas {config.min_replicas} exceeds replicas {replicas}")


def parse_start(start_from: str) -> int:
    """The start time in ms of a group's ``start_from`` (0 for earliest)."""
    if start_from == "earliest":
        return 0
    if start_from == "latest":
        return int(time.time() * 1000)
    try:
        from datetime import datetime

        return int(datetime.fromisoformat(start_from.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        raise InvalidRequest(
            "start_from must be 'earliest', 'latest' or an RFC 3339 time"
        ) from None
