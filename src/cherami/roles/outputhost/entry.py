"""One message as a consumer group holds it between read and ack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cherami.wire.records import Record

if TYPE_CHECKING:
    from cherami.roles.outputhost.extentreader import ExtentCursor
    from cherami.roles.outputhost.redelivery import Parked


class Entry:
    __slots__ = (
        "cursor", "ordinal", "msg_id", "record", "key", "count", "no", "deadline", "owner", "row"
    )  # fmt: skip

    def __init__(
        self, cursor: ExtentCursor, ordinal: int, msg_id: str, record: Record, key: bytes
    ) -> None:
        self.cursor = cursor
        self.ordinal = ordinal  # in the cursor's ack tracking (-1: not tracked, read by key)
        self.msg_id = msg_id
        self.record = record
        self.key = key  # storage key in the cursor's extent
        self.count = 0  # deliveries so far
        self.no = 0  # number of the current delivery (0: not delivered now)
        self.deadline = 0.0
        self.owner: Any = None  # the stream that holds the current delivery, if any
        self.row: Parked | None = None  # its redelivery row, once it has one
