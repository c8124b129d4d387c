"""PostgreSQL metadata (psycopg 3, async): the store for a cluster of hosts.

Every call borrows a connection from a pool, so many asyncio tasks can use one store at
once. The tables live in their own schema, created and migrated by ``connect``
(postgres_schema.py). A URL may list a primary and its standbys: postgres_failover.py says
how the store follows a failover."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from cherami.errors import AlreadyExists, GroupNotFound, QueueNotFound
from cherami.metadata.base import page_clause
from cherami.metadata.bulk import BulkReads
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    QUEUE_FLAGS,
    AckLevel,
    Extent,
    Fence,
    Group,
    GroupConfig,
    Host,
    LoadReport,
    Queue,
    QueueConfig,
    QueueFlag,
    Redelivery,
)
from cherami.metadata.postgres_failover import FailoverPool, failover_conninfo
from cherami.metadata.postgres_leases import PostgresLeases, _check_fence
from cherami.metadata.postgres_notify import ChangeListener
from cherami.metadata.postgres_schema import check_schema, migrate, with_search_path
from cherami.metadata.properties import find_properties, select_properties, write_properties
from cherami.metadata.purge import dlq_leases, purge_extent, queue_leases

Row = tuple[Any, ...]
Pool = AsyncConnectionPool[psycopg.AsyncConnection[Row]]

# How long a call waits for a connection (and a new connection for the server) before
# it fails with Unavailable: short, so an outage answers 503 rather than hanging.
POOL_TIMEOUT = 5.0


_QUEUE_COLUMNS = "name, config, created_at, dlq_of, timers, keyed"
_EXTENT_COLUMNS = "id, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor"

_json = msgspec.json.Encoder()


def _queue(row: Row) -> Queue:
    name, config, created_at, dlq_of, timers, keyed = row
    return Queue(
        name=name, config=msgspec.convert(config, QueueConfig), created_at=created_at,
        dlq_of=dlq_of, timers=timers, keyed=keyed,
    )  # fmt: skip


def _values(queue: Queue) -> tuple[Any, ...]:
    return (queue.name, _config(queue.config), queue.created_at, queue.dlq_of,
            queue.timers, queue.keyed)  # fmt: skip


_GROUPS = "queue, name, config, created_at, start_ms, dlq"


def _group(row: Row) -> Group:
    queue, name, config, created_at, start_ms, dlq = row
    return Group(
        queue=queue, name=name, config=msgspec.convert(config, GroupConfig),
        created_at=created_at, start_ms=start_ms, dlq=dlq,
    )  # fmt: skip


def _extent(row: Row) -> Extent:
    id_, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor = row
    return Extent(
        id=id_, queue=queue, kind=kind, status=status, input_host=input_host, stores=stores,
        created_at=created_at, sealed_seq=sealed_seq, predecessor=predecessor,
    )  # fmt: skip


def _host(row: Row) -> Host:
    id_, role, address, heartbeat_at, zone, load = row
    return Host(
        id=id_, role=role, address=address, heartbeat_at=heartbeat_at, zone=zone,
        load=None if load is None else msgspec.convert(load, LoadReport),
    )  # fmt: skip


def _config(value: msgspec.Struct) -> Jsonb:
    return Jsonb(value, dumps=_json.encode)


class PostgresMetadataStore(PostgresLeases, BulkReads):
    _queue_of, _extent_of = staticmethod(_queue), staticmethod(_extent)  # bulk.py
    _group_of = staticmethod(_group)

    def __init__(self, pool: Pool, conninfo: str = "", schema: str = "") -> None:
        self._pool = pool
        self._ordinary = asyncio.Semaphore(max(1, pool.max_size - 1))  # _conn
        self._conninfo, self._schema = conninfo, schema  # for watch_changes

    @classmethod
    async def connect(
        cls, url: str, schema: str = "cherami", *, max_connections: int = 10
    ) -> PostgresMetadataStore:
        """Migrate ``schema`` (creating it if missing), then open a pool of connections,
        each to a server that takes writes (the primary of a multi-host ``url``)."""
        check_schema(schema)
        url = failover_conninfo(url)
        await migrate(url, schema)
        pool: Pool = FailoverPool(
            with_search_path(url, schema),
            min_size=1, max_size=max_connections,
            kwargs={"autocommit": True, "connect_timeout": int(POOL_TIMEOUT)},
            timeout=POOL_TIMEOUT,
            reconnect_timeout=POOL_TIMEOUT,  # bounds the reconnect back-off after an outage
            name=f"cherami-metadata-{schema}", open=False,
        )  # fmt: skip
        try:
            await pool.open(wait=True)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, with_search_path(url, schema), schema)

    def watch_changes(self, wake: Callable[[], None]) -> ChangeListener | None:
        listener = ChangeListener(self._conninfo, self._schema, wake)
        listener.start()
        return listener

    async def _execute(self, query: Any, args: Any = ()) -> int:
        async with self._conn() as conn:
            return (await conn.execute(query, args)).rowcount

    async def _fetchone(self, query: Any, args: Any) -> Row | None:
        async with self._conn() as conn:
            return await (await conn.execute(query, args)).fetchone()

    async def _fetchall(self, query: Any, args: Any) -> list[Row]:
        async with self._conn() as conn:
            return await (await conn.execute(query, args)).fetchall()

    def _connection(self) -> Any:
        return self._conn()

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        """A connection for any call but a lease's renewal: those calls hold at most all
        but one of the pool's connections at once, so a renewal (``_fetch_in_lane``) never waits
        behind a busy process's queue of calls (a leader replacing the extents of a power
        loss lost its lead: its renewal waited for a connection behind dozens of calls
        for longer than the acting window)."""
        async with self._ordinary, self._pool.connection() as conn:
            yield conn

    async def _fetch_in_lane(self, query: Any, args: Any) -> list[Row]:
        async with self._pool.connection() as conn:
            return await (await conn.execute(query, args)).fetchall()

    async def _tx(self, statements: list[tuple[Any, Any]]) -> int:
        changed = 0  # by the last statement
        async with self._conn() as conn, conn.transaction():
            for query, args in statements:
                changed = (await conn.execute(query, args)).rowcount
        return changed

    mark = "%s"  # cancelled.py
    _write_all = _tx
    _read_all = _fetchall

    async def close(self) -> None:
        await self._pool.close()

    # queues
    async def insert_queue(self, queue: Queue) -> None:
        try:
            await self._execute(
                f"INSERT INTO queues ({_QUEUE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)",
                _values(queue),
            )
        except psycopg.errors.UniqueViolation:
            raise AlreadyExists(f"queue {queue.name} exists") from None

    async def get_queue(self, name: str) -> Queue:
        row = await self._fetchone(f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE name = %s", (name,))
        if row is None:
            raise QueueNotFound(f"no queue {name}")
        return _queue(row)

    async def list_queues(
        self,
        prefix: str = "",
        after: str | None = None,
        limit: int | None = None,
        *,
        dlqs: bool = True,
    ) -> list[Queue]:
        page, args = page_clause(prefix, after, limit, "%s")
        where = "true" if dlqs else "dlq_of IS NULL"  # the latter: the queues_public index
        rows = await self._fetchall(
            f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE {where}{page}", args
        )
        return [_queue(r) for r in rows]

    async def update_queue(self, queue: Queue) -> None:
        await self._execute(
            "UPDATE queues SET config = %s, timers = (timers OR %s), keyed = (keyed OR %s) "
            "WHERE name = %s",
            (_config(queue.config), queue.timers, queue.keyed, queue.name),
        )

    async def mark_queue(self, name: str, flag: QueueFlag) -> None:
        column = QUEUE_FLAGS[flag]  # (never what a request says)
        sql = f"UPDATE queues SET {column} = true WHERE name = %s AND NOT {column}"
        exists = "SELECT 1 FROM queues WHERE name = %s"
        if not await self._execute(sql, (name,)) and not await self._fetchone(exists, (name,)):
            raise QueueNotFound(f"no queue {name}")

    async def delete_queue(self, name: str) -> None:
        # its leases first: a write under one of their fences (an output host's flush of
        # many units' ack levels) holds the lease rows and then upserts ack levels; taken
        # in the other order the two waited on each other until PostgreSQL broke the cycle
        await self._tx(
            [
                queue_leases(name, "%s"),
                ("DELETE FROM queues WHERE name = %s", (name,)),
                ("DELETE FROM groups WHERE queue = %s", (name,)),
                ("DELETE FROM ack_levels WHERE queue = %s", (name,)),
                ("DELETE FROM redeliveries WHERE queue = %s", (name,)),
                ("DELETE FROM queue_properties WHERE queue = %s", (name,)),
                ("UPDATE extents SET status = %s WHERE queue = %s", (DELETED, name)),
            ]
        )

    # groups
    async def insert_group(self, group: Group) -> None:
        try:
            await self._execute(
                "INSERT INTO groups VALUES (%s, %s, %s, %s, %s, %s)",
                (group.queue, group.name, _config(group.config), group.created_at,
                 group.start_ms, group.dlq),
            )  # fmt: skip
        except psycopg.errors.UniqueViolation:
            raise AlreadyExists(f"group {group.name} exists") from None

    async def get_group(self, queue: str, name: str) -> Group:
        sql = f"SELECT {_GROUPS} FROM groups WHERE queue = %s AND name = %s"
        if (row := await self._fetchone(sql, (queue, name))) is None:
            raise GroupNotFound(f"no group {name} on queue {queue}")
        return _group(row)

    async def list_groups(
        self, queue: str, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[Group]:
        page, args = page_clause(prefix, after, limit, "%s")
        rows = await self._fetchall(f"SELECT {_GROUPS} FROM groups WHERE queue = %s{page}",
                                    [queue, *args])  # fmt: skip
        return [_group(r) for r in rows]

    async def list_every_group(self) -> list[Group]:
        rows = await self._fetchall(f"SELECT {_GROUPS} FROM groups ORDER BY queue, name", [])
        return [_group(r) for r in rows]

    async def update_group(self, group: Group) -> None:
        await self._execute(
            "UPDATE groups SET config = %s WHERE queue = %s AND name = %s",
            (_config(group.config), group.queue, group.name),
        )

    async def delete_group(self, queue: str, name: str) -> None:
        await self._tx(
            [
                dlq_leases(queue, name, "%s"),
                ("DELETE FROM groups WHERE queue = %s AND name = %s", (queue, name)),
                ("DELETE FROM ack_levels WHERE queue = %s AND grp = %s", (queue, name)),
                ("DELETE FROM redeliveries WHERE queue = %s AND grp = %s", (queue, name)),
            ]
        )

    # extents
    async def insert_extent(self, extent: Extent, fence: Fence | None = None) -> bool:
        # A clash on the id or on the predecessor (UNIQUE: one successor each) inserts
        # nothing; a racing insert of the same predecessor waits for the first to commit.
        async with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            await _check_fence(cur, fence)
            await cur.execute(
                f"INSERT INTO extents ({_EXTENT_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (
                    extent.id, extent.queue, extent.kind, extent.status, extent.input_host,
                    extent.stores, extent.created_at, extent.sealed_seq, extent.predecessor,
                ),
            )  # fmt: skip
            return cur.rowcount == 1

    async def get_extent(self, extent_id: str) -> Extent | None:
        row = await self._fetchone(
            f"SELECT {_EXTENT_COLUMNS} FROM extents WHERE id = %s", (extent_id,)
        )
        return _extent(row) if row else None

    async def purge_extent(self, extent_id: str, queue: str) -> bool:
        return await self._tx(purge_extent(extent_id, queue, "%s")) > 0

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]:
        query = f"SELECT {_EXTENT_COLUMNS} FROM extents WHERE queue = %s"
        args: tuple[Any, ...] = (queue,)
        if statuses:
            query += " AND status = ANY(%s)"
            args += (list(statuses),)
        rows = await self._fetchall(query + " ORDER BY created_at, id", args)
        return [_extent(r) for r in rows]

    async def changes_since(self, after: int) -> tuple[int, set[str] | None]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT min(seq), max(seq) FROM changes")
            row = await cur.fetchone()
            first, last = row if row else (None, None)
            latest = last or 0
            if after < 0 or after > latest or (first is not None and after < first - 1):
                return latest, None  # unknown, or older than the log keeps
            cur = await conn.execute("SELECT DISTINCT queue FROM changes WHERE seq > %s", (after,))
            return latest, {r[0] for r in await cur.fetchall()}

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        rows = await self._fetchall(
            f"SELECT {_EXTENT_COLUMNS} FROM extents WHERE status = ANY(%s) ORDER BY created_at, id",
            (list(statuses),),
        )
        return [_extent(r) for r in rows]

    async def set_extent_status(
        self,
        extent_id: str,
        status: str,
        sealed_seq: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        async with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            await _check_fence(cur, fence)
            await cur.execute(
                "UPDATE extents SET status = %s, sealed_seq = COALESCE(%s, sealed_seq) "
                # a deleted extent stays deleted, and only an open one becomes failing
                "WHERE id = %s AND status <> %s AND (%s <> %s OR status = %s)",
                (status, sealed_seq, extent_id, DELETED, status, FAILING, OPEN),
            )

    # ack levels
    async def get_ack_levels(self, queue: str, group: str) -> list[AckLevel]:
        rows = await self._fetchall(
            "SELECT extent, level, acked, lim FROM ack_levels WHERE queue = %s AND grp = %s",
            (queue, group),
        )
        return [
            AckLevel(queue=queue, group=group, extent=e, level=lv, acked=n, limit=lim)
            for e, lv, n, lim in rows
        ]

    async def delete_ack_levels(self, queue: str, group: str, extents: list[str]) -> None:
        if extents:
            await self._execute(
                "DELETE FROM ack_levels WHERE queue = %s AND grp = %s AND extent = ANY(%s)",
                (queue, group, extents),
            )

    # redeliveries
    async def get_redeliveries(self, queue: str, group: str) -> list[Redelivery]:
        rows = await self._fetchall(
            "SELECT extent, key, count, due_ms FROM redeliveries "
            "WHERE queue = %s AND grp = %s ORDER BY extent, key",
            (queue, group),
        )
        return [
            Redelivery(queue=queue, group=group, extent=e, key=bytes(k), count=n, due_ms=d)
            for e, k, n, d in rows
        ]

    async def put_redeliveries(
        self, upserts: list[Redelivery], deletes: list[Redelivery], fence: Fence | None = None
    ) -> None:
        upsert = (
            "INSERT INTO redeliveries VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (queue, grp, extent, key) "
            "DO UPDATE SET count = excluded.count, due_ms = excluded.due_ms"
        )
        delete = (
            "DELETE FROM redeliveries WHERE queue = %s AND grp = %s AND extent = %s AND key = %s"
        )
        async with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            await _check_fence(cur, fence)
            gone = [(r.queue, r.group, r.extent, r.key) for r in deletes]
            rows = [(r.queue, r.group, r.extent, r.key, r.count, r.due_ms) for r in upserts]
            if gone:
                await cur.executemany(delete, gone)
            if rows:
                await cur.executemany(upsert, rows)

    # queue properties
    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        return dict(await self._fetchall(*select_properties(queue, prefix, "%s")))

    async def put_queue_properties(
        self, queue: str, values: dict[str, str], delete: list[str] | None = None
    ) -> None:
        async with self._conn() as conn, conn.transaction():
            # the row lock holds a delete_queue back until these writes are in
            cur = await conn.execute("SELECT 1 FROM queues WHERE name = %s FOR SHARE", (queue,))
            if await cur.fetchone() is None:
                raise QueueNotFound(f"no queue {queue}")
            for sql, args in write_properties(queue, values, delete or [], "%s"):
                await conn.execute(sql, args)

    async def find_queue_properties(self, name: str, value: str | None = None) -> dict[str, str]:
        return dict(await self._fetchall(*find_properties(name, value, "%s")))

    # membership and leadership
    async def heartbeat(self, host: Host) -> None:
        await self._execute(
            "INSERT INTO hosts AS h (id, role, address, heartbeat_at, zone, load) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "role = excluded.role, address = excluded.address, "
            "heartbeat_at = excluded.heartbeat_at, zone = excluded.zone, "
            "load = COALESCE(excluded.load, h.load)",  # a beat without one keeps it
            (
                host.id,
                host.role,
                host.address,
                host.heartbeat_at,
                host.zone,
                None if host.load is None else _config(host.load),
            ),  # fmt: skip
        )

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        since = -1.0 if alive_within is None else time.time() - alive_within
        rows = await self._fetchall(
            f"SELECT id, role, address, heartbeat_at, zone, {'load' if load else 'NULL'} "
            "FROM hosts WHERE (%s::text IS NULL OR role = %s) AND heartbeat_at >= %s ORDER BY id",
            (role, role, since),
        )
        return [_host(row) for row in rows]
