"""A lease's renewal never waits behind a busy process's other metadata calls: those hold
at most all but one of the pool's connections, and renewals take the one left. After a
power loss at 1,000 queues the leading controller, with dozens of seals and opens under
way, waited longer than its acting window for a connection to renew on, and the lead
changed hands twice in the middle of the replacement. Against the local PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from cherami.metadata.models import Fence
from cherami.metadata.postgres import PostgresMetadataStore, _check_fence
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
