"""The FIFO mapping of the SQS endpoint (roles/frontend/sqs/fifo.py): names, attribute
values, a send's key and dedup id, SequenceNumbers."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from cherami.metadata.models import Extent
from cherami.roles.frontend.sqs import fifo as f
from cherami.roles.frontend.sqs.errors import SqsError


def test_names_and_attribute_values() -> None:
    f.check_name("orders.fifo", True)
    f.check_name("orders", False)
    for name, fifo in (("orders", True), ("orders.fifo", False), ("a.b.fifo", True),
                       ("x" * 76 + ".fifo", True)):  # fmt: skip
        with pytest.raises(SqsError) as err:
            f.check_name(name, fifo)
        assert err.value.name == "InvalidParameterValue"
    assert f.attribute("ContentBasedDeduplication", "TRUE") == "true"
    with pytest.raises(SqsError) as err:
        f.attribute("DeduplicationScope", "group")
    assert err.value.name == "InvalidAttributeValue"
    with pytest.raises(SqsError):
        f.check_combination({**f.DEFAULTS, "FifoThroughputLimit": "perMessageGroupId"})
    f.check_combination({**f.DEFAULTS, "FifoThroughputLimit": "perMessageGroupId",
                         "DeduplicationScope": "messageGroup"})  # fmt: skip


def test_a_sends_key_and_dedup_id() -> None:
    entry: dict[str, Any] = {"MessageGroupId": "g", "MessageDeduplicationId": "d"}
    key, dedup, stored = f.message_fields(entry, f.DEFAULTS, "body")
    assert (key, dedup) == ("g", "d")
    assert stored == {"sqs:sys:MessageGroupId": "g", "sqs:sys:MessageDeduplicationId": "d"}
    by_group = {**f.DEFAULTS, "DeduplicationScope": "messageGroup"}
    one = f.message_fields(entry, by_group, "body")[1]
    other = f.message_fields({**entry, "MessageGroupId": "h"}, by_group, "body")[1]
    assert one != other and one.startswith("g:") and len(one) <= 128
    content = {**f.DEFAULTS, "ContentBasedDeduplication": "true"}
    _, dedup, stored = f.message_fields({"MessageGroupId": "g"}, content, "body")
    assert dedup == hashlib.sha256(b"body").hexdigest() == stored["sqs:sys:MessageDeduplicationId"]
    with pytest.raises(SqsError) as err:
        f.message_fields({}, f.DEFAULTS, "body")
    assert err.value.name == "MissingParameter"
    for bad in ({"MessageGroupId": "g"}, {**entry, "DelaySeconds": 0},
                {**entry, "MessageGroupId": "a b"},
                {**entry, "MessageDeduplicationId": "d" * 129}):  # fmt: skip
        with pytest.raises(SqsError) as err:
            f.message_fields(bad, f.DEFAULTS, "body")
        assert err.value.name == "InvalidParameterValue", bad
    f.check_attempt_id(None)
    with pytest.raises(SqsError):
        f.check_attempt_id("x" * 129)


class _Extents:
    def __init__(self) -> None:
        self.reads = 0

    async def get_extent(self, extent_id: str) -> Extent | None:
        self.reads += 1
        created = {"old": 1000.5, "new": 1000.75}.get(extent_id)
        if created is None:
            return None
        return Extent(id=extent_id, queue="q.fifo", kind="plain", status="open",
                      input_host="i", stores=[], created_at=created)  # fmt: skip


def test_sequence_numbers_increase_with_the_extent_then_the_sequence() -> None:
    extents = _Extents()
    numbers = f.SequenceNumbers(extents)  # type: ignore[arg-type]

    async def run() -> list[int]:
        ids = ["old:1", "old:2", "old:99999", "new:1", "new:2", "old:2"]
        return [int(await numbers.of(i)) for i in ids]

    got = asyncio.run(run())
    assert got[:5] == sorted(set(got[:5])) and got[5] == got[1]
    assert extents.reads == 2  # each extent read once
    assert asyncio.run(numbers.of("gone:7")) == "7"
