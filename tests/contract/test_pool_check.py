"""The PostgreSQL store's pool checks a connection before lending it only when it has
been idle CHECK_IDLE or more (postgres_failover.py): checked at every call, the check
was 17-22% of the CPU of a busy leader and output host after a power loss at 1,000
queues, and a round trip more per call. A connection that broke is still never lent
twice: one used lately answers Unavailable once, one idle is replaced unseen."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from cherami.errors import Unavailable
from cherami.metadata import postgres_failover
from cherami.metadata.models import Queue, QueueConfig
from cherami.metadata.postgres import PostgresMetadataStore
from tests.contract.conftest import POSTGRES_URL

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresMetadataStore]:
    store = await PostgresMetadataStore.connect(POSTGRES_URL, pg_schema, max_connections=1)
    await store.insert_queue(Queue(name="q", config=QueueConfig(), created_at=time.time()))
    yield store
    await store.close()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the checks made (the real check runs)."""
    counted: list[int] = []
    check = AsyncConnectionPool.check_connection

    async def counting(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        counted.append(1)
        await check(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counting))
    return counted


async def _kill_connections(store: PostgresMetadataStore) -> None:
    """The server ends the store's connection (as a restart of it would)."""
    async with store._pool.connection() as conn:
        pid = conn.info.backend_pid
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_connection_used_lately_is_lent_unchecked(
    store: PostgresMetadataStore, checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):
        await store.get_queue("q")
    assert len(checks) <= 1  # the first, if the pool's connection had not been used yet
    checks.clear()
    monkeypatch.setattr(postgres_failover, "CHECK_IDLE", 0.0)  # as if idle that long
    await store.get_queue("q")
    assert checks == [1]


async def test_a_broken_connection_used_lately_answers_unavailable_once(
    store: PostgresMetadataStore,
) -> None:
    await _kill_connections(store)
    with pytest.raises(Unavailable):
        await store.get_queue("q")
    assert (await store.get_queue("q")).name == "q"  # a new connection


async def test_a_broken_idle_connection_is_replaced_unseen(
    store: PostgresMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _kill_connections(store)
    monkeypatch.setattr(postgres_failover, "CHECK_IDLE", 0.0)
    assert (await store.get_queue("q")).name == "q"
