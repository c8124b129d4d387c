"""Moving poison messages to a group's dead-letter queue: published there durably
(keeping their ids), then acked in the source, so the group goes on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.wire.records import Message

Publish = Callable[[str, list[Message]], Awaitable[list[str]]]


class DeadLetterMover:
    def __init__(self, publish: Publish) -> None:
        self._publish = publish

    async def __call__(self, group: GroupConsumer, entries: list[Entry]) -> None:
        messages = [
            Message(e.record.body, e.record.attributes, 0, e.msg_id, e.record.text) for e in entries
        ]
        await self._publish(group.group.dlq, messages)
