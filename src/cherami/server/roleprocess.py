"""One role per process, for a cluster: ``cherami serve --role R --metadata URL``.

Every process heartbeats into the shared metadata store. Processes other than store
hosts also serve the whole HTTP API: what they do not serve themselves (a queue's input
host, a group's output host) they forward to the host that does. The roles are built
as a node's are (assembly.py), with network clients for the roles elsewhere."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, cast

from aiohttp import web

from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.datadir import lock_data_dir
from cherami.errors import Unavailable
from cherami.httpbase import listen
from cherami.loadmeter import LoadMeter, LoadSources
from cherami.membership import (
    INPUTHOST,
    STOREHOST,
    Membership,
    RecentHosts,
    host_id,
)
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent
from cherami.metadata.open import open_metadata
from cherami.metadata.remembered import RememberingReads
from cherami.roles.controller.placement import pick_input_host
from cherami.roles.controller.scaling import ScalingPolicy
from cherami.roles.frontend.app import STREAMS
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.frontend.proxy import Router
from cherami.roles.storehost.directory import StoreDirectory, StoreWatcher
from cherami.roles.storehost.metrics import storehost_metrics_app
from cherami.roles.storehost.server import StoreHostService
from cherami.server.assembly import Surroundings, assemble
from cherami.server.secret import role_secret
from cherami.storage.rocks import RocksExtentStore

log = logging.getLogger("cherami.cluster.roles")


# the wait between tries to reach the metadata at start, doubled from the first to the last
OPEN_RETRY = (0.5, 10.0)


class RoleProcess:
    """The services of one role, started and stopped together."""

    def __init__(self, config: NodeConfig) -> None:
        assert config.role is not None and config.metadata is not None
        self.config = config
        self.role = config.role
        self.keys = KeyRing.load(config.auth_file)
        config.check(self.keys.enabled)
        # every internal link proves the cluster's secret; TLS with --tls-cert
        self.ctx = ProcessContext.of(
            config.timing, role_secret(config.cluster_secret_file),
            config.tls_cert, config.tls_key, config.tls_ca,
        )  # fmt: skip
        self.id = host_id(config.data_dir, self.role)
        self.address = ""
        self.metrics_address = ""  # a store host's /metrics listener, with --metrics-port
        self.sqs_address = ""  # the SQS endpoint, with --sqs-port
        self.ready = False
        self._inputs: RecentHosts | None = None  # the live input hosts, for placement
        self._opened: MetadataStore | None = None  # what stop() closes: None before it answered
        self._stoppers: list[Any] = []
        self._load_sources = LoadSources(data_dir=config.data_dir)

    async def start(self) -> str:
        cfg = self.config
        assert cfg.metadata is not None
        self._lock = lock_data_dir(cfg.data_dir)  # one process per data dir
        self.metadata = self._opened = metadata = await self._open_metadata(cfg.metadata)
        if self.role == STOREHOST:
            await self._start_storehost()
        else:
            await self._start_api_role()
        self.membership = Membership(
            metadata, self.id, self.role, self.address, self.config.zone,
            LoadMeter(self._load_sources, self.config.load_report_interval),
            interval=self.ctx.timing.heartbeat_interval,
        )  # fmt: skip
        await self.membership.start()
        self._stoppers.insert(0, self.membership.stop)
        self.ready = True
        return self.address

    async def _open_metadata(self, url: str) -> MetadataStore:
        """The metadata store, tried again with back-off while it cannot be reached (a
        PostgreSQL server down, restarting or out of connection slots when this process
        starts): one warning line at the first failure, one line when it answers."""
        wait, longest = OPEN_RETRY
        since: float | None = None
        while True:
            try:
                store = await open_metadata(url)
            except Unavailable as err:
                if since is None:
                    since = time.monotonic()
                    log.warning("%s %s cannot start yet: %s; trying again every %.0f s at "
                                "most until it answers", self.role, self.id, err.message,
                                longest)  # fmt: skip
                else:
                    log.debug("metadata still unreachable: %s", err.message)
                await asyncio.sleep(wait)
                wait = min(wait * 2, longest)
                continue
            if since is not None:
                log.warning("%s %s reached the metadata after %.1f s", self.role, self.id,
                            time.monotonic() - since)  # fmt: skip
            return store

    def _advertise(self, bound: str) -> str:
        return self.config.advertise or bound

    async def _start_storehost(self) -> None:
        store = RocksExtentStore(os.path.join(self.config.data_dir, "rocksdb"))
        service = StoreHostService(
            store, self.config.host, self.config.port, key=self.ctx.key, tls=self.ctx.tls_server,
            data_dir=self.config.data_dir,
        )  # fmt: skip
        await service.start()
        self._load_sources.changes = service.extent_changes
        self._load_sources.open_extents = service.open_extents
        self._load_sources.connections = service.connections
        self._load_sources.append_p99_ms = service.appends.p99_ms
        self.address = self._advertise(service.address)
        self._stoppers.append(service.stop)
        if self.config.metrics_port is not None:
            app = storehost_metrics_app(service, self.id, self.keys)
            await self._serve_metrics(app, self.config.metrics_port)

    async def _serve_metrics(self, app: web.Application, metrics_port: int) -> None:
        """A store host's /metrics listener (roles/storehost/metrics.py)."""
        runner, port = await listen(
            app, self.config.http, self.config.host, metrics_port, self.ctx.tls_server
        )
        self.metrics_address = f"{self.config.host}:{port}"
        self._stoppers.insert(0, runner.cleanup)

    async def _start_api_role(self) -> None:
        stores = StoreDirectory(self.ctx.key, tls=self.ctx.tls_client)
        watcher = StoreWatcher(self.metadata, stores, self.ctx.timing.dead_after)
        await watcher.start()
        # the request paths answer from their last reads while the store is out (a
        # publish to an open extent needs nothing new from it); the rest asks the store
        reads = cast(MetadataStore, RememberingReads(self.metadata))
        self.router = Router(reads, self.ctx)
        self.roles = roles = await assemble(
            Surroundings(
                config=self.config, ctx=self.ctx, ids={self.role: self.id}, metadata=self.metadata,
                reads=reads, stores=stores, watcher=watcher, keys=self.keys,
                ready=lambda: self.ready, pick_input_host=self._pick_input_host,
                router=self.router, default_min_extents=2,
                scaling=ScalingPolicy(self.config.scale_up_window, self.config.scale_down_window),
            ),
            frozenset({self.role}),
        )  # fmt: skip
        self.controller = roles.controller
        src = self._load_sources
        if roles.inputs is not None:
            src.changes, src.open_extents = roles.inputs.extent_changes, roles.inputs.open_extents
        if roles.outputs is not None:
            src.changes = roles.outputs.delivered_changes
            src.open_extents = roles.outputs.open_extents
        await roles.start()
        self._stoppers.append(roles.stop)
        app = roles.app
        self._load_sources.connections = app[STREAMS].count
        runner, port = await listen(
            app, self.config.http, self.config.host, self.config.port, self.ctx.tls_server
        )
        self.address = self._advertise(f"{self.config.host}:{port}")
        self.router.address = self.address
        self._stoppers += [runner.cleanup, self.router.close, watcher.stop, stores.close]
        if roles.sqs is not None and self.config.sqs_port is not None:
            sqs, sqs_port = await listen(
                roles.sqs, self.config.http, self.config.host, self.config.sqs_port,
                self.ctx.tls_server,
            )  # fmt: skip
            self.sqs_address = f"{self.config.host}:{sqs_port}"
            self._stoppers.insert(0, sqs.cleanup)

    async def _pick_input_host(self, queue_extents: list[Extent]) -> str:
        """The live input host for a new extent of a queue whose open extents are
        ``queue_extents``: by load reports (placement.py), from the hosts table read at
        most once per heartbeat interval."""
        if self._inputs is None:
            timing = self.ctx.timing
            self._inputs = RecentHosts(self.metadata, INPUTHOST, timing.dead_after,
                                       timing.heartbeat_interval, self.ctx.clock)  # fmt: skip
        hosts = await self._inputs.get()
        if not hosts:
            raise Unavailable("no input host is alive")
        return pick_input_host(hosts, queue_extents, self.controller.placed)

    async def stop(self) -> None:
        self.ready = False
        for stop in self._stoppers:
            try:
                await stop()
            except Exception:
                log.exception("stopping %s failed", self.role)
        if self._opened is not None:
            await self._opened.close()
