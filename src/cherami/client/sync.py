"""``Client``: the blocking client, a thin wrapper over ``AsyncClient``.

Each ``Client`` runs a private event loop in a background thread; every method hands
its coroutine to that loop and waits for the result, so a ``Client`` may be shared by
threads.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import signal
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar, cast

from cherami.client.asyncclient import (
    IDEMPOTENT_RETRY_SECONDS,
    PAGE_SIZE,
    PUBLISH_RETRY_SECONDS,
    THROTTLED_RETRY_SECONDS,
    AsyncClient,
)
from cherami.client.models import OutgoingMessage, Received, message_list
from cherami.client.stream import Publisher, StreamConsumer
from cherami.client.worker import STOP_SIGNALS, Handler, Worker

T = TypeVar("T")

Messages = Iterable[OutgoingMessage | bytes | str]


class _LoopThread:
    """An event loop running in a daemon thread until ``stop``, which first awaits
    ``cleanup`` (the client's close: a Client dropped or left open at exit still closes
    its session, else aiohttp warns "Unclosed client session")."""

    live: set[_LoopThread] = set()  # stopped at exit (_stop_all)

    def __init__(self, cleanup: Callable[[], Awaitable[object]]) -> None:
        self.loop = asyncio.new_event_loop()
        self._cleanup = cleanup
        self._thread = threading.Thread(target=self._main, name="cherami-client", daemon=True)
        self._stopping = threading.Lock()  # held once asked to stop: it stops once
        _LoopThread.live.add(self)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(_cancel_the_rest())  # e.g. of a stream left open
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.run_until_complete(self.loop.shutdown_default_executor())
            finally:
                self.loop.close()
                _LoopThread.live.discard(self)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a Client must not be called from its own event loop")
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting
            raise

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def stop_soon(self) -> None:
        """Clean up, then stop the loop, without waiting: safe from any thread (the
        loop's too: a finalizer may run there) and more than once."""
        if not self._stopping.acquire(blocking=False):
            return
        last = self._last()
        try:
            self.submit(last)
        except RuntimeError:  # the loop is closed
            last.close()

    async def _last(self) -> None:
        try:
            with contextlib.suppress(Exception):  # stopping regardless (close() reports it)
                async with asyncio.timeout(STOP_CLEANUP_SECONDS):
                    await self._cleanup()
        finally:
            self.loop.stop()

    def stop(self, timeout: float | None = None) -> None:
        self.stop_soon()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


STOP_CLEANUP_SECONDS = 5.0


async def _cancel_the_rest() -> None:
    """Cancel the tasks still running on a stopped loop, as ``asyncio.run`` does (a
    loop closed under them reports each: "Task was destroyed but it is pending")."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=STOP_CLEANUP_SECONDS)


@atexit.register
def _stop_all() -> None:
    """At exit, stop every Client's loop that is still running (each closes its client
    first), and wait for them."""
    threads = list(_LoopThread.live)
    for thread in threads:
        thread.stop_soon()
    for thread in threads:
        thread.stop(timeout=STOP_CLEANUP_SECONDS + 1)


class Client:
    """Blocking client of the HTTP API and the streams; same methods as ``AsyncClient``."""

    def __init__(
        self,
        url: str | None = None,  # default CHERAMI_URL, then http://127.0.0.1:8080
        api_key: str | None = None,  # default CHERAMI_API_KEY
        timeout: float = 60.0,
        throttled_retry_seconds: float = THROTTLED_RETRY_SECONDS,
        *,
        tls_ca: str | None = None,
        idempotent_retry_seconds: float = IDEMPOTENT_RETRY_SECONDS,
    ) -> None:
        self.aio = AsyncClient(url, api_key, timeout, throttled_retry_seconds, tls_ca=tls_ca,
                               idempotent_retry_seconds=idempotent_retry_seconds)  # fmt: skip
        self._loop = _LoopThread(cleanup=self.aio.close)
        self._closed = False
        # a Client dropped without close() still closes its session and ends its thread
        # (at exit, _stop_all does it, and waits)
        self._finalizer = weakref.finalize(self, self._loop.stop_soon)
        self._finalizer.atexit = False

    @property
    def url(self) -> str:
        return self.aio.url

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            self._loop.run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("client is closed")
        return self._loop.run(coro)

    # queues
    def create_queue(self, queue: str, **config: Any) -> dict[str, Any]:
        return self._run(self.aio.create_queue(queue, **config))

    def list_queues(
        self, prefix: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        return self._run(self.aio.list_queues(prefix, limit))

    def iter_queues(
        self, prefix: str | None = None, *, limit: int | None = None, page_size: int = PAGE_SIZE
    ) -> Iterator[dict[str, Any]]:
        """The queues by name, each page read when the one before is used up."""
        return self._iterate(self.aio.iter_queues(prefix, limit=limit, page_size=page_size))

    def get_queue(self, queue: str) -> dict[str, Any]:
        return self._run(self.aio.get_queue(queue))

    def update_queue(self, queue: str, **patch: Any) -> dict[str, Any]:
        return self._run(self.aio.update_queue(queue, **patch))

    def delete_queue(self, queue: str, contents_only: bool = False) -> None:
        self._run(self.aio.delete_queue(queue, contents_only))

    # groups
    def create_group(self, queue: str, group: str, **config: Any) -> dict[str, Any]:
        return self._run(self.aio.create_group(queue, group, **config))

    def list_groups(
        self, queue: str, prefix: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        return self._run(self.aio.list_groups(queue, prefix, limit))

    def iter_groups(
        self, queue: str, prefix: str | None = None, *, limit: int | None = None,
        page_size: int = PAGE_SIZE,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        """The queue's groups by name, a page at a time."""
        return self._iterate(self.aio.iter_groups(queue, prefix, limit=limit, page_size=page_size))

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator's items, each taken on the client's loop."""
        while (item := self._run(_next(items))) is not _END:
            yield cast(T, item)

    def get_group(self, queue: str, group: str) -> dict[str, Any]:
        return self._run(self.aio.get_group(queue, group))

    def update_group(self, queue: str, group: str, **patch: Any) -> dict[str, Any]:
        return self._run(self.aio.update_group(queue, group, **patch))

    def delete_group(self, queue: str, group: str) -> None:
        self._run(self.aio.delete_group(queue, group))

    # messages over HTTP
    def publish(
        self, queue: str, messages: Messages, retry_seconds: float = PUBLISH_RETRY_SECONDS
    ) -> list[str]:
        return self._run(self.aio.publish(queue, message_list(messages), retry_seconds))

    def receive(
        self,
        queue: str,
        group: str,
        max_messages: int = 10,
        wait_seconds: float = 0,
        visibility_timeout_seconds: float | None = None,
    ) -> list[Received]:
        return self._run(
            self.aio.receive(queue, group, max_messages, wait_seconds, visibility_timeout_seconds)
        )

    def ack(self, queue: str, group: str, receipts: Any) -> dict[str, Any]:
        return self._run(self.aio.ack(queue, group, receipts))

    def nack(
        self, queue: str, group: str, receipts: Any, delay_seconds: float = 0
    ) -> dict[str, Any]:
        return self._run(self.aio.nack(queue, group, receipts, delay_seconds))

    def extend(
        self, queue: str, group: str, receipts: Any, visibility_timeout_seconds: float
    ) -> dict[str, Any]:
        return self._run(self.aio.extend(queue, group, receipts, visibility_timeout_seconds))

    # dead-letter queue
    def dlq(self, queue: str, group: str, limit: int = 100) -> dict[str, Any]:
        return self._run(self.aio.dlq(queue, group, limit))

    def dlq_merge(self, queue: str, group: str) -> int:
        return self._run(self.aio.dlq_merge(queue, group))

    def dlq_purge(self, queue: str, group: str) -> int:
        return self._run(self.aio.dlq_purge(queue, group))

    # message-store reads (docs/api.md "Peek")
    def peek(
        self, queue: str, since: datetime | int | str | None = None,
        until: datetime | int | str | None = None, limit: int = 100, order: str = "asc",
        cursor: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One page of retained messages, read without consuming them (AsyncClient.peek)."""
        return self._run(self.aio.peek(queue, since, until, limit, order, cursor))

    def iter_peek(
        self, queue: str, since: datetime | int | str | None = None,
        until: datetime | int | str | None = None, order: str = "asc", *,
        limit: int | None = None, page_size: int = PAGE_SIZE,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        """The retained messages, each page read when the one before is used up."""
        return self._iterate(
            self.aio.iter_peek(queue, since, until, order, limit=limit, page_size=page_size)
        )

    # scheduled messages (docs/api.md "Scheduled messages")
    def scheduled(
        self, queue: str, until: datetime | int | str | None = None, limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One page of delayed messages not due yet (AsyncClient.scheduled)."""
        return self._run(self.aio.scheduled(queue, until, limit, cursor))

    def iter_scheduled(
        self, queue: str, until: datetime | int | str | None = None, *,
        limit: int | None = None, page_size: int = PAGE_SIZE,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Every delayed message not due yet, in due order, a page at a time."""
        return self._iterate(
            self.aio.iter_scheduled(queue, until, limit=limit, page_size=page_size)
        )

    def cancel_scheduled(self, queue: str, message_id: str) -> None:
        """Cancel a delayed message before it is due (AsyncClient.cancel_scheduled)."""
        self._run(self.aio.cancel_scheduled(queue, message_id))

    # streams
    def publisher(self, queue: str, max_in_flight: int = 16) -> SyncPublisher:
        """A streaming publisher (use ``with``)."""
        return SyncPublisher(self, self.aio.publisher(queue, max_in_flight))

    def consumer(self, queue: str, group: str, credit: int = 2000) -> SyncConsumer:
        """A streaming consumer (use ``with``, then iterate)."""
        return SyncConsumer(self, self.aio.consumer(queue, group, credit))

    def worker(
        self, queue: str, group: str, handler: Handler, concurrency: int = 4, **options: Any
    ) -> SyncWorker:
        """A ``Worker`` (see its options) to ``run()`` in this thread and ``stop()`` from
        any thread. Its handler runs in a thread pool unless it is a coroutine function."""
        return SyncWorker(self, Worker(self.aio, queue, group, handler, concurrency, **options))

    def run_worker(
        self, queue: str, group: str, handler: Handler, concurrency: int = 4, **options: Any
    ) -> None:
        """Run a ``Worker`` until it stops (see ``worker``)."""
        self.worker(queue, group, handler, concurrency, **options).run()


class SyncWorker:
    """Blocking view of a ``Worker``. With ``stop_signals`` (the default), ``run()``
    called from the main thread stops gracefully on SIGINT and SIGTERM."""

    def __init__(self, client: Client, worker: Worker) -> None:
        self._client = client
        self.worker = worker

    def run(self) -> None:
        worker = self.worker
        on_signals, worker.stop_signals = worker.stop_signals, False  # the loop is not main
        with _stop_on_signals(worker) if on_signals else contextlib.nullcontext():
            self._client._run(worker.run())

    def stop(self) -> None:
        self.worker.stop()


class SyncPublisher:
    """Blocking view of a streaming ``Publisher``."""

    def __init__(self, client: Client, publisher: Publisher) -> None:
        self._client = client
        self._inner = publisher

    def __enter__(self) -> SyncPublisher:
        self.open()
        return self

    def open(self) -> None:
        """Connect (``with`` does; so does the first ``send`` or ``publish``)."""
        self._client._run(self._inner.open())

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, messages: Messages) -> concurrent.futures.Future[list[str]]:
        """Send one batch (blocks while too many are in flight); returns a future of its ids."""
        sent = self._client._run(self._inner.send(message_list(messages)))
        return self._client._loop.submit(_result(sent))

    def publish(self, messages: Messages) -> list[str]:
        """Send one batch and wait until every message of it is durable."""
        return self._client._run(self._inner.publish(message_list(messages)))

    def flush(self) -> None:
        """Wait for every batch sent so far."""
        self._client._run(self._inner.flush())

    def close(self) -> None:
        self._client._run(self._inner.close())


class SyncConsumer:
    """Blocking view of a ``StreamConsumer``: ``get``/``get_batch`` or iterate, then
    settle each message with ``ack`` (batched) or ``nack``."""

    def __init__(self, client: Client, consumer: StreamConsumer) -> None:
        self._client = client
        self._inner = consumer

    def __enter__(self) -> SyncConsumer:
        self._client._run(self._inner.open())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, timeout: float | None = None) -> Received | None:
        """The next message, or None after ``timeout`` seconds without one."""
        return self._client._run(self._inner.get(timeout))

    def get_batch(self, max_messages: int = 1000, timeout: float | None = None) -> list[Received]:
        return self._client._run(self._inner.get_batch(max_messages, timeout))

    def __iter__(self) -> Iterator[Received]:
        while True:
            message = self.get()
            if message is None:
                return
            yield message

    def ack(self, *messages: Received) -> None:
        self._client._loop.call_soon(self._inner.ack, *messages)

    def nack(self, *messages: Received, delay_seconds: float = 0) -> None:
        self._client._run(self._inner._nack(messages, delay_seconds))

    def extend(self, *messages: Received, visibility_timeout_seconds: float) -> None:
        self._client._run(self._inner._extend(messages, visibility_timeout_seconds))

    def flush(self) -> None:
        """Send pending acks and credit now."""
        self._client._run(self._inner.flush())

    def close(self) -> None:
        self._client._run(self._inner.close())


_END = object()


async def _next(items: AsyncIterator[T]) -> T | object:
    """The next item, or _END after the last."""
    return await anext(items, _END)


async def _result(future: asyncio.Future[T]) -> T:
    return await future


@contextlib.contextmanager
def _stop_on_signals(worker: Worker) -> Iterator[None]:
    """In the main thread, let SIGINT and SIGTERM stop the worker (then restore)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: worker.stop()) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
