"""What an SQS queue has that a Cherami queue and group do not: the default long-poll
wait, the redrive target's name, tags, and attributes kept only to be read back
(Policy, RedriveAllowPolicy, the encryption ones). They are kept in one JSON file in
the process's data directory (``sqs.json``), written whole (to a temporary file,
synced, renamed) on each change. The attributes that are Cherami settings (delay,
retention, size, visibility timeout, max receive count) live in the queue and group."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec

log = logging.getLogger("cherami.frontend.sqs")

FILE = "sqs.json"


class QueueSettings(msgspec.Struct, kw_only=True):
    wait_seconds: int = 0  # ReceiveMessageWaitTimeSeconds
    dead_letter_target: str | None = None  # RedrivePolicy's deadLetterTargetArn, by name
    kept: dict[str, str] = msgspec.field(default_factory=dict)  # read back as given
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    modified: float = 0.0  # LastModifiedTimestamp


class SettingsStore:
    def __init__(self, data_dir: str | None) -> None:
        self.path = os.path.join(data_dir, FILE) if data_dir else None
        self._queues: dict[str, QueueSettings] = {}
        self._lock = asyncio.Lock()
        if self.path and os.path.exists(self.path):
            with open(self.path, "rb") as f:
                self._queues = msgspec.json.decode(f.read(), type=dict[str, QueueSettings])

    def get(self, queue: str) -> QueueSettings:
        found = self._queues.get(queue)
        return msgspec.structs.replace(found) if found else QueueSettings()

    def sources_of(self, dead_letter_queue: str) -> list[str]:
        """The queues whose redrive target is this one, by name."""
        queues = self._queues.items()
        return sorted(q for q, s in queues if s.dead_letter_target == dead_letter_queue)

    async def put(self, queue: str, settings: QueueSettings) -> None:
        settings.modified = time.time()
        async with self._lock:
            self._queues[queue] = settings
            await self._write()

    async def drop(self, queue: str) -> None:
        async with self._lock:
            if self._queues.pop(queue, None) is not None:
                await self._write()

    async def _write(self) -> None:
        if self.path is None:
            return
        await asyncio.to_thread(_write_file, self.path, msgspec.json.encode(self._queues))


def _write_file(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
