"""Change notifications from PostgreSQL: every write the change log records also sends
a NOTIFY on the schema's channel (the ``note_change`` trigger), and a process that
acts on changes (the leading controller) LISTENs on it, so a queue made through a
frontend has its extents opened at once, not at the leader's next tick. A cluster's
creation waited for that tick: the first publish to a new queue took 0.5 s, and
creating queues 16 at a time ran at 25 a second. The tick still runs; a notification
only brings it forward."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql

log = logging.getLogger("cherami.metadata.postgres")

PAUSE_FIRST, PAUSE_MOST = 0.5, 10.0  # seconds between tries to listen again


def channel(schema: str) -> str:
    """The schema's notification channel (a name short enough for any schema)."""
    return "cherami_" + hashlib.md5(schema.encode()).hexdigest()[:16]


class ChangeListener:
    """Calls ``wake`` at each notification of the schema's channel, and once each time it
    starts listening (changes made while it was not are not notified to it); listens
    again, with back-off, after losing its connection."""

    def __init__(self, conninfo: str, schema: str, wake: Callable[[], None]) -> None:
        self.conninfo = conninfo
        self.channel = channel(schema)
        self.wake = wake
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="listen for changes")

    async def _listen(self) -> None:
        pause = PAUSE_FIRST
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True
                ) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    pause = PAUSE_FIRST
                    self.wake()
                    async for _ in conn.notifies():
                        self.wake()
            except (psycopg.Error, OSError) as err:
                log.info("not listening for metadata changes (again in %.1f s): %s", pause, err)
                await asyncio.sleep(pause)
                pause = min(pause * 2, PAUSE_MOST)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
