"""A background task that runs a tick every few seconds until stopped: heartbeats, the
leading controller, group ownership, retention, extent refresh."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("cherami.periodic")


class Periodic:
    def __init__(self, name: str, seconds: float, tick: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.seconds = seconds
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self, first_now: bool = False) -> None:
        self._task = asyncio.create_task(self._run(first_now))

    async def _run(self, first_now: bool) -> None:
        if not first_now:
            await asyncio.sleep(self.seconds)
        while True:
            try:
                await self._tick()
            except Exception as err:  # a tick that fails is tried again next time
                log.warning("%s failed: %s", self.name, err, exc_info=not isinstance(err, OSError))
            await asyncio.sleep(self.seconds)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
