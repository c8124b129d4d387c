"""Moving poison messages to a group's dead-letter queue: published there durably
(keeping their ids) through an input host's client, then acked in the source, so the
group goes on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from cherami.metadata.base import MetadataStore
from cherami.roles.controller.client import wake_dead_letter_queue
from cherami.roles.outputhost.entry import Entry
from cherami.wire.records import Message

if TYPE_CHECKING:
    from cherami.roles.inputhost.client import InputHostClient
    from cherami.roles.outputhost.extentreader import ExtentCursor

log = logging.getLogger("cherami.outputhost.deadletterqueue")

BATCH = 500  # messages moved in one publish
RETRY_AFTER = 1.0  # seconds after a failed move


class DeadLetterMover:
    """Publishes messages to a dead-letter queue (the output host's one for every group)."""

    def __init__(self, inputs: InputHostClient, metadata: MetadataStore) -> None:
        self._inputs = inputs
        self._metadata = metadata

    async def __call__(self, dlq: str, entries: list[Entry]) -> None:
        messages = [  # keeping each one's TTL: an expired one is never delivered from there
            Message(e.record.body, e.record.attributes, 0, e.msg_id, e.record.text,
                    key=e.record.key, expires_ms=e.record.expires_ms)
            for e in entries
        ]  # fmt: skip
        # a dead-letter queue opens its extent at its first dead letter
        await self._inputs.publish(await wake_dead_letter_queue(self._metadata, dlq), messages)


Move = Callable[[list[Entry]], Awaitable[None]]


class DeadLetters:
    """One group's messages on their way to its DLQ: moved in batches, in the
    background, again after a failure; ``moved`` is told of each batch once it is in
    the DLQ (the group acks it then)."""

    def __init__(self, key: str, move: Move, moved: Callable[[list[Entry]], None]) -> None:
        self.key = key
        self._move = move
        self._moved = moved
        self._pending: list[Entry] = []
        self.task: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, entry: Entry) -> None:
        self._pending.append(entry)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._flush())

    def drop_cursor(self, cursor: ExtentCursor) -> None:
        """Its extent is no longer held here: the new holder moves its messages."""
        self._pending = [e for e in self._pending if e.cursor is not cursor]

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            try:
                await self._move(batch)
            except Exception as err:
                log.warning("group %s: moving %d to the DLQ failed: %s", self.key, len(batch), err)
                self._pending[:0] = batch
                await asyncio.sleep(RETRY_AFTER)
                continue
            self._moved(batch)
