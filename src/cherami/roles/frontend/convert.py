"""Conversions between API bodies and internal messages."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

from cherami.errors import InvalidRequest, MessageTooLarge
from cherami.metadata.models import Queue
from cherami.roles.frontend.schemas import PublishMessage
from cherami.wire.records import Message


def rfc3339(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def body_fields(body: bytes, text: bool | None = None) -> dict[str, str]:
    """``body`` for messages published as text, ``body_b64`` for those published as
    bytes; for the rest (streamed bodies), ``body`` when the bytes are UTF-8."""
    if text is not False:
        try:
            return {"body": body.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"body_b64": base64.b64encode(body).decode()}


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
