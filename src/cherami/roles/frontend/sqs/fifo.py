"""FIFO queues (a name ending ``.fifo``, created with FifoQueue=true) over Cherami's
ordering keys and dedup ids (docs/sqs.md, "FIFO queues"):

| SQS | Cherami |
|---|---|
| MessageGroupId | the message's ordering key (``key``): one message of a group in flight at a time, in order |
| MessageDeduplicationId, or the body's SHA-256 with ContentBasedDeduplication | the message's ``dedup_id``; with DeduplicationScope ``messageGroup``, ``g:`` and the SHA-256 of group and id |
| the 5-minute deduplication interval | the queue's ``dedup_window_seconds``: 300 for a queue CreateQueue makes |
| SequenceNumber | from the message id: its extent's creation time in µs x 10^12 + its sequence in the extent |

A FIFO queue CreateQueue makes is a CP queue with one open extent (``QUEUE_CONFIG``):
its group is served whole by one output host, an extent is read only after the one it
succeeds, and a successor is created after its predecessor, so SequenceNumbers increase
in publish order across the queue. The group and dedup id as sent are kept in the
message's attributes (``sqs:sys:MessageGroupId``, ``sqs:sys:MessageDeduplicationId``),
read back by ReceiveMessage."""  # noqa: E501

from __future__ import annotations

import hashlib
import re
from typing import Any

from cherami.metadata.base import MetadataStore
from cherami.roles.frontend.sqs.errors import bad_attribute_value, invalid, missing
from cherami.roles.frontend.sqs.model import SYSTEM_PREFIX

SUFFIX = ".fifo"
ATTRIBUTES = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
              "FifoThroughputLimit")  # fmt: skip
DEFAULTS = {"FifoQueue": "true", "ContentBasedDeduplication": "false",
            "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}  # fmt: skip
_CHOICES = {"ContentBasedDeduplication": ("true", "false"),
            "DeduplicationScope": ("queue", "messageGroup"),
            "FifoThroughputLimit": ("perQueue", "perMessageGroupId")}  # fmt: skip
QUEUE_CONFIG: dict[str, Any] = {"type": "cp", "min_extents": 1, "max_extents": 1,
                                "dedup_window_seconds": 300.0}  # fmt: skip
SYSTEM_NAMES = ("MessageGroupId", "MessageDeduplicationId", "SequenceNumber")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
_TOKEN = re.compile(r"^[!-~]{1,128}$")  # alphanumerics and punctuation, 1 to 128, as SQS's
_NOT_FOR_FIFO = ("Value {} for parameter DelaySeconds is invalid. Reason: The request include "
                 "parameter that is not valid for this queue type.")  # fmt: skip


def is_fifo(name: str) -> bool:
    """A FIFO queue's name: CreateQueue makes every ``.fifo`` one FIFO, no other."""
    return name.endswith(SUFFIX)


def check_name(name: str, fifo: bool) -> None:
    """A ``.fifo`` name exactly when FifoQueue is true, as SQS requires."""
    if fifo and not _NAME.match(name):
        raise invalid("The name of a FIFO queue can only include alphanumeric characters, "
                      "hyphens, or underscores, must end with .fifo suffix and be 1 to 80 "
                      "in length.")  # fmt: skip
    if not fifo and is_fifo(name):
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. "
                      "1 to 80 in length (a name ending .fifo needs FifoQueue=true).")  # fmt: skip


def attribute(name: str, value: Any) -> str:
    """A FIFO attribute's value as kept (ContentBasedDeduplication in lower case)."""
    text = str(value)
    if name == "ContentBasedDeduplication":
        text = text.lower()
    if text not in _CHOICES[name]:
        raise bad_attribute_value(name, f"Reason: must be one of {', '.join(_CHOICES[name])}.")
    return text


def check_combination(fifo: dict[str, str]) -> None:
    if (
        fifo.get("FifoThroughputLimit") == "perMessageGroupId"
        and fifo.get("DeduplicationScope") != "messageGroup"
    ):
        raise bad_attribute_value("FifoThroughputLimit", "Reason: perMessageGroupId needs "
                                  "DeduplicationScope messageGroup.")  # fmt: skip


def _token(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise invalid(f"Value {value!r} for parameter {name} is invalid. Reason: 1 to 128 "
                      "alphanumeric or punctuation characters.")  # fmt: skip
    return value


def message_fields(
    entry: dict[str, Any], fifo: dict[str, str], body: str
) -> tuple[str, str, dict[str, str]]:
    """A send's ordering key, Cherami dedup id and the attributes that keep the group
    and the dedup id as sent; SQS's errors for what a FIFO queue refuses."""
    if entry.get("DelaySeconds") is not None:
        raise invalid(_NOT_FOR_FIFO.format(entry["DelaySeconds"]))
    group = entry.get("MessageGroupId")
    if group is None or group == "":
        raise missing("MessageGroupId")
    group = _token("MessageGroupId", group)
    dedup = entry.get("MessageDeduplicationId")
    if dedup is not None and dedup != "":
        dedup = _token("MessageDeduplicationId", dedup)
    elif fifo.get("ContentBasedDeduplication") == "true":
        dedup = hashlib.sha256(body.encode("utf-8")).hexdigest()
    else:
        raise invalid("The queue should either have ContentBasedDeduplication enabled or "
                      "MessageDeduplicationId provided explicitly")  # fmt: skip
    dedup_id = dedup
    if fifo.get("DeduplicationScope") == "messageGroup":  # control characters part neither
        dedup_id = "g:" + hashlib.sha256(f"{group}\n{dedup}".encode()).hexdigest()
    stored = {SYSTEM_PREFIX + "MessageGroupId": group,
              SYSTEM_PREFIX + "MessageDeduplicationId": dedup}  # fmt: skip
    return group, dedup_id, stored


def check_attempt_id(value: Any) -> None:
    """ReceiveRequestAttemptId: checked as SQS checks it, otherwise not used."""
    if value is not None:
        _token("ReceiveRequestAttemptId", value)


class SequenceNumbers:
    """A message's SequenceNumber, from its id (``<extent>:<sequence>``) and its
    extent's creation time (read once per extent, then kept)."""

    MAX_KEPT = 10_000

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._created_us: dict[str, int] = {}

    async def of(self, msg_id: str) -> str:
        extent_id, _, seq = msg_id.rpartition(":")
        created = self._created_us.get(extent_id)
        if created is None:
            extent = await self.metadata.get_extent(extent_id) if extent_id else None
            created = 0 if extent is None else int(extent.created_at * 1_000_000)
            if len(self._created_us) >= self.MAX_KEPT:
                self._created_us.clear()
            self._created_us[extent_id] = created
        return str(created * 10**12 + (int(seq) if seq.isdigit() else 0))
