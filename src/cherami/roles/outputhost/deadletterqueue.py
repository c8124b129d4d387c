"""Moving poison messages to a group's dead-letter queue: published there durably
(keeping their ids) through an input host's client, then acked in the source, so the
group goes on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cherami.metadata.base import MetadataStore
from cherami.roles.outputhost.entry import Entry
from cherami.wire.records import Message

if TYPE_CHECKING:
    from cherami.roles.inputhost.client import InputHostClient
    from cherami.roles.outputhost.groupconsumer import GroupConsumer


class DeadLetterMover:
    def __init__(self, inputs: InputHostClient, metadata: MetadataStore) -> None:
        self._inputs = inputs
        self._metadata = metadata

    async def __call__(self, group: GroupConsumer, entries: list[Entry]) -> None:
        messages = [
            Message(e.record.body, e.record.attributes, 0, e.msg_id, e.record.text) for e in entries
        ]
        dlq = await self._metadata.get_queue(group.group.dlq)
        await self._inputs.publish(dlq, messages)
