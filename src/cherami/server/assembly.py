"""One assembly of the roles, for a node and for a cluster process alike.

``assemble`` builds the roles a process runs (a node: controller, input host, output
host and frontend; a cluster process: one of them) and wires each to the others through
their clients: a role in this process is reached in-process (LocalInputHost,
LocalOutputHost), a role elsewhere over the network (RemoteInputHost, the frontend's
forwarding). The paths that matter take one course whatever the process:

- a failed replica: the input host marks the extent FAILING (controller/client.py); the
  leading controller (leader.py, a node runs one too) seals it and opens what the queue
  needs;
- extent changes: input and output hosts read the queues' extents again every
  ``timing.extent_refresh_interval`` (of the process's context, context.py);
- a move to a dead-letter queue: published through an InputHostClient;
- retention: the leading controller's ticks.

Store hosts, the metadata store, membership and the listener are the caller's."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from aiohttp import web

from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.membership import CONTROLLER, FRONTEND, INPUTHOST, OUTPUTHOST
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent
from cherami.roles.controller.client import report_failing
from cherami.roles.controller.leader import Leader
from cherami.roles.controller.scaling import ScalingPolicy
from cherami.roles.controller.service import ControllerService
from cherami.roles.frontend.app import Roles, build_app
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.frontend.metrics import Metrics
from cherami.roles.frontend.proxy import Router
from cherami.roles.frontend.sqs import build_sqs_app
from cherami.roles.inputhost.client import (
    INTERNAL_PUBLISH,
    InputHostClient,
    LocalInputHost,
    RemoteInputHost,
    internal_publish,
)
from cherami.roles.inputhost.service import InputHostService
from cherami.roles.outputhost.client import LocalOutputHost
from cherami.roles.outputhost.outage import add_outage_route
from cherami.roles.outputhost.ownership import ExtentOwnership
from cherami.roles.outputhost.receipts import host_tag
from cherami.roles.outputhost.service import OutputHostService
from cherami.roles.storehost.directory import StoreDirectory, StoreWatcher

log = logging.getLogger("cherami.assembly")

EVERY_ROLE = frozenset({FRONTEND, CONTROLLER, INPUTHOST, OUTPUTHOST})


@dataclass
class Surroundings:
    """What the process gives its roles."""

    config: NodeConfig
    ctx: ProcessContext  # timing, clock, cluster key, TLS: built once by the process
    ids: dict[str, str]  # role -> host id
    metadata: MetadataStore  # writes, and the background work's reads
    reads: MetadataStore  # the request paths' reads
    stores: StoreDirectory
    watcher: StoreWatcher  # the live store hosts
    keys: KeyRing
    ready: Callable[[], bool]
    pick_input_host: Callable[[list[Extent]], Awaitable[str]]
    router: Router | None = None  # the other processes of a cluster; None: a node
    default_min_extents: int = 1
    scaling: ScalingPolicy | None = None  # None: extents by min_extents only


@dataclass
class Assembly:
    controller: ControllerService
    app: web.Application
    inputs: InputHostService | None = None
    outputs: LocalOutputHost | None = None
    ownership: ExtentOwnership | None = None
    leader: Leader | None = None
    recovers: bool = False  # a node: its input host's extents are looked at first
    sqs: web.Application | None = None  # the SQS endpoint, with --sqs-port
    _stoppers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def start(self) -> None:
        """Start the roles' background work: once the process heartbeats (the leader
        seals the extents of input hosts it does not see alive). A node recovers what
        its last run left open first: here, not while assembling, so its store hosts
        heartbeat however long that takes (it was once long enough for them to count
        as dead and the node could not start)."""
        if self.recovers:
            await self.controller.recover()
        if self.outputs is not None:
            await self.outputs.service.start()
            self._stoppers.insert(0, self.outputs.service.stop)
        if self.ownership is not None:
            self.ownership.start()
            self._stoppers.insert(0, self.ownership.stop)
        if self.leader is not None:
            self.leader.start()
            self._stoppers.insert(0, self.leader.stop)

    async def stop(self) -> None:
        """Stop the roles' background work (the leader first, the input host last)."""
        for stop in self._stoppers:
            try:
                await stop()
            except Exception:
                log.exception("stopping a role failed")


async def assemble(s: Surroundings, roles: frozenset[str]) -> Assembly:
    """Build ``roles`` (every API process has a frontend and a controller service;
    only a CONTROLLER opens and seals extents); ``Assembly.start`` starts them."""
    alone = s.router is None  # a node: every role here, and the only one of each
    controller = ControllerService(
        s.metadata, s.stores, s.pick_input_host, manage_extents=CONTROLLER in roles,
        live_stores=lambda: s.watcher.live, default_min_extents=s.default_min_extents,
        restarts_stores=alone,
    )  # fmt: skip
    inputs = None
    if INPUTHOST in roles:
        failed = partial(report_failing, s.metadata)
        inputs = InputHostService(
            s.ids[INPUTHOST], s.reads, s.stores, failed, serves_every_queue=alone, ctx=s.ctx
        )
        controller.deleted.append(inputs.forget)  # a node's; a cluster's forgets itself
    leader = None
    if CONTROLLER in roles:
        leader = Leader(
            controller, s.metadata, s.ids[CONTROLLER], s.watcher, s.config.extent_max_messages,
            s.scaling, ctx=s.ctx,
        )  # fmt: skip
    outputs, ownership = None, None
    if OUTPUTHOST in roles:
        service, ownership = _output_host(s, _input_client(s, inputs), alone)
        outputs = LocalOutputHost(service)
    clients = Roles(
        metadata=s.reads, stores=s.stores, controller=controller,
        inputs=LocalInputHost(inputs) if inputs else None, outputs=outputs,
        keys=s.keys, metrics=Metrics(), ready=s.ready, router=s.router,
        ctx=s.ctx,
    )  # fmt: skip
    app = build_app(clients)
    if inputs is not None and not alone:  # other processes publish to DLQs through it
        app.router.add_post(INTERNAL_PUBLISH, internal_publish(inputs, s.reads, s.ctx))
    if ownership is not None:  # peers ask it during a metadata outage
        add_outage_route(app, ownership.answer_peer, s.ctx)
    stoppers: list[Callable[[], Awaitable[None]]] = [] if inputs is None else [inputs.stop]
    # a node's input host died with its last run: Assembly.start recovers its extents
    sqs = None
    if s.config.sqs_port is not None:
        holder = "sqs:" + min(s.ids.values(), default="node")  # the same after a restart
        sqs = build_sqs_app(clients, s.config.data_dir, holder)
    return Assembly(controller, app, inputs, outputs, ownership, leader, alone, sqs, stoppers)


def _input_client(s: Surroundings, inputs: InputHostService | None) -> InputHostClient:
    """The input host in this process, else the cluster's over the network."""
    if inputs is not None:
        return LocalInputHost(inputs)
    assert s.router is not None, "a process without an input host is part of a cluster"
    router = s.router
    return RemoteInputHost(router.input_host, lambda: router.session, s.ctx)


def _output_host(
    s: Surroundings, inputs: InputHostClient, alone: bool
) -> tuple[OutputHostService, ExtentOwnership | None]:
    """A node's output host serves every group whole; a cluster's output hosts share
    the groups' extents by lease (ownership.py)."""
    if alone:
        return OutputHostService(s.metadata, s.stores, inputs, ctx=s.ctx), None
    host = s.ids[OUTPUTHOST]
    made: list[ExtentOwnership] = []

    def ownership(service: OutputHostService) -> ExtentOwnership:
        made.append(ExtentOwnership(service, s.metadata, host, ctx=s.ctx))
        return made[0]

    service = OutputHostService(s.metadata, s.stores, inputs, ownership, host_tag(host), ctx=s.ctx)
    return service, made[0]
