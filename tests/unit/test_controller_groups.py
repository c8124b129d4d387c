"""Making a group when the metadata store cannot tell whether it exists."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cherami.errors import GroupNotFound, Unavailable
from cherami.metadata.models import GroupConfig, Queue, QueueConfig
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.controller.service import ControllerService


class _LookupsFail:
    """A real SQLite store whose group lookups fail as in an outage."""

    def __init__(self, store: SqliteMetadataStore) -> None:
        self._store = store

    async def get_group(self, queue: str, name: str) -> Any:
        raise Unavailable("metadata store: connection refused")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _Stores:
    def ids(self) -> list[str]:
        return ["store-1"]


async def _no_input_host(extents: Any) -> str:
    raise AssertionError("no extent is opened here")


async def test_a_metadata_outage_is_not_read_as_no_such_group(tmp_path: Path) -> None:
    """create_group read any error of its lookup as "no such group" and went on to make
    the dead-letter queue (and the group) while the store could not say."""
    store = SqliteMetadataStore(str(tmp_path / "meta.db"))
    try:
        queue = Queue(name="q", config=QueueConfig(), created_at=time.time())
        await store.insert_queue(queue)
        controller = ControllerService(
            _LookupsFail(store),  # type: ignore[arg-type]
            _Stores(),  # type: ignore[arg-type]
            _no_input_host,
            manage_extents=False,
        )
        with pytest.raises(Unavailable):
            await controller.create_group(queue, "g", GroupConfig())
        assert [q.name for q in await store.list_queues()] == ["q"]  # no dead-letter queue
        with pytest.raises(GroupNotFound):
            await store.get_group("q", "g")
        plain = ControllerService(store, _Stores(), _no_input_host, manage_extents=False)  # type: ignore[arg-type]
        group, made = await plain.create_group(queue, "g", GroupConfig())
        assert made and (await store.get_queue(group.dlq)).name == group.dlq
    finally:
        await store.close()


async def test_no_spare_store_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster's queues with as many replicas as store hosts: the warning came at every
    queue made (its groups' dead-letter queues too), 30,000 lines for 10,000 queues."""
    store = SqliteMetadataStore(str(tmp_path / "meta.db"))
    try:
        controller = ControllerService(store, _Stores(), _no_input_host, manage_extents=False)  # type: ignore[arg-type]
        with caplog.at_level("WARNING", logger="cherami.controller"):
            for name in ("a", "b", "c"):
                await controller.create_queue(name, QueueConfig(replicas=1, min_replicas=1))
        said = [r.getMessage() for r in caplog.records if "store hosts:" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("queue a has 1 replicas on 1 store hosts")
    finally:
        await store.close()
