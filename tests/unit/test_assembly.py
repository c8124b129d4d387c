"""A node and a cluster's processes are built by one function (assembly.py) and take the
same path for a failed replica, extent changes, a move to a dead-letter queue and
retention; only the clients differ (in-process in a node, network in a cluster). On a
real SQLite metadata store; nothing is started, no socket opened."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.membership import CONTROLLER, FRONTEND, INPUTHOST, OUTPUTHOST
from cherami.metadata.models import FAILING, OPEN, Extent, Queue, QueueConfig
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.controller.retention import Retention
from cherami.roles.controller.scaling import ScalingPolicy
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.frontend.proxy import Router
from cherami.roles.inputhost.client import INTERNAL_PUBLISH, LocalInputHost, RemoteInputHost
from cherami.roles.inputhost.service import InputHostService
from cherami.roles.storehost.directory import StoreDirectory, StoreWatcher
from cherami.server.assembly import EVERY_ROLE, Assembly, Surroundings, assemble
from cherami.timing import Timing
from cherami.wire.store import PLAIN

# a context whose timing is not the default: the roles must take theirs from it
CTX = ProcessContext(timing=Timing(extent_refresh_interval=0.7, dead_after=4.0))


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


def _surroundings(
    metadata: SqliteMetadataStore, ids: dict[str, str], router: Router | None
) -> Surroundings:
    stores = StoreDirectory()

    async def pick(extents: list[Extent]) -> str:
        return "inputhost-0"

    return Surroundings(
        config=NodeConfig(), ctx=CTX, ids=ids, metadata=metadata, reads=metadata, stores=stores,
        watcher=StoreWatcher(metadata, stores, CTX.timing.dead_after), keys=KeyRing([]),
        ready=lambda: True,
        pick_input_host=pick, router=router,
        scaling=None if router is None else ScalingPolicy(),
    )  # fmt: skip


async def _node(metadata: SqliteMetadataStore) -> Assembly:
    ids = {CONTROLLER: "controller-0", INPUTHOST: "inputhost-0", OUTPUTHOST: "outputhost-0"}
    return await assemble(_surroundings(metadata, ids, None), EVERY_ROLE)


async def _cluster(metadata: SqliteMetadataStore) -> dict[str, Assembly]:
    return {
        role: await assemble(
            _surroundings(metadata, {role: f"{role}-1"}, Router(metadata, CTX)), frozenset({role})
        )
        for role in (FRONTEND, CONTROLLER, INPUTHOST, OUTPUTHOST)
    }


async def _open_extent(
    metadata: SqliteMetadataStore, extent_id: str, input_host: str = "inputhost-0"
) -> None:
    queue = Queue(name=f"q-{extent_id}", config=QueueConfig(), created_at=time.time())
    await metadata.insert_queue(queue)
    await metadata.insert_extent(
        Extent(id=extent_id, queue=queue.name, kind=PLAIN, status=OPEN,
               input_host=input_host, stores=["store-0"], created_at=time.time())
    )  # fmt: skip


async def test_a_failed_replica_is_marked_failing_for_the_leader(
    metadata: SqliteMetadataStore,
) -> None:
    node, cluster = await _node(metadata), await _cluster(metadata)
    for name, inputs in [("node", node.inputs), ("cluster", cluster[INPUTHOST].inputs)]:
        assert isinstance(inputs, InputHostService), name
        await _open_extent(metadata, f"e-{name}")
        await inputs._extent_failed(f"e-{name}")
        extent = await metadata.get_extent(f"e-{name}")
        assert extent is not None and extent.status == FAILING, name
    # a leading controller acts on it in both, and runs retention in its ticks
    for leader in (node.leader, cluster[CONTROLLER].leader):
        assert leader is not None and isinstance(leader.retention, Retention)
    assert node.leader is not None and node.leader.scaling is None  # one input host
    assert all(cluster[r].leader is None for r in (FRONTEND, INPUTHOST, OUTPUTHOST))
    assert node.controller.manage_extents and cluster[CONTROLLER].controller.manage_extents
    assert not cluster[FRONTEND].controller.manage_extents


async def test_extent_changes_are_read_again_at_the_refresh_interval(
    metadata: SqliteMetadataStore,
) -> None:
    node, cluster = await _node(metadata), await _cluster(metadata)
    interval = CTX.timing.extent_refresh_interval  # not the default: the context's
    for name, assembly in [("node", node), ("cluster", cluster[OUTPUTHOST])]:
        assert assembly.outputs is not None
        assert assembly.outputs.service._refresher.seconds == interval, name
    for name, assembly in [("node", node), ("cluster", cluster[INPUTHOST])]:
        inputs = assembly.inputs
        assert inputs is not None
        await _open_extent(metadata, f"e-{name}", input_host="another")
        writers = await inputs._writers(f"q-e-{name}")
        assert inputs._fresh(writers), name
        writers.loaded_at -= interval
        assert not inputs._fresh(writers), name


async def test_dead_letters_go_through_an_input_host_client(
    metadata: SqliteMetadataStore,
) -> None:
    node, cluster = await _node(metadata), await _cluster(metadata)
    assert node.outputs is not None and cluster[OUTPUTHOST].outputs is not None
    assert isinstance(node.outputs.service._dead_letter._inputs, LocalInputHost)
    assert isinstance(cluster[OUTPUTHOST].outputs.service._dead_letter._inputs, RemoteInputHost)
    # the network client's route is served by the cluster's input host only
    routes = {r.resource.canonical for r in cluster[INPUTHOST].app.router.routes() if r.resource}
    assert INTERNAL_PUBLISH in routes
    node_routes = {r.resource.canonical for r in node.app.router.routes() if r.resource}
    assert INTERNAL_PUBLISH not in node_routes
