"""Conversions between API bodies and internal messages."""

from __future__ import annotations

import time

from cherami.errors import InvalidRequest, MessageTooLarge
from cherami.metadata.models import Queue
from cherami.roles.frontend.schemas import PublishMessage, ReceivedMessage
from cherami.wire.records import Message, Record

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
    return ReceivedMessage(msg_id, receipt, record.attributes or {}, count,
                           rfc3339(record.enqueued_ms),
                           *text_or_bytes(record.body, record.text), record.key)  # fmt: skip


def to_messages(queue: Queue, items: list[PublishMessage]) -> list[Message]:
    """Validate a publish request as a whole: any bad message fails all of it."""
    limit = queue.config.max_message_bytes
    out = []
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
            )
        )
    return out


def check_size(queue: Queue, index: int, size: int, limit: int) -> None:
    if size > limit:
        raise MessageTooLarge(
            f"messages[{index}] has {size} bytes; queue {queue.name} allows {limit}"
        )
