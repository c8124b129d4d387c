"""How the other roles reach an input host: the frontend's publishes and the output
host's moves to a dead-letter queue go through an ``InputHostClient``.

- ``LocalInputHost``: the input host of this process (a node; a cluster's input-host
  process for its own API), called directly.
- ``RemoteInputHost``: an input host of the cluster that serves the queue, over the
  internal publish route (``INTERNAL_PUBLISH``, answered by ``internal_publish``),
  authenticated with the cluster's internal token (wire/handshake.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import msgspec
from aiohttp import web

from cherami.context import ProcessContext
from cherami.errors import Unauthorized, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Queue
from cherami.roles.inputhost.service import InputHostService
from cherami.wire import handshake as h
from cherami.wire.records import Message

INTERNAL_PUBLISH = "/internal/v1/queues/{queue}/messages"
# An internal publish (to a DLQ) that is not answered by then fails Unavailable and is
# retried by its caller, by when the route leads to the input host that took over. Long
# enough for the input host's own wait for an extent and one append with its timeout.
PUBLISH_REMOTE_TIMEOUT = 10.0
_messages = msgspec.msgpack.Decoder(list[Message])
_ids = msgspec.msgpack.Decoder(list[str])
_encoder = msgspec.msgpack.Encoder()


class InputHostClient(Protocol):
    @property
    def host_id(self) -> str | None:
        """The input host's id when it runs in this process, else None."""
        ...

    async def serves(self, queue: str) -> bool:
        """Whether the queue's publishes are taken here (it has extents here)."""
        ...

    async def publish(self, queue: Queue, messages: list[Message]) -> list[str]:
        """Append every message durably; their ids in order."""
        ...


class LocalInputHost:
    """The input host of this process."""

    def __init__(self, service: InputHostService) -> None:
        self.service = service

    @property
    def host_id(self) -> str | None:
        return self.service.host_id

    async def serves(self, queue: str) -> bool:
        return await self.service.serves(queue)

    async def publish(self, queue: Queue, messages: list[Message]) -> list[str]:
        return await self.service.publish(queue, messages)


class RemoteInputHost:
    """The input hosts of a cluster: each publish goes to one that serves the queue."""

    host_id = None

    def __init__(
        self,
        address: Callable[[str], Awaitable[str]],
        session: Callable[[], aiohttp.ClientSession],
        ctx: ProcessContext,
    ) -> None:
        """``address`` finds an input host serving a queue (proxy.Router.input_host)."""
        self._address = address
        self._session = session
        self._ctx = ctx

    async def serves(self, queue: str) -> bool:
        return True  # some input host of the cluster does; publish finds it

    async def publish(self, queue: Queue, messages: list[Message]) -> list[str]:
        address = await self._address(queue.name)
        url = f"{self._ctx.http_scheme}://{address}{INTERNAL_PUBLISH.format(queue=queue.name)}"
        timeout = aiohttp.ClientTimeout(total=PUBLISH_REMOTE_TIMEOUT)
        try:
            async with self._session().post(
                url, data=_encoder.encode(messages), timeout=timeout,
                headers=self._ctx.internal_headers(),
            ) as resp:  # fmt: skip
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise Unavailable(f"publish to {queue.name} via {address}: {err!r}") from err
        if resp.status != 200:
            raise Unavailable(f"publish to {queue.name} via {address} failed: {resp.status}")
        return _ids.decode(body)


def internal_publish(inputs: InputHostService, metadata: MetadataStore, ctx: ProcessContext) -> Any:
    """The handler of INTERNAL_PUBLISH on an input host's process."""

    async def handler(request: web.Request) -> web.Response:
        # only a process of the cluster may publish here (never an API key)
        if not ctx.internal_ok(request.headers.get(h.INTERNAL_HEADER)):
            raise Unauthorized("internal route: the cluster's internal token is required")
        queue = await metadata.get_queue(request.match_info["queue"])
        if not await inputs.serves(queue.name):
            raise Unavailable(f"queue {queue.name} has no extent on this input host")
        ids = await inputs.publish(queue, _messages.decode(await request.read()))
        return web.Response(body=_encoder.encode(ids), content_type="application/msgpack")

    return handler
