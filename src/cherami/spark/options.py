"""The options of the ``cherami`` data source, parsed once, in one place. Options are
named as in Spark's Kafka source where they mean the same (docs/spark.md has both side by
side); a bad value fails with an error naming the option."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from cherami.errors import InvalidRequest

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_PARTITION_MESSAGES = 1_000_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # as Kafka's maxTriggerDelay
EARLIEST, LATEST = -2, -1  # in offsets JSON, as in Kafka's

Start = str | dict[str, int]  # "earliest", "latest" or {extent: next_seq | EARLIEST | LATEST}

_Get = Callable[[str], "str | None"]


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    queue: str
    group: str | None
    api_key: str | None
    max_messages_per_trigger: int | None
    min_messages_per_trigger: int | None  # streams: wait for this many, up to the delay
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    starting_offsets: Start | None  # None: streams from the group, batch from earliest
    ending_offsets: Start | None  # batch reads only; None: latest
    start_ms: int | None  # enqueued at or after
    end_ms: int | None  # enqueued before
    include_headers: bool  # the attributes column
    extents: tuple[str, ...]  # batch reads: only these extents (empty: all)
    include_delayed: bool  # batch reads: the queue's timer extents too
    partition_messages: int  # batch reads: messages per Spark partition at most
    publish_batch: int  # writes: messages per publish frame
    dedup_id_column: str | None  # writes: the column of the rows' dedup ids
    grant_lifetime: float | None  # reads: seconds a read grant lasts (None: the server's)

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
            max_messages_per_trigger=_alias(get, "maxOffsetsPerTrigger", "maxMessagesPerTrigger"),
            min_messages_per_trigger=_int(get, "minOffsetsPerTrigger"),
            max_trigger_delay_ms=_duration_ms(get, "maxTriggerDelay")
            or DEFAULT_MAX_TRIGGER_DELAY_MS,
            fail_on_data_loss=_bool(get, "failOnDataLoss", True),
            starting_offsets=_offsets(get, "startingOffsets"),
            ending_offsets=_offsets(get, "endingOffsets"),
            start_ms=_time(get, "startingTimestamp", "startTime"),
            end_ms=_time(get, "endingTimestamp", "endTime"),
            include_headers=_bool(get, "includeHeaders", True),
            extents=extents,
            include_delayed=_bool(get, "includeDelayed", True),
            partition_messages=_int(get, "partitionMessages") or DEFAULT_PARTITION_MESSAGES,
            publish_batch=min(1000, _int(get, "publishBatch") or 1000),
            dedup_id_column=get("dedupIdColumn"),
            grant_lifetime=_grant_lifetime(get),
        )._checked()

    def _checked(self) -> Options:
        if self.starting_offsets is not None and self.start_ms is not None:
            raise InvalidRequest("give one of 'startingOffsets' and 'startingTimestamp', not both")
        if self.ending_offsets == "earliest":
            raise InvalidRequest("option 'endingOffsets' cannot be 'earliest'")
        if isinstance(self.ending_offsets, dict) and EARLIEST in self.ending_offsets.values():
            raise InvalidRequest("option 'endingOffsets' cannot hold -2 (earliest)")
        low, high = self.min_messages_per_trigger, self.max_messages_per_trigger
        if low is not None and high is not None and low > high:
            raise InvalidRequest(
                "option 'minOffsetsPerTrigger' must not exceed 'maxOffsetsPerTrigger'"
            )
        return self

    def check_stream(self) -> None:
        """Options that have no meaning for a streaming read are refused (as Kafka does)."""
        if self.ending_offsets is not None:
            raise InvalidRequest("option 'endingOffsets' applies to batch reads only")

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


def _alias(get: _Get, name: str, old: str) -> int | None:
    """``name``, or ``old`` (its former name); both only when they agree."""
    value, former = _int(get, name), _int(get, old)
    if value is not None and former is not None and value != former:
        raise InvalidRequest(f"options {name!r} and {old!r} (its alias) disagree")
    return value if value is not None else former


def _bool(get: _Get, name: str, default: bool) -> bool:
    raw = get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidRequest(f"option {name!r} must be 'true' or 'false', not {raw!r}")
    return value == "true"


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+)\s*(ms|s|min|m|h|d)?")


def _duration_ms(get: _Get, name: str) -> int | None:
    """A duration as Spark writes them: ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``, or
    bare milliseconds."""
    raw = get(name)
    if raw is None:
        return None
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise InvalidRequest(f"option {name!r} must be a duration such as '30s', not {raw!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def _grant_lifetime(get: _Get) -> float | None:
    """``readGrantLifetime``: from 1 s to 1 h (the frontend's bounds)."""
    ms = _duration_ms(get, "readGrantLifetime")
    if ms is None:
        return None
    if not 1000 <= ms <= 3_600_000:
        raise InvalidRequest("option 'readGrantLifetime' must be from 1s to 1h")
    return ms / 1000


def _offsets(get: _Get, name: str) -> Start | None:
    """``earliest``, ``latest`` or a JSON object ``{extent: next_seq}`` (-2: earliest,
    -1: latest, as in Kafka's)."""
    raw = get(name)
    if raw is None:
        return None
    if raw.strip().lower() in ("earliest", "latest"):
        return raw.strip().lower()
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int and (v >= 1 or v in (EARLIEST, LATEST))
        for k, v in value.items()
    ):
        raise InvalidRequest(
            f"option {name!r} must be 'earliest', 'latest' or a JSON object "
            f'{{"<extent>": <next seq, -2 earliest, -1 latest>}}, not {raw!r}'
        )
    return value


def _time(get: _Get, name: str, old: str) -> int | None:
    """``name`` or ``old`` (its former name): an RFC 3339 time or milliseconds since the
    epoch."""
    if get(name) is not None and get(old) is not None:
        raise InvalidRequest(f"give one of {name!r} and {old!r} (its alias), not both")
    which = name if get(name) is not None else old
    raw = get(which)
    if raw is None:
        return None
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(
            f"option {which!r} must be an RFC 3339 time or epoch milliseconds, not {raw!r}"
        ) from None
    return int(parsed.timestamp() * 1000)
