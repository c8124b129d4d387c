"""Conversions between API bodies and internal messages."""

from __future__ import annotations

import base64
import binascii
import time

from cherami.errors import InvalidRequest, MessageTooLarge
from cherami.metadata.models import Queue
from cherami.roles.frontend.schemas import PublishMessage, ReceivedMessage
from cherami.wire.records import Message, Record

_SECONDS: dict[int, str] = {}  # whole seconds -> "YYYY-MM-DDTHH:MM:SS" (UTC)


def rfc3339(ms: int) -> str:
    """``ms`` since the epoch as RFC 3339 in UTC with milliseconds (…T12:00:00.250Z).
    Called for every message a receive returns: a batch's messages share their second,
    so the date part is formatted once per second."""
    seconds, millis = divmod(ms, 1000)
    prefix = _SECONDS.get(seconds)
    if prefix is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        prefix = _SECONDS[seconds] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{prefix}.{millis:03d}Z"


def body_fields(body: bytes, text: bool | None = None) -> dict[str, str]:
    """``body`` for messages published as text, ``body_b64`` for those published as
    bytes; for the rest (streamed bodies), ``body`` when the bytes are UTF-8."""
    if text is not False:
        try:
            return {"body": body.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"body_b64": base64.b64encode(body).decode()}


def received(msg_id: str, receipt: str, record: Record, count: int) -> ReceivedMessage:
    """A delivery as a receive returns it."""
    return ReceivedMessage(msg_id, receipt, record.attributes or {}, count,
                           rfc3339(record.enqueued_ms),
                           **body_fields(record.body, record.text))  # fmt: skip


def to_messages(queue: Queue, items: list[PublishMessage]) -> list[Message]:
    """Validate a publish request as a whole: any bad message fails all of it."""
    limit = queue.config.max_message_bytes
    out = []
    for i, item in enumerate(items):
        if (item.body is None) == (item.body_b64 is None):
            raise InvalidRequest(f"messages[{i}]: give exactly one of body and body_b64")
        if item.body is not None:
            body = item.body.encode()
        else:
            try:
                body = base64.b64decode(item.body_b64 or "", validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest(f"messages[{i}].body_b64 is not valid base64") from None
        check_size(queue, i, len(body), limit)
        out.append(
            Message(
                body,
                item.attributes or None,
                None if item.delay_seconds is None else int(item.delay_seconds * 1000),
                None,
                item.body is not None,
                item.dedup_id,
            )
        )
    return out


def check_size(queue: Queue, index: int, size: int, limit: int) -> None:
    if size > limit:
        raise MessageTooLarge(
            f"messages[{index}] has {size} bytes; queue {queue.name} allows {limit}"
        )
