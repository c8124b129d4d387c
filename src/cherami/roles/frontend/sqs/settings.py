"""What an SQS queue has that a Cherami queue and group do not: the default long-poll
wait, the redrive target's name, tags, and attributes kept only to be read back
(Policy, RedriveAllowPolicy, the encryption ones). They are the queue's properties in
the metadata store (``MetadataStore.get_queue_properties``), so every frontend of a
cluster reads the same ones, and deleting the queue deletes them:

| property | value |
|---|---|
| ``sqs.q.wait`` | ReceiveMessageWaitTimeSeconds |
| ``sqs.q.dlq`` | the RedrivePolicy's deadLetterTargetArn, by queue name |
| ``sqs.q.modified`` | LastModifiedTimestamp (seconds) |
| ``sqs.q.kept.<attribute>`` | an attribute kept as given |
| ``sqs.q.tag.<key>`` | a tag |
| ``sqs.q.fifo.<attribute>`` | a FIFO queue's FIFO attributes (fifo.py) |

A change writes only the properties it changes, so two frontends tagging one queue at
once keep both tags. The attributes that are Cherami settings (delay, retention, size,
visibility timeout, max receive count) live in the queue and group.

An older version kept these in ``DATA_DIR/sqs.json``, per process: ``migrate`` moves
that file's settings into the metadata store once, at start, for the queues that still
exist and have none there, then renames it ``sqs.json.migrated``."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec

from cherami.errors import QueueNotFound
from cherami.metadata.base import MetadataStore

log = logging.getLogger("cherami.frontend.sqs")

FILE = "sqs.json"  # where an older version kept them
PREFIX = "sqs.q."
WAIT, DLQ, MODIFIED = PREFIX + "wait", PREFIX + "dlq", PREFIX + "modified"
KEPT, TAG, FIFO = PREFIX + "kept.", PREFIX + "tag.", PREFIX + "fifo."


class QueueSettings(msgspec.Struct, kw_only=True):
    wait_seconds: int = 0  # ReceiveMessageWaitTimeSeconds
    dead_letter_target: str | None = None  # RedrivePolicy's deadLetterTargetArn, by name
    kept: dict[str, str] = msgspec.field(default_factory=dict)  # read back as given
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    modified: float = 0.0  # LastModifiedTimestamp
    fifo: dict[str, str] = msgspec.field(default_factory=dict)  # a FIFO queue's attributes

    @property
    def is_fifo(self) -> bool:
        return self.fifo.get("FifoQueue") == "true"


def to_properties(s: QueueSettings) -> dict[str, str]:
    out = {WAIT: str(s.wait_seconds), MODIFIED: repr(s.modified)}
    if s.dead_letter_target is not None:
        out[DLQ] = s.dead_letter_target
    out.update({KEPT + k: v for k, v in s.kept.items()})
    out.update({TAG + k: v for k, v in s.tags.items()})
    out.update({FIFO + k: v for k, v in s.fifo.items()})
    return out


def from_properties(props: dict[str, str]) -> QueueSettings:
    s = QueueSettings()
    for name, value in props.items():
        if name == WAIT:
            s.wait_seconds = int(value)
        elif name == DLQ:
            s.dead_letter_target = value
        elif name == MODIFIED:
            s.modified = float(value)
        elif name.startswith(KEPT):
            s.kept[name[len(KEPT) :]] = value
        elif name.startswith(TAG):
            s.tags[name[len(TAG) :]] = value
        elif name.startswith(FIFO):
            s.fifo[name[len(FIFO) :]] = value
    return s


def clone(s: QueueSettings) -> QueueSettings:
    return from_properties(to_properties(s))


class SettingsStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def get(self, queue: str) -> QueueSettings:
        return from_properties(await self.metadata.get_queue_properties(queue, PREFIX))

    async def sources_of(self, dead_letter_queue: str) -> list[str]:
        """The queues whose redrive target is this one, by name."""
        return sorted(await self.metadata.find_queue_properties(DLQ, dead_letter_queue))

    async def put(self, queue: str, before: QueueSettings, after: QueueSettings) -> None:
        """Write what changed from ``before`` (as read) to ``after``; QueueNotFound when
        the queue is gone."""
        after.modified = time.time()
        old, new = to_properties(before), to_properties(after)
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        await self.metadata.put_queue_properties(queue, changed, [k for k in old if k not in new])

    async def migrate(self, data_dir: str | None) -> int:
        """Move an older version's ``DATA_DIR/sqs.json`` into the metadata store (see
        the module); how many queues' settings it moved."""
        path = os.path.join(data_dir, FILE) if data_dir else None
        raw = None if path is None else await asyncio.to_thread(_read_file, path)
        if path is None or raw is None:
            return 0
        queues = msgspec.json.decode(raw, type=dict[str, QueueSettings])
        moved = 0
        for name, settings in queues.items():
            if await self.metadata.get_queue_properties(name, PREFIX):
                continue  # set since, through this or another frontend
            try:
                await self.metadata.put_queue_properties(name, to_properties(settings))
                moved += 1
            except QueueNotFound:
                continue
        await asyncio.to_thread(os.replace, path, path + ".migrated")
        log.info("moved the SQS settings of %d queues from %s to the metadata store", moved, path)
        return moved


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
