"""A request naming a group reads the group's record alone: every receive and ack read
the queue's record and then the group's, on the frontend and again on the output host
it was forwarded to. The queue is read only to say what is missing."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from cherami.errors import GroupNotFound, QueueNotFound
from cherami.metadata.models import Group, GroupConfig, Queue, QueueConfig
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.frontend.context import Lookup


class _Metadata:
    def __init__(self) -> None:
        self.queues = {"q": Queue(name="q", config=QueueConfig(), created_at=0.0)}
        self.groups = {("q", "g"): Group(queue="q", name="g", config=GroupConfig(),
                                         created_at=0.0, start_ms=0, dlq="q.g.dlq")}  # fmt: skip
        self.reads: list[str] = []

    async def get_queue(self, name: str) -> Queue:
        self.reads.append(f"queue {name}")
        if name not in self.queues:
            raise QueueNotFound(f"no queue {name}")
        return self.queues[name]

    async def get_group(self, queue: str, name: str) -> Group:
        self.reads.append(f"group {queue}/{name}")
        if (queue, name) not in self.groups:
            raise GroupNotFound(f"no group {name} on queue {queue}")
        return self.groups[(queue, name)]


def _request(queue: str, group: str) -> Any:
    request = make_mocked_request("POST", f"/v1/queues/{queue}/groups/{group}/receive")
    request.match_info.update({"queue": queue, "group": group})
    return request


async def test_a_group_s_record_is_one_read_and_what_is_missing_is_said() -> None:
    metadata: Any = _Metadata()
    lookup = Lookup(KeyRing([]), metadata, None, None, None)
    assert (await lookup.group_record(_request("q", "g"), "consume")).name == "g"
    assert metadata.reads == ["group q/g"]
    with pytest.raises(GroupNotFound):
        await lookup.group_record(_request("q", "nope"), "consume")
    with pytest.raises(QueueNotFound):
        await lookup.group_record(_request("nope", "g"), "consume")
