"""``Worker``: run a handler over a consumer group's stream with bounded concurrency.

Each message is acked when its handler returns and nacked with an exponential backoff
(by delivery count) when it raises; at the group's max delivery count that nack sends it
to the group's DLQ (the server does, at once), and the log says so. Handlers that run
long keep their messages invisible by extending the visibility timeout periodically.
``stop()`` (or SIGINT / SIGTERM) stops taking messages, lets running handlers finish and
flushes their acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cherami.client.models import Received
from cherami.client.stream import StreamConsumer

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient

log = logging.getLogger("cherami.client.worker")

Handler = Callable[[Received], Any]
"""A plain function (run in a thread) or a coroutine function; its result is ignored."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Nack delay for a failed delivery: ``min(max, base * factor ** (delivery_count - 1))``."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 60.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.max < 0 or self.factor < 1:
            raise ValueError("backoff needs base >= 0, max >= 0 and factor >= 1")

    def delay(self, delivery_count: int) -> float:
        exponent = max(0, delivery_count - 1)
        try:
            return min(float(self.max), float(self.base) * float(self.factor) ** exponent)
        except OverflowError:
            return float(self.max)


def backoff(value: Backoff | tuple[float, float, float]) -> Backoff:
    return value if isinstance(value, Backoff) else Backoff(*value)


class Worker:
    """Consume ``queue``/``group`` and run ``handler`` on each message, at most
    ``concurrency`` at once.

    ``credit`` bounds the messages held by the stream (default: ``concurrency``, so that
    no message waits unhandled while its visibility timeout runs). ``extend_every``
    defaults to half the group's visibility timeout. ``max_messages`` stops the worker
    after that many messages were taken; ``idle_timeout`` stops it once no message
    arrived for that many seconds while no handler was running.
    """

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        group: str,
        handler: Handler,
        concurrency: int = 4,
        *,
        credit: int | None = None,
        nack_backoff: Backoff | tuple[float, float, float] = Backoff(),
        extend_every: float | None = None,
        stop_signals: bool = True,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.queue = queue
        self.group = group
        self.handler = handler
        self.concurrency = concurrency
        self.credit = credit if credit is not None else concurrency
        self.backoff = backoff(nack_backoff)
        self.extend_every = extend_every
        self.stop_signals = stop_signals
        self.max_messages = max_messages
        self.idle_timeout = idle_timeout
        self.taken = self.acked = self.nacked = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._stop_requested = False
        self._running: set[asyncio.Task[None]] = set()
        self._active: dict[int, Received] = {}  # messages in a handler, by stream handle
        self._next: asyncio.Task[Received | None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._max_deliveries: int | None = None  # the group's, as run() found it

    # control
    def stop(self) -> None:
        """Stop taking messages; ``run()`` returns once running handlers finished.
        Safe to call from any thread, and from a handler."""
        self._stop_requested = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if _running_loop() is loop:
            self._stopping.set()
        else:
            loop.call_soon_threadsafe(self._stopping.set)

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    # the loop
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stopping.set()
        config = await self.client.get_group(self.queue, self.group)
        visibility = float(config["visibility_timeout_seconds"])
        limit = config.get("max_delivery_count")
        self._max_deliveries = int(limit) if limit is not None else None
        every = self.extend_every if self.extend_every is not None else visibility / 2
        with self._signals():
            async with self.client.consumer(self.queue, self.group, self.credit) as consumer:
                extender = asyncio.create_task(self._extend_loop(consumer, every, visibility))
                try:
                    await self._consume(consumer)
                finally:
                    await self._drain(consumer)
                    extender.cancel()
                    await asyncio.gather(extender, return_exceptions=True)
                    with contextlib.suppress(Exception):
                        await consumer.flush()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _consume(self, consumer: StreamConsumer) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        while not self._stopping.is_set():
            await slots.acquire()
            message = await self._take(consumer)
            if message is None:
                slots.release()
                if self._idle():
                    log.info("worker %s/%s idle, stopping", self.queue, self.group)
                    self.stop()
                continue
            self.taken += 1
            task = asyncio.create_task(self._handle(consumer, message, slots))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            if self.max_messages is not None and self.taken >= self.max_messages:
                self.stop()

    def _idle(self) -> bool:
        return self.idle_timeout is not None and not self._running

    async def _take(self, consumer: StreamConsumer) -> Received | None:
        """The next message; None when stopping or after ``idle_timeout`` without one.
        A pending ``get`` survives a stop, so no delivered message is dropped silently."""
        if self._next is None:
            self._next = asyncio.ensure_future(consumer.get(self.idle_timeout))
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({self._next, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not self._next.done() or self._stopping.is_set():
            return None
        done, self._next = self._next, None
        return done.result()

    async def _drain(self, consumer: StreamConsumer) -> None:
        """Wait for running handlers; give back a message taken but never handled."""
        pending, self._next = self._next, None
        if pending is not None:
            if not pending.done():
                pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                leftover = await pending
                if leftover is not None:
                    await consumer.nack(leftover)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _handle(
        self, consumer: StreamConsumer, message: Received, slots: asyncio.Semaphore
    ) -> None:
        handle = message.handle if message.handle is not None else id(message)
        self._active[handle] = message
        try:
            await self._call(message)
        except Exception as err:
            limit = self._max_deliveries
            if limit is not None and message.delivery_count >= limit:
                delay = 0.0  # the nack sends it to the DLQ at once: no delay to wait
                log.warning(
                    "handler failed on %s (queue %s, group %s, delivery %d of %d), "
                    "sending it to the DLQ: %r",
                    message.id, self.queue, self.group, message.delivery_count, limit, err,
                )  # fmt: skip
            else:
                delay = self.backoff.delay(message.delivery_count)
                log.warning(
                    "handler failed on %s (queue %s, group %s, delivery %d), retrying in "
                    "%.1fs: %r",
                    message.id, self.queue, self.group, message.delivery_count, delay, err,
                )  # fmt: skip
            self.nacked += 1
            await consumer.nack(message, delay_seconds=delay)
        else:
            self.acked += 1
            consumer.ack(message)
        finally:
            del self._active[handle]
            slots.release()

    async def _call(self, message: Received) -> None:
        if _is_async(self.handler):
            await self.handler(message)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, "cherami-worker")
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self.handler, message)
        if inspect.isawaitable(result):
            await result

    async def _extend_loop(self, consumer: StreamConsumer, every: float, visibility: float) -> None:
        """Push back the visibility timeout of every message still in a handler."""
        while True:
            await asyncio.sleep(every)
            if self._active:
                started = time.monotonic()
                await consumer.extend(*self._active.values(), visibility_timeout_seconds=visibility)
                log.debug("extended %d in %.3fs", len(self._active), time.monotonic() - started)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if not self.stop_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        installed = []
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
                handler = previous[sig]
                if handler is not None:
                    signal.signal(sig, handler)


def _is_async(handler: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
