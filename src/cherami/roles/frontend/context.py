"""What the frontend's handlers share: the other roles (``Roles``, reached only
through their clients), and ``Lookup``, which finds the queue or group a request names
under its API key and says where it is served (here, or ``Forward`` to another host)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from cherami.context import DEFAULT, ProcessContext
from cherami.errors import GroupNotFound, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Group, Queue, check_name
from cherami.roles.controller.client import ControllerClient
from cherami.roles.frontend.auth import ApiKey, KeyRing, Scope
from cherami.roles.frontend.metrics import Metrics
from cherami.roles.frontend.proxy import Forward, Router
from cherami.roles.inputhost.client import InputHostClient
from cherami.roles.outputhost.client import OutputHostClient
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire import handshake as h


@dataclass
class Roles:
    """What the frontend uses: the other roles only through their clients."""

    metadata: MetadataStore
    stores: StoreDirectory
    controller: ControllerClient
    inputs: InputHostClient | None  # this process's; None: another process's (forwarded)
    outputs: OutputHostClient | None  # this process's; None: other processes' (forwarded)
    keys: KeyRing
    metrics: Metrics
    ready: Callable[[], bool]
    router: Router | None = None  # forwards what this process does not serve
    ctx: ProcessContext = DEFAULT  # the process's timing, cluster key and TLS (context.py)


class Lookup:
    """A request's queue or group, checked against its API key, and the host that
    serves it."""

    def __init__(
        self,
        keys: KeyRing,
        metadata: MetadataStore,
        inputs: InputHostClient | None,
        outputs: OutputHostClient | None,
        router: Router | None,
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        self.keys = keys
        self.ctx = ctx
        self.metadata = metadata
        self.inputs = inputs
        self.outputs = outputs
        self._router = router

    def auth(self, request: web.Request, scope: Scope | None, queue: str | None) -> ApiKey | None:
        if self.keys.enabled and _internal_direct(request, self.ctx):
            return None  # another process of the cluster, which checked its own caller
        return self.keys.check(request.headers.get("Authorization"), scope, queue)

    async def queue(self, request: web.Request, scope: Scope | None) -> Queue:
        name = check_name("queue", request.match_info["queue"])
        self.auth(request, scope, name)
        return await self.metadata.get_queue(name)

    async def group_record(self, request: web.Request, scope: Scope | None) -> Group:
        """The group's record: one read (a group's row exists only with its queue's: a
        queue is deleted with its groups at once). The queue's is read only when the
        group is not found, to say which of the two is missing (every receive and ack
        read both, on the frontend and again on the output host it was forwarded to)."""
        name = check_name("queue", request.match_info["queue"])
        self.auth(request, scope, name)
        group = check_name("group", request.match_info["group"])
        try:
            return await self.metadata.get_group(name, group)
        except GroupNotFound:
            await self.metadata.get_queue(name)  # QueueNotFound when it is the queue
            raise

    async def served_group(self, request: web.Request, scope: Scope | None) -> Group:
        """The group, when this process's output host serves it; else Forward to an
        output host that does."""
        group = await self.group_record(request, scope)
        if self.outputs is not None and self.outputs.owns(group.queue, group.name):
            return group
        raise Forward(await self.router().output_host(group.queue, group.name))

    async def input_host(self, queue: Queue) -> InputHostClient:
        """The input host here, or Forward to one that serves the queue."""
        inputs = self.inputs
        if inputs is not None and await inputs.serves(queue.name):
            return inputs
        raise Forward(await self.router().input_host(queue.name))

    def router(self) -> Router:
        if self._router is None:
            raise Unavailable("this process does not route requests")
        return self._router


class Frontend(Lookup):
    """The roles and the lookups together, for the modules that take the whole
    frontend (the metrics scrape, consumer routing, the stream-mode and routing
    calls)."""

    def __init__(self, roles: Roles) -> None:
        super().__init__(
            roles.keys, roles.metadata, roles.inputs, roles.outputs, roles.router, roles.ctx
        )
        self.r = roles


def _internal_direct(request: web.Request, ctx: ProcessContext) -> bool:
    """Whether the request is a direct call (``?direct=1``, answered here, never
    forwarded) that carries the cluster's internal token instead of an API key: the SQS
    endpoint of another frontend reaching this output host for a client it has
    authenticated by its SigV4 signature, which carries no API key to pass on."""
    header = request.headers.get(h.INTERNAL_HEADER)
    if header is None or request.query.get("direct") != "1":
        return False
    try:
        return ctx.internal_ok(header)
    except h.NoSecret:
        return False
