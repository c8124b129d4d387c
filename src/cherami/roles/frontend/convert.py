"""Conversions between API bodies and internal messages."""

from __future__ import annotations

import re
import time
from datetime import datetime

from msgspec import UNSET

from cherami.errors import InvalidRequest, MessageTooLarge
from cherami.metadata.models import Queue
from cherami.roles.frontend.schemas import MAX_TTL_SECONDS, PublishMessage, ReceivedMessage
from cherami.wire.records import Message, Record

MS_PATTERN = r"^-?[0-9]{1,15}$"
_MS = re.compile(MS_PATTERN)
_TIME = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_SECONDS: dict[int, str] = {}  # whole seconds -> "YYYY-MM-DDTHH:MM:SS" (UTC)
_MILLIS: dict[int, str] = {}  # ms -> the whole string


def rfc3339(ms: int) -> str:
    """``ms`` since the epoch as RFC 3339 in UTC with milliseconds (…T12:00:00.250Z).
    Called for every message a receive returns: a batch's messages mostly share their
    millisecond (published together), so each is formatted once."""
    text = _MILLIS.get(ms)
    if text is None:
        if len(_MILLIS) >= 4096:
            _MILLIS.clear()
        text = _MILLIS[ms] = _format(ms)
    return text


def _format(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    prefix = _SECONDS.get(seconds)
    if prefix is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        prefix = _SECONDS[seconds] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{prefix}.{millis:03d}Z"


def parse_time(name: str, text: str) -> int:
    """A time given in a request (a peek's ``since``, a message's ``expires_at``): ms
    since the epoch, or an RFC 3339 time with its offset."""
    if _MS.fullmatch(text):
        return int(text)
    match = _TIME.fullmatch(text)
    if match is not None:
        date, clock, fraction, offset = match.groups()
        micros = (fraction or "").ljust(6, "0")[:6]
        offset = "+00:00" if offset in "Zz" else offset
        try:
            when = datetime.fromisoformat(f"{date}T{clock}.{micros}{offset}")
        except ValueError:
            pass
        else:
            return int(when.timestamp() * 1000)
    raise InvalidRequest(
        f"{name} must be an RFC 3339 time (2026-11-21T20:38:05Z) or milliseconds since "
        f"the epoch, not {text!r}"
    )


def text_or_bytes(body: bytes, text: bool | None = None) -> tuple[str | None, bytes | None]:
    """``(body, None)`` for messages published as text, ``(None, body_b64)`` for those
    published as bytes; for the rest (streamed bodies), text when the bytes are UTF-8.
    (The JSON encoder writes bytes as base64.)"""
    if text is not False:
        try:
            return body.decode("utf-8"), None
        except UnicodeDecodeError:
            pass
    return None, body


def body_fields(body: bytes, text: bool | None = None) -> dict[str, str | bytes]:
    """``text_or_bytes`` as the one field of a JSON object that is set."""
    as_text, as_bytes = text_or_bytes(body, text)
    return {"body": as_text} if as_text is not None else {"body_b64": as_bytes or b""}


def received(msg_id: str, receipt: str, record: Record, count: int) -> ReceivedMessage:
    """A delivery as a receive returns it."""
    expires = record.expires_ms
    return ReceivedMessage(msg_id, receipt, record.attributes or {}, count,
                           rfc3339(record.enqueued_ms),
                           *text_or_bytes(record.body, record.text), record.key,
                           None if expires is None else rfc3339(expires))  # fmt: skip


def to_messages(queue: Queue, items: list[PublishMessage]) -> list[Message]:
    """Validate a publish request as a whole: any bad message fails all of it."""
    limit = queue.config.max_message_bytes
    out = []
    now_ms = int(time.time() * 1000)
    for i, item in enumerate(items):
        if (item.body is None) == (item.body_b64 is None):
            raise InvalidRequest(f"messages[{i}]: give exactly one of body and body_b64")
        # body_b64 was decoded with the request (bad base64 failed it there)
        body = item.body.encode() if item.body is not None else item.body_b64 or b""
        check_size(queue, i, len(body), limit)
        out.append(
            Message(
                body,
                item.attributes or None,
                None if item.delay_seconds is None else int(item.delay_seconds * 1000),
                None,
                item.body is not None,
                item.dedup_id,
                item.key,
                _expires_ms(i, item, now_ms),
            )
        )
    return out


def _expires_ms(i: int, item: PublishMessage, now_ms: int) -> int | None:
    """When a published message expires (None: never): ``expires_in_seconds`` after
    ``now_ms``, or at ``expires_at``."""
    if item.expires_at is UNSET:
        ttl = item.expires_in_seconds
        return None if ttl is UNSET else now_ms + max(1, int(ttl * 1000))
    if item.expires_in_seconds is not UNSET:
        raise InvalidRequest(
            f"messages[{i}]: give at most one of expires_in_seconds and expires_at"
        )
    return max(1, parse_time(f"messages[{i}].expires_at", item.expires_at))


def stream_expires_ms(
    i: int, ttl_ms: int | None, expires_ms: int | None, now_ms: int
) -> int | None:
    """``_expires_ms`` of a stream's ``pub`` frame (``ttl_ms`` or ``expires_ms``)."""
    if ttl_ms is None:
        return None if expires_ms is None else max(1, expires_ms)
    if expires_ms is not None:
        raise InvalidRequest(f"messages[{i}]: give at most one of ttl_ms and expires_ms")
    if not 0 < ttl_ms <= MAX_TTL_SECONDS * 1000:
        raise InvalidRequest(f"messages[{i}].ttl_ms must be 1 to {MAX_TTL_SECONDS * 1000}")
    return now_ms + ttl_ms


def check_size(queue: Queue, index: int, size: int, limit: int) -> None:
    if size > limit:
        raise MessageTooLarge(
            f"messages[{index}] has {size} bytes; queue {queue.name} allows {limit}"
        )
