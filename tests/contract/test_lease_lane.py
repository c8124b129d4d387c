"""A lease's renewal never waits behind a busy process's other metadata calls: those hold
at most all but one of the pool's connections, and renewals take the one left. After a
power loss at 1,000 queues the leading controller, with dozens of seals and opens under
way, waited longer than its acting window for a connection to renew on, and the lead
changed hands twice in the middle of the replacement. Against the local PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from cherami.metadata.models import AckLevel, Fence, Queue, QueueConfig
from cherami.metadata.postgres import PostgresMetadataStore, _check_fence
from cherami.metadata.postgres_leases import _PUT_ACK_LEVEL
from tests.contract.conftest import POSTGRES_URL

pytestmark = pytest.mark.postgres

LOCK = 7_100_042


async def test_renewals_go_by_while_every_other_call_waits(pg_schema: str) -> None:
    store = await PostgresMetadataStore.connect(POSTGRES_URL, pg_schema, max_connections=3)
    blocker = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    try:
        session = await store.begin_host_lease("out-1", 30.0)
        assert session is not None
        await blocker.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        # ordinary calls, more than the pool has connections, each held until the lock goes
        held = [
            asyncio.ensure_future(store._fetchall("SELECT pg_advisory_lock_shared(%s)", (LOCK,)))
            for _ in range(6)
        ]
        await asyncio.sleep(0)
        renewed = await asyncio.wait_for(store.renew_host_lease("out-1", session, 30.0), 30)
        lead = await asyncio.wait_for(store.try_lease("controller-leader", "c1", 3.0), 30)
        assert renewed and lead is not None
        assert not any(call.done() for call in held)  # all still waiting on the lock
        await blocker.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        await asyncio.wait_for(asyncio.gather(*held), 30)
    finally:
        await blocker.close()
        await store.close()


async def _fenced_write_open(conn: psycopg.AsyncConnection[Any], epoch: int) -> None:
    """A fenced write's transaction, left open: the lease row locked as a write locks it."""
    await conn.execute("BEGIN")
    cur = conn.cursor()
    await _check_fence(cur, Fence(lease="controller-leader", epoch=epoch))


async def test_a_holder_renews_beside_its_fenced_writes_a_takeover_waits_for_them(
    pg_schema: str,
) -> None:
    """The fenced writes lock the lease row so a takeover waits for them; they locked it
    FOR SHARE, which held back the holder's own renewal too, and a leader with dozens
    of fenced writes under way at once could not renew (the lead changed hands)."""
    store = await PostgresMetadataStore.connect(POSTGRES_URL, pg_schema)
    url = f"{POSTGRES_URL}&options=-csearch_path%3D{pg_schema}"
    writer = await psycopg.AsyncConnection.connect(url)
    try:
        epoch = await store.try_lease("controller-leader", "c1", 0.5)
        assert epoch is not None
        await _fenced_write_open(writer, epoch)
        renewed = await asyncio.wait_for(store.try_lease("controller-leader", "c1", 0.5), 10)
        assert renewed == epoch  # the holder's renewal went by its own fenced write
        await asyncio.sleep(0.6)  # the lease runs out (0.5 s): c2 may take it, once the write ends
        taking = asyncio.ensure_future(store.try_lease("controller-leader", "c2", 30.0))
        done, _ = await asyncio.wait({taking}, timeout=1.0)
        assert not done, "a takeover went by a fenced write still under way"
        await writer.execute("COMMIT")
        assert await asyncio.wait_for(taking, 10) == epoch + 1
    finally:
        await writer.close()
        await store.close()


async def test_a_queue_deleted_beside_a_fenced_flush_of_its_levels_waits_for_it(
    pg_schema: str,
) -> None:
    """An output host's flush holds its units' lease rows (FOR KEY SHARE), then upserts
    their ack levels. ``delete_queue`` deleted the queue's ack levels first and its leases
    last: beside such a flush each waited on the other until PostgreSQL aborted one as a
    deadlock (a whole flush of many groups failed). It takes the leases first now, so it
    waits for the flush and the flush goes through."""
    store = await PostgresMetadataStore.connect(POSTGRES_URL, pg_schema)
    url = f"{POSTGRES_URL}&options=-csearch_path%3D{pg_schema}"
    flush = await psycopg.AsyncConnection.connect(url)
    watch = await psycopg.AsyncConnection.connect(url, autocommit=True)
    unit = "group:q/g/e1"
    try:
        await store.insert_queue(Queue(name="q", config=QueueConfig(), created_at=time.time()))
        session = await store.begin_host_lease("o1", 30)
        assert session is not None
        taken = await store.take_units([unit], "o1", session, 30)
        assert taken is not None
        level = AckLevel(queue="q", group="g", extent="e1", level=b"\x01", acked=1)
        await store.put_fenced_ack_levels([(Fence(lease=unit, epoch=taken[unit]), [level])])
        await flush.execute("BEGIN")
        await flush.execute(
            "SELECT name, epoch FROM leases WHERE name = ANY(%s) ORDER BY name FOR KEY SHARE",
            ([unit],),
        )
        deleting = asyncio.ensure_future(store.delete_queue("q"))
        deadline = time.monotonic() + 10
        blocked = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        while (await (await watch.execute(blocked, (flush.info.backend_pid,))).fetchone()) != (1,):
            assert time.monotonic() < deadline, "the delete never waited for the flush"
            await asyncio.sleep(0.02)  # the delete under way, held back by the flush's locks
        later = (level.queue, level.group, level.extent, b"\x02", 2, None)
        await asyncio.wait_for(flush.execute(_PUT_ACK_LEVEL, later), 10)  # before: a deadlock
        await flush.execute("COMMIT")
        await asyncio.wait_for(deleting, 10)
        assert await store.get_ack_levels("q", "g") == []
    finally:
        await flush.close()
        await watch.close()
        await store.close()
