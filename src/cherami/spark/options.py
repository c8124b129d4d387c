"""The options of the ``cherami`` data source, parsed once, in one place."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from cherami.errors import InvalidRequest

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_PARTITION_MESSAGES = 1_000_000

_Get = Callable[[str], "str | None"]


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    queue: str
    group: str | None
    api_key: str | None
    max_messages_per_trigger: int | None
    fail_on_data_loss: bool
    start_ms: int | None  # batch reads: enqueued at or after
    end_ms: int | None  # batch reads: enqueued before
    extents: tuple[str, ...]  # batch reads: only these extents (empty: all)
    include_delayed: bool  # batch reads: the queue's timer extents too
    partition_messages: int  # batch reads: messages per Spark partition at most
    publish_batch: int  # writes: messages per publish frame

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        get = _lookup(options)
        queue = get("queue")
        if not queue:
            raise InvalidRequest("option 'queue' is required")
        extents = tuple(e.strip() for e in (get("extents") or "").split(",") if e.strip())
        return cls(
            url=get("url") or DEFAULT_URL,
            queue=queue,
            group=get("group"),
            api_key=get("apiKey"),
            max_messages_per_trigger=_int(get, "maxMessagesPerTrigger"),
            fail_on_data_loss=_bool(get("failOnDataLoss"), True),
            start_ms=_time_ms(get("startTime")),
            end_ms=_time_ms(get("endTime")),
            extents=extents,
            include_delayed=_bool(get("includeDelayed"), True),
            partition_messages=_int(get, "partitionMessages") or DEFAULT_PARTITION_MESSAGES,
            publish_batch=min(1000, _int(get, "publishBatch") or 1000),
        )

    def require_group(self) -> str:
        if not self.group:
            raise InvalidRequest("option 'group' (a stream-mode consumer group) is required")
        return self.group


def _lookup(options: Mapping[str, str]) -> _Get:
    lowered = {k.lower(): v for k, v in options.items()}

    def get(name: str) -> str | None:
        value = lowered.get(name.lower())
        return None if value is None or value == "" else str(value)

    return get


def _int(get: _Get, name: str) -> int | None:
    raw = get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < 1:
        raise InvalidRequest(f"option {name!r} must be at least 1")
    return value


def _bool(raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _time_ms(raw: str | None) -> int | None:
    """An RFC 3339 time or milliseconds since the epoch."""
    if raw is None:
        return None
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"not an RFC 3339 time or epoch milliseconds: {raw!r}") from None
    return int(parsed.timestamp() * 1000)
