"""What the ``Worker`` logs for a failed message: a retry, or the DLQ at the group's
max delivery count (it said "retrying in 4.0s" for a message the nack sent to the DLQ)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from cherami.client.models import Received
from cherami.client.worker import Backoff, Worker
from tests.unit.test_worker import FakeClient


class GroupWithLimit(FakeClient):
    def __init__(self, messages: list[Received], max_delivery_count: int) -> None:
        super().__init__(messages)
        self.max_delivery_count = max_delivery_count

    async def get_group(self, queue: str, group: str) -> dict[str, Any]:
        return {"visibility_timeout_seconds": 60.0, "max_delivery_count": self.max_delivery_count}


def delivered(id: str, count: int) -> Received:
    return Received(id=id, body=b"x", delivery_count=count, enqueued_ms=0, handle=count)


async def fail(message: Received) -> None:
    raise ValueError("boom")


async def test_the_last_delivery_is_logged_as_going_to_the_dlq(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = GroupWithLimit([delivered("early", 2), delivered("last", 3)], max_delivery_count=3)
    w = Worker(client, "q", "g", fail, 2, max_messages=2, nack_backoff=Backoff(1, 2, 60))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "cherami.client.worker"):
        await asyncio.wait_for(w.run(), 5)
    lines = {r.getMessage().split()[3]: r.getMessage() for r in caplog.records}
    assert "(queue q, group g, delivery 3 of 3), sending it to the DLQ: ValueError" in lines["last"]
    assert "retrying" not in lines["last"]
    assert "(queue q, group g, delivery 2), retrying in 2.0s: ValueError" in lines["early"]
    # the DLQ move happens at the nack, whatever its delay: no backoff asked for it
    assert sorted(client.stream.nacked) == [("early", 2.0), ("last", 0.0)]
    assert w.nacked == 2


async def test_a_count_past_the_limit_goes_to_the_dlq_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The limit was lowered (PATCH) below counts already reached."""
    client = GroupWithLimit([delivered("old", 7)], max_delivery_count=5)
    w = Worker(client, "q", "g", fail, 1, max_messages=1)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "cherami.client.worker"):
        await asyncio.wait_for(w.run(), 5)
    (record,) = caplog.records
    assert "delivery 7 of 5), sending it to the DLQ" in record.getMessage()
