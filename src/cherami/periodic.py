"""A background task that runs a tick every few seconds until stopped: heartbeats, the
leading controller, group ownership, retention, extent refresh."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("cherami.periodic")


class Periodic:
    MIN_GAP = 0.05  # seconds from a tick's start to the next that a wake brings forward

    def __init__(self, name: str, seconds: float, tick: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.seconds = seconds
        self._tick = tick
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()

    def start(self, first_now: bool = False) -> None:
        self._task = asyncio.create_task(self._run(first_now))

    def wake(self) -> None:
        """Run the next tick soon (MIN_GAP after the last one began at the earliest),
        not at its time: something it acts on changed."""
        self._woken.set()

    async def _run(self, first_now: bool) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        if not first_now:
            await self._pause(began)
        while True:
            began = loop.time()
            self._woken.clear()
            try:
                await self._tick()
            except Exception as err:  # a tick that fails is tried again next time
                log.warning("%s failed: %s", self.name, err, exc_info=not isinstance(err, OSError))
            await self._pause(began)

    async def _pause(self, began: float) -> None:
        try:
            await asyncio.wait_for(self._woken.wait(), self.seconds)
        except TimeoutError:
            return
        await asyncio.sleep(max(0.0, began + self.MIN_GAP - asyncio.get_running_loop().time()))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Background:
    """Tasks started and not awaited: kept referenced until they end (the event loop
    holds only weak references), a failure logged, and cancelled together on stop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks: set[asyncio.Task[object]] = set()

    def spawn(self, work: Awaitable[object], what: str) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(lambda done: self._ended(done, what))
        return task

    def _ended(self, task: asyncio.Task[object], what: str) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            log.error("%s: %s failed: %r", self.name, what, err, exc_info=err)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
