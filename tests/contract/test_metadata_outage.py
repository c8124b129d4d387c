"""An unreachable metadata database is ``Unavailable`` (503 ``unavailable``), never an
internal error, soon once the pool knows it cannot connect, and the store works again
once the database is back."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from cherami.errors import Unavailable
from cherami.metadata.models import AckLevel, Extent, Queue, QueueConfig
from cherami.metadata.postgres import POOL_TIMEOUT, PostgresMetadataStore
from cherami.metadata.postgres_failover import UNREACHABLE_WAIT
from cherami.metadata.sqlite import SqliteMetadataStore
from tests.support.pg import PrivatePostgres, private_postgres

__all__ = ["private_postgres"]  # the fixture, imported for pytest

HANG_GUARD = 60.0  # far above the pool timeout: only here so a hang fails the test


def _queue(name: str) -> Queue:
    return Queue(name=name, config=QueueConfig(replicas=1), created_at=time.time())


async def _until_it_answers(store: PostgresMetadataStore, name: str) -> Queue:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        try:
            return await store.get_queue(name)
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_postgres_outage_is_unavailable_then_recovers(
    private_postgres: PrivatePostgres,
) -> None:
    store = await PostgresMetadataStore.connect(private_postgres.url(), "cherami")
    try:
        await store.insert_queue(_queue("orders"))
        private_postgres.stop()
        level = AckLevel(queue="orders", group="g", extent="e", level=b"k", acked=1)
        extent = Extent(
            id="e1", queue="orders", kind="queue", status="open", input_host="h",
            stores=["s1"], created_at=time.time(),
        )  # fmt: skip
        calls = [
            store.get_queue("orders"),
            store.list_queues(),
            store.update_queue(_queue("orders")),
            store.delete_group("orders", "g"),  # a transaction
            store.put_ack_levels([level]),
            store.insert_extent(extent),
        ]
        for call in calls:
            with pytest.raises(Unavailable):
                async with asyncio.timeout(HANG_GUARD):
                    await call

        private_postgres.start()
        assert (await _until_it_answers(store, "orders")).name == "orders"
        await store.put_ack_levels([level])
        assert [a.acked for a in await store.get_ack_levels("orders", "g")] == [1]
    finally:
        await store.close()


async def test_postgres_crash_and_restart_on_the_same_port(
    private_postgres: PrivatePostgres,
) -> None:
    store = await PostgresMetadataStore.connect(private_postgres.url(), "cherami")
    try:
        await store.insert_queue(_queue("orders"))
        private_postgres.stop(mode="immediate")
        with pytest.raises(Unavailable):
            async with asyncio.timeout(HANG_GUARD):
                await store.list_queues()
        private_postgres.start()
        assert (await _until_it_answers(store, "orders")).name == "orders"
    finally:
        await store.close()


async def test_a_stopped_postgres_is_not_waited_for(private_postgres: PrivatePostgres) -> None:
    """Once the pool has failed to connect, calls fail within UNREACHABLE_WAIT, not the
    pool's 5 s timeout (which held every publish and delivery of a cluster behind its
    metadata reads at the start of an outage); they get through again once it is back."""
    store = await PostgresMetadataStore.connect(private_postgres.url(), "cherami")
    try:
        await store.insert_queue(_queue("orders"))
        private_postgres.stop(mode="immediate")
        took = []
        for _ in range(6):  # with the pool's connection broken, and then with none
            started = time.monotonic()
            with pytest.raises(Unavailable):
                async with asyncio.timeout(HANG_GUARD):
                    await store.get_queue("orders")
            took.append(time.monotonic() - started)
        # a bound of twice the wait: a call may find a connect attempt under way
        assert max(took) < 2 * UNREACHABLE_WAIT < POOL_TIMEOUT, took
        private_postgres.start()
        assert (await _until_it_answers(store, "orders")).name == "orders"
    finally:
        await store.close()


async def test_a_full_postgres_is_waited_for_not_taken_for_unreachable(
    private_postgres: PrivatePostgres,
) -> None:
    """A server out of connection slots refuses a new connection at once, but it is
    there: a call waits for one of the pool's connections to be free, as before."""
    store = await PostgresMetadataStore.connect(private_postgres.url(), "cherami")
    await store.insert_queue(_queue("orders"))
    others: list[psycopg.Connection[tuple[object, ...]]] = []
    held = asyncio.Event()

    async def hold() -> None:  # the pool's one connection, busy for a second
        async with store._pool.connection() as conn:
            held.set()
            await conn.execute("SELECT pg_sleep(1)")

    try:
        with pytest.raises(psycopg.OperationalError, match="too many clients"):
            while True:  # every slot the server has left
                others.append(await asyncio.to_thread(psycopg.connect, private_postgres.url()))
        holding = asyncio.create_task(hold())
        await held.wait()
        async with asyncio.timeout(HANG_GUARD):
            assert (await store.get_queue("orders")).name == "orders"
        await holding
    finally:
        for conn in others:
            conn.close()
        await store.close()


async def test_sqlite_locked_database_is_unavailable_then_recovers(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.db")
    store = SqliteMetadataStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await store.insert_queue(_queue("orders"))
        other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        with pytest.raises(Unavailable, match="locked"):
            async with asyncio.timeout(HANG_GUARD):
                await store.update_queue(_queue("orders"))
        other.execute("ROLLBACK")
        await store.update_queue(_queue("orders"))
        assert (await store.get_queue("orders")).name == "orders"
    finally:
        other.close()
        await store.close()


async def test_sqlite_statement_errors_are_not_unavailable(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store._run(lambda: store._db.execute("SELECT * FROM nope"))
    finally:
        await store.close()
