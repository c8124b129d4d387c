"""A node on the embedded default: every role from one command. Store hosts run as
child processes (each its own RocksDB directory); the frontend, controller, input host
and output host share this process's event loop, assembled as a cluster's processes
are (assembly.py) with in-process clients; metadata lives in SQLite."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from functools import partial

from aiohttp import web

from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.datadir import lock_data_dir
from cherami.httpbase import listen
from cherami.loadmeter import LoadMeter, LoadSources
from cherami.membership import CONTROLLER, INPUTHOST, OUTPUTHOST
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent, Host
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.periodic import Periodic
from cherami.roles.controller.service import ControllerService
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.storehost.directory import StoreDirectory, StoreWatcher
from cherami.roles.storehost.inprocess import InProcessStoreHost
from cherami.roles.storehost.process import StoreProcess
from cherami.server.assembly import EVERY_ROLE, Assembly, Surroundings, assemble
from cherami.server.secret import node_secret
from cherami.telemetry import timed_metadata

log = logging.getLogger("cherami.node")

INPUT_HOST_ID = "inputhost-0"
FRONTEND_ID, CONTROLLER_ID, OUTPUT_HOST_ID = "frontend-0", "controller-0", "outputhost-0"
# the node's roles in the hosts table: its leading controller seals the extents of a host
# it does not see alive (within dead_after, 3 s), so well within that (or a third of
# dead_after): 7 writes/s with 3 store hosts
NODE_HEARTBEAT = 1.0


def _cpu_seconds(proc: StoreProcess | InProcessStoreHost) -> float:
    """CPU seconds a child process has used (Linux /proc; 0 where unknown)."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


class Node:
    def __init__(self, config: NodeConfig, in_process_stores: bool = False) -> None:
        """``in_process_stores``: its store hosts in this process, over memory
        (roles/storehost/inprocess.py): the test double for the roles' logic, which
        keeps nothing past the process."""
        self.config = config
        self.keys = KeyRing.load(config.auth_file)
        config.check(self.keys.enabled)
        self.ready = False
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._sqs_runner: web.AppRunner | None = None
        self.sqs_port = 0
        self.secret = node_secret(config.data_dir, config.cluster_secret_file)
        # the API listener serves TLS with --tls-cert; the store hosts, the node's own
        # children on loopback, stay plain (wire/tls.py), so no internal client verifies
        self.ctx = ProcessContext.of(config.timing, self.secret, config.tls_cert, config.tls_key)
        self.ctx = dataclasses.replace(self.ctx, tls_client=None)
        self._in_process = [
            InProcessStoreHost(f"store-{i}", self.ctx.key)
            for i in range(config.stores if in_process_stores else 0)
        ]
        self.stores = StoreDirectory(self.ctx.key, hosts=self._in_process)
        self.store_processes: list[StoreProcess | InProcessStoreHost] = []
        # what start() has made so far (stop() undoes that much of a start that failed)
        self.metadata: MetadataStore | None = None
        self.controller: ControllerService | None = None
        self.roles: Assembly | None = None
        self._watcher: StoreWatcher | None = None
        self._heartbeats: Periodic | None = None
        self._hosts: list[tuple[Host, LoadMeter]] = []

    async def start(self) -> None:
        cfg = self.config
        self._lock = lock_data_dir(cfg.data_dir)  # one server per data dir
        self.metadata = metadata = timed_metadata(
            SqliteMetadataStore(os.path.join(cfg.data_dir, "metadata.db"))
        )
        self.store_processes = list(self._in_process) or [
            StoreProcess(
                f"store-{i}",
                os.path.join(cfg.data_dir, f"store-{i}"),
                "127.0.0.1",
                self._store_up,
                self.secret,
            )
            for i in range(cfg.stores)
        ]
        await asyncio.gather(*(p.start() for p in self.store_processes))
        for host in self._in_process:  # a process tells its address once it is up
            await self._store_up(host.store_id, host.address)
        self._watcher = watcher = StoreWatcher(metadata, self.stores, self.ctx.timing.dead_after)
        await watcher.start()
        self.roles = roles = await assemble(
            Surroundings(
                config=cfg, ctx=self.ctx, metadata=metadata, reads=metadata, stores=self.stores,
                watcher=watcher, keys=self.keys, ready=lambda: self.ready,
                pick_input_host=self._input_host,
                ids={INPUTHOST: INPUT_HOST_ID, CONTROLLER: CONTROLLER_ID,
                     OUTPUTHOST: OUTPUT_HOST_ID},
            ),
            EVERY_ROLE,
        )  # fmt: skip
        self.controller = roles.controller
        context = self.ctx.tls_server
        self._runner, self.port = await listen(roles.app, cfg.http, cfg.host, cfg.port, context)
        if roles.sqs is not None and cfg.sqs_port is not None:
            self._sqs_runner, self.sqs_port = await listen(
                roles.sqs, cfg.http, cfg.host, cfg.sqs_port, context
            )
        self._hosts = self._role_hosts(roles)
        every = min(NODE_HEARTBEAT, self.ctx.timing.dead_after / 3)
        self._heartbeats = Periodic("node heartbeat", every, self._beat)
        await self._beat()
        self._heartbeats.start()
        await roles.start()
        self.ready = True

    async def _store_up(self, store_id: str, address: str) -> None:
        await self.stores.set_address(store_id, address)
        if self.metadata is not None:
            await self.metadata.heartbeat(
                Host(id=store_id, role="storehost", address=address, heartbeat_at=time.time())
            )
        if self.controller is not None:  # a restart: seal what was sealed while it was away
            await self.controller.reseal_replicas(store_id)

    async def _input_host(self, queue_extents: list[Extent]) -> str:
        return INPUT_HOST_ID

    def _role_hosts(self, roles: Assembly) -> list[tuple[Host, LoadMeter]]:
        """The node's roles as hosts of the hosts table (GET /v1/cluster), each with a
        meter: the in-process roles report this process's CPU; a store host (a child
        process) its own CPU, its data dir's disk and the node's appends to it."""
        cfg = self.config
        address = f"{cfg.host}:{self.port}"
        data = cfg.data_dir
        assert roles.inputs is not None and roles.outputs is not None
        changes, opened = roles.inputs.extent_changes, roles.inputs.open_extents
        inputs = LoadSources(changes=changes, open_extents=opened, data_dir=data)
        outputs = LoadSources(
            changes=roles.outputs.delivered_changes, open_extents=roles.outputs.open_extents,
            data_dir=data,
        )  # fmt: skip
        interval = cfg.load_report_interval
        hosts = [
            (Host(id=host_id, role=role, address=address, heartbeat_at=0.0, zone=cfg.zone),
             LoadMeter(sources, interval))
            for host_id, role, sources in [
                (FRONTEND_ID, "frontend", LoadSources(data_dir=data)),
                (CONTROLLER_ID, "controller", LoadSources(data_dir=data)),
                (INPUT_HOST_ID, "inputhost", inputs),
                (OUTPUT_HOST_ID, "outputhost", outputs),
            ]
        ]  # fmt: skip
        for proc in self.store_processes:
            disk = proc.disk_usage if isinstance(proc, InProcessStoreHost) else None
            meter = LoadMeter(
                LoadSources(changes=partial(changes, store=proc.store_id),
                            open_extents=partial(opened, proc.store_id),
                            data_dir=proc.data_dir,
                            disk=disk),
                interval, cpu_clock=partial(_cpu_seconds, proc),
            )  # fmt: skip
            host = Host(id=proc.store_id, role="storehost", address=proc.address,
                        heartbeat_at=0.0, zone=cfg.zone)  # fmt: skip
            hosts.append((host, meter))
        return hosts

    async def _beat(self) -> None:
        now = time.time()
        # a store host's address from its process, never from the directory: the store
        # watcher (as in a cluster) sets the directory from what was heartbeated last
        addresses = {p.store_id: p.address for p in self.store_processes}
        for host, meter in self._hosts:
            host.heartbeat_at = now
            if host.role == "storehost":
                host.address = addresses[host.id]
            host.load = meter.report()
            assert self.metadata is not None
            await self.metadata.heartbeat(host)

    async def stop(self) -> None:
        self.ready = False
        if self._heartbeats is not None:
            await self._heartbeats.stop()
        if self.roles is not None:
            await self.roles.stop()
        for runner in (self._sqs_runner, self._runner):
            if runner is not None:
                await runner.cleanup()
        if self._watcher is not None:
            await self._watcher.stop()
        await self.stores.close()
        await asyncio.gather(*(p.stop() for p in self.store_processes))
        if self.metadata is not None:
            await self.metadata.close()
