"""What the streaming publisher and consumer share (docs/protocol.md): opening a
WebSocket stream through the client's URL or straight to a host the routing call lists,
reading its binary messages, reading a route, and the tasks a stream client keeps."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from cherami.errors import (
    CheramiError,
    GroupNotFound,
    InvalidRequest,
    QueueNotFound,
    Unavailable,
    error_from_code,
)
from cherami.wire import close

if TYPE_CHECKING:
    from cherami.client.asyncclient import AsyncClient

# one logger for the publisher and the consumer, named as before they had modules of
# their own, so logging set up for it keeps working
log = logging.getLogger("cherami.client.stream")

WS_MAX_MSG = 64 << 20
RECONNECT_PATIENCE = 120.0  # seconds a lost stream keeps trying to reconnect
HEARTBEAT = 5.0  # ping the server this often; a server silent for 1.5x this is lost
DIAL_TIMEOUT = 3.0  # a listed host that has not taken the upgrade by then is skipped


class Patience:
    """A lost stream's reconnect attempts: pauses of 0.1 s doubling to 2 s between
    them, for up to RECONNECT_PATIENCE seconds from its making (in a running loop)."""

    __slots__ = ("_attempt", "_give_up", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._give_up = self._loop.time() + RECONNECT_PATIENCE
        self._attempt = 0

    async def pause(self) -> None:
        """Wait before the next attempt."""
        await asyncio.sleep(min(2.0, 0.1 * 2**self._attempt))
        self._attempt += 1

    @property
    def over(self) -> bool:
        """RECONNECT_PATIENCE seconds have passed: give up."""
        return self._loop.time() >= self._give_up


async def connect(client: AsyncClient, path: str) -> aiohttp.ClientWebSocketResponse:
    """A stream through the client's own URL; the server's refusal raised as its error."""
    try:
        return await client.session.ws_connect(
            client.ws_url(path), max_msg_size=WS_MAX_MSG, heartbeat=HEARTBEAT, autoping=True
        )
    except aiohttp.WSServerHandshakeError as err:
        if 400 <= err.status < 500:
            # the handshake carries no error body: ask the resource for its exact error
            resource = await client.request("GET", path.rsplit("/", 1)[0])
            if isinstance(resource, dict) and resource.get("type") == "stream":
                raise InvalidRequest(
                    f"group {resource.get('name')} is a stream-mode group: it is read by "
                    "offsets (the Spark source), not by a consume stream"
                ) from None
        raise error_from_code(_code_for(err.status), err.message) from None
    except (aiohttp.ClientError, OSError) as err:
        raise Unavailable(f"{client.url}: {err}") from err


async def incoming(ws: aiohttp.ClientWebSocketResponse) -> AsyncIterator[bytes]:
    """The binary messages of a stream until it closes. The close code the server sent
    is kept as ``ws.sent_code`` (aiohttp reports 1006 in ``close_code`` when the server
    drops the connection right after its close frame, before our reply)."""
    ws.sent_code = None  # type: ignore[attr-defined]
    while True:
        msg = await ws.receive()
        if msg.type == aiohttp.WSMsgType.BINARY:
            yield msg.data
        elif msg.type == aiohttp.WSMsgType.CLOSE:
            ws.sent_code = msg.data  # type: ignore[attr-defined]
        elif msg.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                          aiohttp.WSMsgType.ERROR):  # fmt: skip
            return


async def dial(
    client: AsyncClient, address: str, path: str, heartbeat: float, what: str
) -> aiohttp.ClientWebSocketResponse | None:
    """A stream straight to a host the routing call listed; None when it does not take
    one within DIAL_TIMEOUT."""
    scheme = client.ws_url("").split(":", 1)[0]
    try:
        async with asyncio.timeout(DIAL_TIMEOUT):
            return await client.session.ws_connect(
                f"{scheme}://{address}{path}", max_msg_size=WS_MAX_MSG, heartbeat=heartbeat,
                autoping=True,
            )  # fmt: skip
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        log.info("%s: %s takes no stream: %s", what, address, err)
        return None


def deleted(ws: aiohttp.ClientWebSocketResponse) -> bool:
    """The server closed the stream because its queue or group was deleted."""
    return getattr(ws, "sent_code", None) == close.DELETED or ws.close_code == close.DELETED


def _code_for(status: int) -> str:
    return {400: "invalid_request", 401: "unauthorized", 403: "forbidden",
            404: "queue_not_found", 429: "too_many_streams",
            503: "unavailable"}.get(status, "internal")  # fmt: skip


def keep(
    tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None], what: str
) -> asyncio.Task[None]:
    """Run ``work`` as a task held in ``tasks`` until it ends; a failure is logged."""
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(functools.partial(_forget, tasks, what))
    return task


def _forget(tasks: set[asyncio.Task[None]], what: str, task: asyncio.Task[None]) -> None:
    tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", what, exc_info=task.exception())


async def routed(client: AsyncClient, path: str, field: str) -> tuple[list[str], float | None]:
    """The addresses a routing call at ``path`` lists (its ``field``) and the
    ``refresh_seconds`` it gives; ([], None) when it cannot answer (a metadata outage, a
    server without the call). A queue or group that does not exist raises NotFound."""
    try:
        body = await client.request("GET", path)
    except (QueueNotFound, GroupNotFound):
        raise
    except CheramiError as err:
        log.info("no route at %s: %s", path, err)
        return [], None
    try:
        return [str(h["address"]) for h in body[field]], float(body["refresh_seconds"])
    except (KeyError, TypeError, ValueError):
        log.warning("a route it cannot read at %s: %r", path, body)
        return [], None
