"""A group's timers: one task that wakes when the next of them is due (a visibility
timeout, a parked message, the full read window's check), at most every TICK and at
least every MAX_TICK while the group has any; a new timer (``wake``) wakes it early. It
ends when the group has no timer left and ``wake`` starts it again, so an idle group
holds no task and nothing wakes it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cherami.roles.outputhost.flag import Flag

TICK = 0.02  # a group's timers fire at most this often
MAX_TICK = 1.0  # and look at least this often while it has any


class Ticker:
    def __init__(
        self,
        has_timers: Callable[[], bool],
        next_in: Callable[[float], float],
        expire: Callable[[float], None],
        clock: Callable[[], float],
        stopped: Callable[[], bool],
    ) -> None:
        """``next_in(now)``: seconds until the first timer is due; ``expire(now)``: fire
        what is due; ``stopped()``: the group is stopping (nothing more starts)."""
        self._has_timers = has_timers
        self._next_in = next_in
        self._expire = expire
        self._clock = clock
        self._stopped = stopped
        self._due = Flag()
        self.task: asyncio.Task[None] | None = None
        self._started = False

    def start(self) -> None:
        self._started = True
        self.wake()

    def wake(self) -> None:
        """A new timer: look again now, starting the task if it is not running."""
        self._due.set()
        task = self.task
        if self._started and not self._stopped() and (task is None or task.done()):
            self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._has_timers():
            self._due.clear()
            wait = max(TICK, self._next_in(self._clock()))
            try:
                async with asyncio.timeout(wait):
                    await self._due.wait()
                await asyncio.sleep(TICK)  # what a burst of new timers brings, together
            except TimeoutError:
                pass
            self._expire(self._clock())
        self.task = None  # nothing left: the finished task is not kept either
