"""The PostgreSQL store on a primary with a standby (postgres_failover.py): it writes only
to the primary, whatever order the URL lists the hosts in; a server that turns read-only
answers Unavailable until it takes writes again; a URL that allows a standby is refused;
and an epoch the old primary granted in a tail that asynchronous replication lost at the
failover is never granted again by the promoted standby."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cherami.errors import ConfigError, Fenced, Unavailable
from cherami.metadata.models import AckLevel, Fence, Queue, QueueConfig
from cherami.metadata.postgres import PostgresMetadataStore
from cherami.metadata.postgres_failover import failover_conninfo
from tests.support.pg import PrivatePostgres, private_postgres
from tests.support.pgpair import PrimaryStandby, wait_for

__all__ = ["private_postgres"]  # the fixture, imported for pytest

pytestmark = pytest.mark.postgres

LEASE = "group:q/g/e1"
TIMELINE = 1 << 32  # the epochs of one timeline


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[PrimaryStandby]:
    pg = PrimaryStandby(synchronous=getattr(request, "param", True))
    try:
        yield pg.start()
    finally:
        pg.remove()


def _queue(name: str) -> Queue:
    return Queue(name=name, config=QueueConfig(replicas=1), created_at=time.time())


def _level(acked: int) -> AckLevel:
    return AckLevel(queue="q", group="g", extent="e1", level=bytes([acked]), acked=acked)


async def test_a_standby_listed_first_is_passed_over_for_the_primary(
    pair: PrimaryStandby,
) -> None:
    store = await PostgresMetadataStore.connect(pair.url(standby_first=True), "failover")
    try:
        await store.insert_queue(_queue("orders"))  # no target_session_attrs: added
        assert (await store.get_queue("orders")).name == "orders"
    finally:
        await store.close()
    with psycopg.connect(pair.standby.url(), autocommit=True) as conn:
        assert conn.execute("SELECT name FROM failover.queues").fetchall() == [("orders",)]


@pytest.mark.parametrize("attrs", ["any", "standby", "prefer-standby", "read-only"])
async def test_a_url_that_allows_a_standby_is_refused(attrs: str) -> None:
    url = f"postgresql://postgres@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs={attrs}"
    with pytest.raises(ConfigError, match="standby"):
        await PostgresMetadataStore.connect(url)


def test_a_url_gets_tcp_timeouts_unless_it_sets_them() -> None:
    url = "postgresql://postgres@h1:5432,h2:5432/db?keepalives_idle=30"
    conninfo = conninfo_to_dict(failover_conninfo(url))
    assert conninfo["target_session_attrs"] == "read-write"
    assert conninfo["keepalives_idle"] == "30"  # the URL's
    assert conninfo["tcp_user_timeout"] == "10000"
    assert (conninfo["host"], conninfo["port"]) == ("h1,h2", "5432,5432")


async def test_a_server_turned_read_only_is_unavailable_until_it_takes_writes(
    private_postgres: PrivatePostgres,
) -> None:
    store = await PostgresMetadataStore.connect(private_postgres.url(), "failover")
    admin = await psycopg.AsyncConnection.connect(private_postgres.url(), autocommit=True)
    try:
        await admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        await admin.execute("SELECT pg_reload_conf()")
        with pytest.raises(Unavailable):
            async with asyncio.timeout(30):
                while True:  # until the pooled connection has read the new setting
                    await store.insert_queue(_queue(f"q{time.monotonic_ns()}"))
        with pytest.raises(Unavailable):  # and new connections are refused
            await store.insert_queue(_queue("refused"))
        await admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await admin.execute("SELECT pg_reload_conf()")
        async with asyncio.timeout(30):
            while True:
                try:
                    await store.insert_queue(_queue("written"))
                    break
                except Unavailable:
                    await asyncio.sleep(0.1)
        assert (await store.get_queue("written")).name == "written"
    finally:
        await admin.close()
        await store.close()


@pytest.mark.parametrize("pair", [False], indirect=True, ids=["asynchronous"])
async def test_an_epoch_lost_at_a_failover_is_never_granted_again(pair: PrimaryStandby) -> None:
    old = await PostgresMetadataStore.connect(pair.url(), "failover")
    try:
        first = await old.try_lease(LEASE, "o1", ttl_seconds=0)
        assert first == 1
        wait_for("the standby has the first grant", pair.caught_up)
        pair.standby.stop()  # what the primary writes now never reaches it
        lost = await old.try_lease(LEASE, "o2", ttl_seconds=0)  # o1's ran out
        assert lost == 2
        await old.put_ack_levels([_level(5)], fence=Fence(lease=LEASE, epoch=lost))
    finally:
        await old.close()
    pair.kill_primary()
    pair.standby.start()
    pair.promote()

    new = await PostgresMetadataStore.connect(pair.url(), "failover")
    try:
        assert await new.lease_holder(LEASE) is None  # o1's, run out: o2's grant is lost
        assert await new.get_ack_levels("q", "g") == []  # lost too
        taken = await new.try_lease(LEASE, "o3", ttl_seconds=0)
        assert taken is not None and taken >= TIMELINE > lost  # not 2 again
        with pytest.raises(Fenced):  # o2, acting on what the old primary told it
            await new.put_ack_levels([_level(6)], fence=Fence(lease=LEASE, epoch=lost))
        await new.put_ack_levels([_level(7)], fence=Fence(lease=LEASE, epoch=taken))
        back = await new.try_lease(LEASE, "o2", ttl_seconds=5)
        assert back is not None and back > taken  # o2's epoch went forward, not back to 2
    finally:
        await new.close()


async def test_a_holder_keeps_acting_across_a_synchronous_failover_at_a_higher_epoch(
    pair: PrimaryStandby,
) -> None:
    old = await PostgresMetadataStore.connect(pair.url(), "failover")
    try:
        epoch = await old.try_lease(LEASE, "o1", ttl_seconds=60)
        await old.put_ack_levels([_level(3)], fence=Fence(lease=LEASE, epoch=epoch or 0))
    finally:
        await old.close()
    pair.kill_primary()  # synchronous: every commit the store saw is on the standby
    pair.promote()
    new = await PostgresMetadataStore.connect(pair.url(), "failover")
    try:
        assert [a.acked for a in await new.get_ack_levels("q", "g")] == [3]
        assert await new.renew_leases([LEASE], "o1", ttl_seconds=60) == {LEASE: epoch}
        assert await new.try_lease(LEASE, "o2", ttl_seconds=60) is None  # still o1's
        again = await new.try_lease(LEASE, "o1", ttl_seconds=60)
        assert again is not None and again >= TIMELINE  # taken again: the new timeline's
    finally:
        await new.close()
