"""``AsyncClient``: the asyncio client of the HTTP API and the streaming endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from cherami.client.models import (
    OutgoingMessage,
    ReceiveAnswer,
    Received,
    message_list,
    publish_item,
    receipt_list,
)
from cherami.client.stream import Publisher, StreamConsumer
from cherami.errors import ConfigError, Throttled, Unavailable, error_from_response
from cherami.wire import tls

PUBLISH_BATCH = 1000
# How long publish() keeps sending a batch again that was refused 503 (its input host
# failed, was paused or moved): past the cluster's failover, which takes a few seconds.
PUBLISH_RETRY_SECONDS = 30.0
# How long publish() keeps sending a batch again that was refused 429 (``throttled``,
# ``backlog_full``: nothing of it was stored), each time after the wait the server names.
THROTTLED_RETRY_SECONDS = 300.0
DEFAULT_URL = "http://127.0.0.1:8080"
# an idempotent call that could not connect or was answered 503 is sent again this long
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
IDEMPOTENT_RETRY_SECONDS = 2.0
# queues or groups a listing asks the server for at once (the most it answers)
PAGE_SIZE = 1000


class _TimedOut(Unavailable):
    """A call that got no answer in time: it may have been applied, so never resent."""


class _Dropped(Unavailable):
    """The connection broke after the call was sent: resent only when it only reads."""


class _Unreachable(Unavailable):
    """No connection was made (refused, no route): nothing was sent."""


def connection_defaults(url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """The URL and key a client uses: as given, else from the environment like the CLI."""
    return (
        url or os.environ.get("CHERAMI_URL") or DEFAULT_URL,
        api_key if api_key is not None else os.environ.get("CHERAMI_API_KEY") or None,
    )


class AsyncClient:
    """``throttled_retry_seconds``: how long a publish refused 429 (over a limit, or the
    queue's backlog full) keeps being sent again, each time after the wait the server
    names, before ``Throttled`` / ``BacklogFull`` is raised (0: raise at once).
    ``tls_ca``: for an ``https://`` URL, the PEM CA certificate the server's certificate
    is verified with (default ``CHERAMI_TLS_CA``, else the system's trust store).
    ``url`` and ``api_key`` default to ``CHERAMI_URL`` and ``CHERAMI_API_KEY``, as for
    the CLI (then ``http://127.0.0.1:8080`` and no key). ``idempotent_retry_seconds``:
    how long an idempotent call (GET, PUT, DELETE) that could not connect or was
    answered 503 is sent again, with backoff (0: never); a timeout is never retried, a
    connection broken after the call was sent only for a GET."""

    def __init__(self, url: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0,
                 throttled_retry_seconds: float = THROTTLED_RETRY_SECONDS, *,
                 tls_ca: str | None = None,
                 idempotent_retry_seconds: float = IDEMPOTENT_RETRY_SECONDS) -> None:  # fmt: skip
        url, api_key = connection_defaults(url, api_key)
        self.url = url.rstrip("/")
        self._ssl = tls.public_client(self.url, tls_ca)
        self.throttled_retry_seconds = throttled_retry_seconds
        self.idempotent_retry_seconds = idempotent_retry_seconds
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        # the server has answered once: a connection refused after that is an outage
        # (a restart) that publish rides out; before it, most likely a wrong URL
        self._reached = False
        self._closer: AsyncGenerator[None, None] | None = None  # see _closed_with_the_loop

    @property
    def reached(self) -> bool:
        """Whether the server has answered this client once (any answer): a connection
        refused after that is an outage to ride out, before it most likely a wrong URL."""
        return self._reached

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=self._ssl),
            )  # fmt: skip
            self._closer = _closed_with_the_loop(self._session)
        return self._session

    async def close(self) -> None:
        closer, self._closer = self._closer, None
        if closer is not None:
            await closer.aclose()  # closes the session
        elif self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        await self.close()

    async def request(self, method: str, path: str, body: Any = None,
                      params: dict[str, str] | None = None,
                      answer_type: Any = Any) -> Any:  # fmt: skip
        """One call; an idempotent one is sent again while it could not connect or was
        answered 503, for up to ``idempotent_retry_seconds``."""
        loop = asyncio.get_running_loop()
        budget = self.idempotent_retry_seconds if method in IDEMPOTENT else 0.0
        deadline = loop.time() + budget
        pause = 0.1
        while True:
            try:
                return await self._send(method, path, body, params, answer_type)
            except _TimedOut:
                raise
            except _Dropped:
                if method not in ("GET", "HEAD") or loop.time() + pause > deadline:
                    raise
            except Unavailable:  # not connected, or answered 503: nothing was done
                if loop.time() + pause > deadline:
                    raise
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(2 * pause, 1.0)

    async def _send(
        self, method: str, path: str, body: Any, params: dict[str, str] | None,
        answer_type: Any = Any,
    ) -> Any:  # fmt: skip
        data = msgspec.json.encode(body) if body is not None else None
        try:
            async with self.session.request(
                method, self.url + path, data=data, params=params,
                headers={"Content-Type": "application/json"} if data is not None else None,
            ) as resp:  # fmt: skip
                self._reached = True
                raw = await resp.read()
                if resp.status >= 400:
                    raise error_from_response(resp.status, raw)
                return msgspec.json.decode(raw, type=answer_type) if raw else None
        except TimeoutError as err:
            raise _TimedOut(f"{self.url}: request timed out") from err
        except aiohttp.ClientConnectorError as err:
            # a name that never resolved is a wrong URL; once the server answered, one that
            # stops resolving (a service with no ready host, a resolver down) is an outage
            unresolved = isinstance(err.os_error, socket.gaierror) and not self._reached
            if unresolved and err.os_error.errno != socket.EAI_AGAIN:
                raise ConfigError(
                    f"{self.url}: cannot resolve the host (check the URL): {err}"
                ) from None
            raise _Unreachable(f"{self.url}: {err}") from err
        except aiohttp.ClientError as err:
            raise _Dropped(f"{self.url}: {err}") from err

    # queues
    @staticmethod
    def _q(queue: str) -> str:
        return f"/v1/queues/{quote(queue, safe='')}"

    def _g(self, queue: str, group: str) -> str:
        return f"{self._q(queue)}/groups/{quote(group, safe='')}"

    async def create_queue(self, queue: str, **config: Any) -> dict[str, Any]:
        return await self.request("PUT", self._q(queue), config)  # type: ignore[no-any-return]

    async def list_queues(
        self, prefix: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The queues by name: those whose names start with ``prefix``, every one or
        the first ``limit``, read a page at a time (``iter_queues``)."""
        return [queue async for queue in self.iter_queues(prefix, limit=limit)]

    def iter_queues(
        self, prefix: str | None = None, *, limit: int | None = None, page_size: int = PAGE_SIZE
    ) -> AsyncIterator[dict[str, Any]]:
        """The queues by name, as ``list_queues``, each page asked for when the one
        before is used up (``page_size`` at a time, 1 to 1000)."""
        return self._listing("/v1/queues", "queues", prefix, limit, page_size)

    async def get_queue(self, queue: str) -> dict[str, Any]:
        return await self.request("GET", self._q(queue))  # type: ignore[no-any-return]

    async def update_queue(self, queue: str, **patch: Any) -> dict[str, Any]:
        return await self.request("PATCH", self._q(queue), patch)  # type: ignore[no-any-return]

    async def delete_queue(self, queue: str, contents_only: bool = False) -> None:
        params = {"contents_only": "true"} if contents_only else None
        await self.request("DELETE", self._q(queue), params=params)

    # groups
    async def create_group(self, queue: str, group: str, **config: Any) -> dict[str, Any]:
        return await self.request("PUT", self._g(queue, group), config)  # type: ignore[no-any-return]

    async def list_groups(
        self, queue: str, prefix: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The queue's groups by name, as ``list_queues``."""
        return [group async for group in self.iter_groups(queue, prefix, limit=limit)]

    def iter_groups(
        self, queue: str, prefix: str | None = None, *, limit: int | None = None,
        page_size: int = PAGE_SIZE,
    ) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
        """The queue's groups by name, a page at a time, as ``iter_queues``."""
        return self._listing(self._q(queue) + "/groups", "groups", prefix, limit, page_size)

    async def _listing(
        self, path: str, key: str, prefix: str | None, limit: int | None, page_size: int
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The items of a listing (docs/api.md "List"), page after page: each page asks
        for what is left, after the cursor of the one before, until one has none."""
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be from 1 to 1000, not {page_size}")
        left = limit
        params = {"prefix": prefix} if prefix else {}
        while left is None or left > 0:
            params["limit"] = str(page_size if left is None else min(page_size, left))
            page = await self.request("GET", path, params=params)
            items = page[key] if left is None else page[key][:left]
            for item in items:
                yield item
            if left is not None:
                left -= len(items)
            if not page.get("cursor"):  # the last page (a server before paging sent all)
                return
            params["cursor"] = page["cursor"]

    async def get_group(self, queue: str, group: str) -> dict[str, Any]:
        return await self.request("GET", self._g(queue, group))  # type: ignore[no-any-return]

    async def update_group(self, queue: str, group: str, **patch: Any) -> dict[str, Any]:
        return await self.request("PATCH", self._g(queue, group), patch)  # type: ignore[no-any-return]

    async def delete_group(self, queue: str, group: str) -> None:
        await self.request("DELETE", self._g(queue, group))

    # messages over HTTP
    async def publish(
        self,
        queue: str,
        messages: Iterable[OutgoingMessage | bytes | str],
        retry_seconds: float = PUBLISH_RETRY_SECONDS,
    ) -> list[str]:
        """Publish in batches of 1000; returns once every message is durable.

        A batch refused with 503 (``unavailable``, ``moved``, ``extent_sealed``) or lost
        with its connection is sent again, with back-off, for up to ``retry_seconds``
        (0: never); part of a refused batch may be stored already, so a retried batch
        can store some messages twice (publishing is at-least-once).

        A batch refused 429 (``throttled``, ``backlog_full``) stored nothing: it is sent
        again after the wait the server names, for up to ``throttled_retry_seconds``, so
        publishing slows to the limit and loses nothing."""
        items = list(map(publish_item, message_list(messages)))
        ids: list[str] = []
        for start in range(0, len(items), PUBLISH_BATCH):
            reply = await self._retrying(
                retry_seconds,
                "POST",
                self._q(queue) + "/messages",
                {"messages": items[start : start + PUBLISH_BATCH]},
            )
            ids.extend(reply["ids"])
        return ids

    async def _retrying(self, retry_seconds: float, method: str, path: str, body: Any) -> Any:
        """``request`` sent again while refused 503 or 429 (see ``publish``). A server
        never reached is given what an idempotent call gives it, not ``retry_seconds``:
        a wrong URL or a node not started made ``cherami publish`` wait 30 s in silence."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_seconds
        unreached_deadline = loop.time() + min(retry_seconds, self.idempotent_retry_seconds)
        throttled_deadline = loop.time() + self.throttled_retry_seconds
        pause = 0.1
        while True:
            try:
                return await self.request(method, path, body)
            except Throttled as err:
                wait = throttle_wait(err)
                if loop.time() + wait > throttled_deadline:
                    raise
                await asyncio.sleep(wait)
                continue
            except Unavailable as err:
                unreached = isinstance(err, _Unreachable) and not self._reached
                if loop.time() + pause > (unreached_deadline if unreached else deadline):
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)

    async def receive(
        self,
        queue: str,
        group: str,
        max_messages: int = 10,
        wait_seconds: float = 0,
        visibility_timeout_seconds: float | None = None,
    ) -> list[Received]:
        body: dict[str, Any] = {"max_messages": max_messages, "wait_seconds": wait_seconds}
        if visibility_timeout_seconds is not None:
            body["visibility_timeout_seconds"] = visibility_timeout_seconds
        answer = await self.request(
            "POST", self._g(queue, group) + "/receive", body, answer_type=ReceiveAnswer
        )
        return answer.received()  # type: ignore[no-any-return]

    async def ack(self, queue: str, group: str, receipts: Any) -> dict[str, Any]:
        """Ack by receipts, or the messages a receive returned (one or a list)."""
        body = {"receipts": receipt_list(receipts)}
        return await self.request("POST", self._g(queue, group) + "/ack", body)  # type: ignore[no-any-return]

    async def nack(
        self, queue: str, group: str, receipts: Any, delay_seconds: float = 0
    ) -> dict[str, Any]:
        body = {"receipts": receipt_list(receipts), "delay_seconds": delay_seconds}
        return await self.request("POST", self._g(queue, group) + "/nack", body)  # type: ignore[no-any-return]

    async def extend(self, queue: str, group: str, receipts: Any,
                     visibility_timeout_seconds: float) -> dict[str, Any]:  # fmt: skip
        body = {
            "receipts": receipt_list(receipts),
            "visibility_timeout_seconds": visibility_timeout_seconds,
        }
        return await self.request("POST", self._g(queue, group) + "/visibility", body)  # type: ignore[no-any-return]

    # dead-letter queue
    async def dlq(self, queue: str, group: str, limit: int = 100) -> dict[str, Any]:
        path = self._g(queue, group) + "/dlq"
        return await self.request("GET", path, params={"limit": str(limit)})  # type: ignore[no-any-return]

    async def dlq_merge(self, queue: str, group: str) -> int:
        return (await self.request("POST", self._g(queue, group) + "/dlq/merge"))["merged"]  # type: ignore[no-any-return]

    async def dlq_purge(self, queue: str, group: str) -> int:
        return (await self.request("POST", self._g(queue, group) + "/dlq/purge"))["purged"]  # type: ignore[no-any-return]

    # message-store reads (docs/api.md "Peek")
    async def peek(
        self, queue: str, since: datetime | int | str | None = None,
        until: datetime | int | str | None = None, limit: int = 100, order: str = "asc",
        cursor: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One page of the queue's retained messages, read without consuming them:
        ``{"messages": [...], "cursor": ...}``, oldest first (``order="desc"``: newest
        first). Pass ``cursor`` back for the next page; None is the last. ``since`` and
        ``until`` bound the enqueue time: a datetime (a naive one is local time), ms
        since the epoch, or RFC 3339 text."""
        params = {"limit": str(limit), "order": order}
        for name, when in (("since", since), ("until", until)):
            if when is not None:
                params[name] = _time_param(when)
        if cursor:
            params["cursor"] = cursor
        return await self.request("GET", self._q(queue) + "/messages", params=params)  # type: ignore[no-any-return]

    def iter_peek(
        self, queue: str, since: datetime | int | str | None = None,
        until: datetime | int | str | None = None, order: str = "asc", *,
        limit: int | None = None, page_size: int = PAGE_SIZE,
    ) -> AsyncGenerator[dict[str, Any], None]:  # fmt: skip
        """The queue's retained messages as ``peek`` reads them, each page asked for
        when the one before is used up (``page_size`` at a time, 1 to 1000); every one,
        or the first ``limit``."""
        return _every(
            lambda size, cursor: self.peek(queue, since, until, size, order, cursor),
            limit, page_size,
        )  # fmt: skip

    # scheduled messages (docs/api.md "Scheduled messages")
    async def scheduled(
        self, queue: str, until: datetime | int | str | None = None, limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One page of the queue's delayed messages not due yet, in due order:
        ``{"messages": [...], "cursor": ...}`` (each with its ``due_at``); pass ``cursor``
        back for the next page (None: the last). ``until``: only those due before it."""
        params = {"limit": str(limit)}
        if until is not None:
            params["until"] = _time_param(until)
        if cursor:
            params["cursor"] = cursor
        return await self.request("GET", self._q(queue) + "/scheduled", params=params)  # type: ignore[no-any-return]

    def iter_scheduled(
        self, queue: str, until: datetime | int | str | None = None, *,
        limit: int | None = None, page_size: int = PAGE_SIZE,
    ) -> AsyncGenerator[dict[str, Any], None]:  # fmt: skip
        """Every delayed message not due yet (or the first ``limit``), in due order, a
        page at a time."""
        return _every(
            lambda size, cursor: self.scheduled(queue, until, size, cursor), limit, page_size
        )

    async def cancel_scheduled(self, queue: str, message_id: str) -> None:
        """Cancel a delayed message before it is due: no group ever receives it.
        MessageNotFound when none such is pending, AlreadyDue when it is due (or due
        within 5 s)."""
        await self.request("DELETE", f"{self._q(queue)}/scheduled/{quote(message_id, safe='')}")

    # streams
    def ws_url(self, path: str) -> str:
        return "ws" + self.url[4:] + path

    def publisher(self, queue: str, max_in_flight: int = 16) -> Publisher:
        """A streaming publisher (use ``async with``)."""
        return Publisher(self, self._q(queue) + "/publish", max_in_flight)

    def consumer(self, queue: str, group: str, credit: int = 2000) -> StreamConsumer:
        """A streaming consumer (use ``async with``, then iterate)."""
        return StreamConsumer(self, self._g(queue, group) + "/consume", credit)

    async def run_worker(self, queue: str, group: str, handler: Any, concurrency: int = 4,
                         **options: Any) -> None:  # fmt: skip
        from cherami.client.worker import Worker

        await Worker(self, queue, group, handler, concurrency, **options).run()


def _closed_with_the_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """A started async generator whose end closes ``session``, so that a client nobody
    closed leaves no session open (aiohttp warns "Unclosed client session" at exit). Its
    event loop ends it: at the loop's shutdown (``asyncio.run`` and ``Client``'s loop
    thread call ``shutdown_asyncgens``), or once the client that holds it is dropped."""

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await session.close()

    generator = closer()
    with contextlib.suppress(StopIteration):  # runs it to its yield, registered with the loop
        generator.asend(None).send(None)
    return generator


def throttle_wait(err: Throttled) -> float:
    """How long to wait before sending a refused batch again: the server's wait, plus up
    to 10% so that producers it refused together do not all come back at once."""
    return err.retry_after * (1 + 0.1 * random.random())


def _time_param(when: datetime | int | str) -> str:
    """A time as a query parameter: ms since the epoch (a naive datetime is local
    time), or the text given."""
    return str(int(when.timestamp() * 1000)) if isinstance(when, datetime) else str(when)


async def _every(
    page: Callable[[int, str | None], Awaitable[dict[str, Any]]],
    limit: int | None,
    page_size: int,
) -> AsyncGenerator[dict[str, Any], None]:
    """Every message of a paged listing (or the first ``limit``), each page asked for
    (``page(size, cursor)``) when the one before is used up."""
    left, cursor = limit, None
    while left is None or left > 0:
        size = page_size if left is None else min(page_size, left)
        got = await page(size, cursor)
        for message in got["messages"]:
            yield message
        if left is not None:
            left -= len(got["messages"])
        cursor = got["cursor"]
        if cursor is None:
            return
