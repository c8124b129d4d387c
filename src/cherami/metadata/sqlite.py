"""SQLite metadata (stdlib sqlite3, WAL mode): the embedded default for one machine.

Every call runs on one dedicated thread, so the event loop never blocks on SQLite. The
tables, indexes and change-log triggers are in sqlite_schema.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec

from cherami.errors import AlreadyExists, Fenced, GroupNotFound, QueueNotFound, Unavailable
from cherami.metadata.base import page_clause
from cherami.metadata.models import (
    DELETED,
    AckLevel,
    Extent,
    Fence,
    Group,
    GroupConfig,
    Host,
    LoadReport,
    Queue,
    QueueConfig,
    Redelivery,
)
from cherami.metadata.properties import find_properties, select_properties, write_properties
from cherami.metadata.sqlite_schema import create_schema

T = TypeVar("T")

# Result codes that mean "the database cannot be used now" (busy, locked, I/O, full, ...),
# not "this statement is wrong": calls raise Unavailable for them.
_UNAVAILABLE_CODES = frozenset({
    sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
})  # fmt: skip

_json = msgspec.json.Encoder()


def _queue(row: tuple[Any, ...]) -> Queue:
    name, config, created_at, dlq_of = row
    return Queue(
        name=name,
        config=msgspec.json.decode(config, type=QueueConfig),
        created_at=created_at,
        dlq_of=dlq_of,
    )


def _group(row: tuple[Any, ...]) -> Group:
    queue, name, config, created_at, start_ms, dlq = row
    return Group(
        queue=queue,
        name=name,
        config=msgspec.json.decode(config, type=GroupConfig),
        created_at=created_at,
        start_ms=start_ms,
        dlq=dlq,
    )


def _extent(row: tuple[Any, ...]) -> Extent:
    id_, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor = row
    return Extent(
        id=id_,
        queue=queue,
        kind=kind,
        status=status,
        input_host=input_host,
        stores=msgspec.json.decode(stores, type=list[str]),
        created_at=created_at,
        sealed_seq=sealed_seq,
        predecessor=predecessor,
    )


def _host(row: tuple[Any, ...]) -> Host:
    id_, role, address, heartbeat_at, zone, load = row
    return Host(
        id=id_, role=role, address=address, heartbeat_at=heartbeat_at, zone=zone,
        load=None if load is None else msgspec.json.decode(load, type=LoadReport),
    )  # fmt: skip


_EXTENT_COLUMNS = "id, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor"


class SqliteMetadataStore:
    def __init__(self, path: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cherami-sqlite")
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        create_schema(self._db)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.OperationalError as err:
            if err.sqlite_errorcode & 0xFF in _UNAVAILABLE_CODES:  # the primary result code
                raise Unavailable(f"metadata database unavailable: {err}") from err
            raise

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]], fence: Fence | None = None) -> int:
        """Run the statements in one transaction (after checking ``fence``); returns
        how many rows the last one changed."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        changed = 0
        try:
            if fence is not None:
                epoch = db.execute("SELECT epoch FROM leases WHERE name = ?", (fence.lease,))
                row = epoch.fetchone()
                if row is None or row[0] != fence.epoch:
                    raise Fenced(f"lease {fence.lease} moved past epoch {fence.epoch}")
            for sql, args in statements:
                changed = db.execute(sql, args).rowcount
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return changed

    async def close(self) -> None:
        await self._run(self._db.close)
        self._executor.shutdown(wait=True)

    # queues
    async def insert_queue(self, queue: Queue) -> None:
        def insert() -> None:
            try:
                self._db.execute(
                    "INSERT INTO queues VALUES (?, ?, ?, ?)",
                    (queue.name, _json.encode(queue.config), queue.created_at, queue.dlq_of),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"queue {queue.name} exists") from None

        await self._run(insert)

    async def get_queue(self, name: str) -> Queue:
        row = await self._run(
            lambda: self._db.execute("SELECT * FROM queues WHERE name = ?", (name,)).fetchone()
        )
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
        page, args = page_clause(prefix, after, limit, "?")
        where = "1" if dlqs else "dlq_of IS NULL"  # the latter: the queues_public index
        sql = f"SELECT * FROM queues WHERE {where}{page}"
        rows = await self._run(lambda: self._db.execute(sql, args).fetchall())
        return [_queue(r) for r in rows]

    async def update_queue(self, queue: Queue) -> None:
        await self._run(
            lambda: self._db.execute(
                "UPDATE queues SET config = ? WHERE name = ?",
                (_json.encode(queue.config), queue.name),
            )
        )

    async def delete_queue(self, name: str) -> None:
        await self._run(
            lambda: self._tx(
                [
                    ("DELETE FROM queues WHERE name = ?", (name,)),
                    ("DELETE FROM groups WHERE queue = ?", (name,)),
                    ("DELETE FROM ack_levels WHERE queue = ?", (name,)),
                    ("DELETE FROM redeliveries WHERE queue = ?", (name,)),
                    ("DELETE FROM queue_properties WHERE queue = ?", (name,)),
                    ("UPDATE extents SET status = ? WHERE queue = ?", (DELETED, name)),
                ]
            )
        )

    # groups
    async def insert_group(self, group: Group) -> None:
        def insert() -> None:
            try:
                self._db.execute(
                    "INSERT INTO groups VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        group.queue,
                        group.name,
                        _json.encode(group.config),
                        group.created_at,
                        group.start_ms,
                        group.dlq,
                    ),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"group {group.name} exists") from None

        await self._run(insert)

    async def get_group(self, queue: str, name: str) -> Group:
        row = await self._run(
            lambda: self._db.execute(
                "SELECT * FROM groups WHERE queue = ? AND name = ?", (queue, name)
            ).fetchone()
        )
        if row is None:
            raise GroupNotFound(f"no group {name} on queue {queue}")
        return _group(row)

    async def list_groups(
        self, queue: str, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[Group]:
        page, args = page_clause(prefix, after, limit, "?")
        sql = f"SELECT * FROM groups WHERE queue = ?{page}"
        rows = await self._run(lambda: self._db.execute(sql, [queue, *args]).fetchall())
        return [_group(r) for r in rows]

    async def update_group(self, group: Group) -> None:
        await self._run(
            lambda: self._db.execute(
                "UPDATE groups SET config = ? WHERE queue = ? AND name = ?",
                (_json.encode(group.config), group.queue, group.name),
            )
        )

    async def delete_group(self, queue: str, name: str) -> None:
        await self._run(
            lambda: self._tx(
                [
                    ("DELETE FROM groups WHERE queue = ? AND name = ?", (queue, name)),
                    ("DELETE FROM ack_levels WHERE queue = ? AND grp = ?", (queue, name)),
                    ("DELETE FROM redeliveries WHERE queue = ? AND grp = ?", (queue, name)),
                ]
            )
        )

    # extents
    async def insert_extent(self, extent: Extent, fence: Fence | None = None) -> bool:
        sql = f"INSERT INTO extents ({_EXTENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        args = (
            extent.id, extent.queue, extent.kind, extent.status, extent.input_host,
            _json.encode(extent.stores), extent.created_at, extent.sealed_seq, extent.predecessor,
        )  # fmt: skip

        def insert() -> bool:
            try:
                self._tx([(sql, args)], fence)
            except sqlite3.IntegrityError:
                return False
            return True

        return await self._run(insert)

    async def get_extent(self, extent_id: str) -> Extent | None:
        row = await self._run(
            lambda: self._db.execute(
                f"SELECT {_EXTENT_COLUMNS} FROM extents WHERE id = ?", (extent_id,)
            ).fetchone()
        )
        return _extent(row) if row else None

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]:
        sql = f"SELECT {_EXTENT_COLUMNS} FROM extents WHERE queue = ?"
        args: tuple[Any, ...] = (queue,)
        if statuses:
            sql += f" AND status IN ({', '.join('?' * len(statuses))})"
            args += statuses
        rows = await self._run(
            lambda: self._db.execute(sql + " ORDER BY created_at, id", args).fetchall()
        )
        return [_extent(r) for r in rows]

    async def changes_since(self, after: int) -> tuple[int, set[str] | None]:
        def read() -> tuple[int, set[str] | None]:
            first, last = self._db.execute("SELECT min(seq), max(seq) FROM changes").fetchone()
            latest = last or 0
            if after < 0 or after > latest or (first is not None and after < first - 1):
                return latest, None  # unknown, or older than the log keeps
            rows = self._db.execute(
                "SELECT DISTINCT queue FROM changes WHERE seq > ?", (after,)
            ).fetchall()
            return latest, {r[0] for r in rows}

        return await self._run(read)

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        sql = (
            f"SELECT {_EXTENT_COLUMNS} FROM extents "
            f"WHERE status IN ({', '.join('?' * len(statuses))}) ORDER BY created_at, id"
        )
        rows = await self._run(lambda: self._db.execute(sql, statuses).fetchall())
        return [_extent(r) for r in rows]

    async def set_extent_status(
        self,
        extent_id: str,
        status: str,
        sealed_seq: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        sql = (
            "UPDATE extents SET status = ?, sealed_seq = COALESCE(?, sealed_seq) "
            "WHERE id = ? AND status <> ?"  # a deleted extent stays deleted
        )
        await self._run(lambda: self._tx([(sql, (status, sealed_seq, extent_id, DELETED))], fence))

    # ack levels
    async def get_ack_levels(self, queue: str, group: str) -> list[AckLevel]:
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT extent, level, acked, lim FROM ack_levels WHERE queue = ? AND grp = ?",
                (queue, group),
            ).fetchall()
        )
        return [
            AckLevel(queue=queue, group=group, extent=e, level=lv, acked=n, limit=lim)
            for e, lv, n, lim in rows
        ]

    async def put_ack_levels(self, levels: list[AckLevel], fence: Fence | None = None) -> None:
        sql = (
            "INSERT INTO ack_levels VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (queue, grp, extent) "
            "DO UPDATE SET "
            # a level never moves backward; a merged DLQ range only grows, and lands
            # even when the level it came with is behind the stored one (a merge
            # reads the group's levels while its consumers go on acking)
            "level = CASE WHEN excluded.acked >= ack_levels.acked THEN excluded.level "
            "ELSE ack_levels.level END, acked = max(excluded.acked, ack_levels.acked), "
            "lim = CASE WHEN ack_levels.lim IS NULL OR excluded.lim > ack_levels.lim "
            "THEN excluded.lim ELSE ack_levels.lim END "
            "WHERE excluded.acked >= ack_levels.acked OR excluded.lim > ack_levels.lim "
            "OR (ack_levels.lim IS NULL AND excluded.lim IS NOT NULL)"
        )
        await self._run(
            lambda: self._tx(
                [(sql, (a.queue, a.group, a.extent, a.level, a.acked, a.limit)) for a in levels],
                fence,
            )
        )

    async def delete_ack_levels(self, queue: str, group: str, extents: list[str]) -> None:
        sql = "DELETE FROM ack_levels WHERE queue = ? AND grp = ? AND extent = ?"
        await self._run(lambda: self._tx([(sql, (queue, group, e)) for e in extents]))

    # redeliveries
    async def get_redeliveries(self, queue: str, group: str) -> list[Redelivery]:
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT extent, key, count, due_ms FROM redeliveries "
                "WHERE queue = ? AND grp = ? ORDER BY extent, key",
                (queue, group),
            ).fetchall()
        )
        return [
            Redelivery(queue=queue, group=group, extent=e, key=k, count=n, due_ms=d)
            for e, k, n, d in rows
        ]

    async def put_redeliveries(
        self, upserts: list[Redelivery], deletes: list[Redelivery], fence: Fence | None = None
    ) -> None:
        upsert = (
            "INSERT INTO redeliveries VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (queue, grp, extent, key) "
            "DO UPDATE SET count = excluded.count, due_ms = excluded.due_ms"
        )
        delete = "DELETE FROM redeliveries WHERE queue = ? AND grp = ? AND extent = ? AND key = ?"
        statements: list[tuple[str, tuple[Any, ...]]] = [
            (delete, (r.queue, r.group, r.extent, r.key)) for r in deletes
        ]
        statements += [
            (upsert, (r.queue, r.group, r.extent, r.key, r.count, r.due_ms)) for r in upserts
        ]
        await self._run(lambda: self._tx(statements, fence))

    # queue properties
    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        sql, args = select_properties(queue, prefix, "?")
        return dict(await self._run(lambda: self._db.execute(sql, args).fetchall()))

    async def put_queue_properties(
        self, queue: str, values: dict[str, str], delete: list[str] | None = None
    ) -> None:
        writes = write_properties(queue, values, delete or [], "?")

        def write() -> bool:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._db.execute("SELECT 1 FROM queues WHERE name = ?", (queue,)).fetchone():
                    for sql, args in writes:
                        self._db.execute(sql, args)
                    self._db.execute("COMMIT")
                    return True
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("ROLLBACK")
            return False

        if not await self._run(write):
            raise QueueNotFound(f"no queue {queue}")

    async def find_queue_properties(self, name: str, value: str | None = None) -> dict[str, str]:
        sql, args = find_properties(name, value, "?")
        return dict(await self._run(lambda: self._db.execute(sql, args).fetchall()))

    # membership and leadership
    async def heartbeat(self, host: Host) -> None:
        await self._run(
            lambda: self._db.execute(
                "INSERT INTO hosts (id, role, address, heartbeat_at, zone, load) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "role = excluded.role, address = excluded.address, "
                "heartbeat_at = excluded.heartbeat_at, zone = excluded.zone, "
                "load = COALESCE(excluded.load, hosts.load)",  # a beat without one keeps it
                (
                    host.id,
                    host.role,
                    host.address,
                    host.heartbeat_at,
                    host.zone,
                    None if host.load is None else _json.encode(host.load),
                ),  # fmt: skip
            )
        )

    async def list_hosts(self, role: str | None, alive_within: float | None) -> list[Host]:
        since = -1.0 if alive_within is None else time.time() - alive_within
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT id, role, address, heartbeat_at, zone, load FROM hosts "
                "WHERE (? IS NULL OR role = ?) AND heartbeat_at >= ? ORDER BY id",
                (role, role, since),
            ).fetchall()
        )
        return [_host(row) for row in rows]

    async def lease_holder(self, name: str) -> str | None:
        row = await self._run(
            lambda: self._db.execute(
                "SELECT holder FROM leases WHERE name = ? AND expires_at >= ?", (name, time.time())
            ).fetchone()
        )
        return str(row[0]) if row else None

    async def lease_holders(self, prefix: str) -> dict[str, str]:
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT name, holder FROM leases WHERE substr(name, 1, ?) = ? AND expires_at >= ?",
                (len(prefix), prefix, time.time()),
            ).fetchall()
        )
        return {str(name): str(holder) for name, holder in rows}

    async def renew_leases(
        self, names: list[str], holder: str, ttl_seconds: float
    ) -> dict[str, int]:
        def renew() -> dict[str, int]:
            rows = self._db.execute(
                "UPDATE leases SET expires_at = ? WHERE holder = ? "
                "AND name IN (SELECT value FROM json_each(?)) RETURNING name, epoch",
                (time.time() + ttl_seconds, holder, json.dumps(names)),
            ).fetchall()
            return {str(name): int(epoch) for name, epoch in rows}

        return await self._run(renew) if names else {}

    async def try_lease(self, name: str, holder: str, ttl_seconds: float) -> int | None:
        def take() -> int | None:
            now = time.time()
            row = self._db.execute(
                "INSERT INTO leases VALUES (?, ?, ?, 1) ON CONFLICT (name) DO UPDATE SET "
                "holder = excluded.holder, expires_at = excluded.expires_at, epoch = CASE "
                "WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END "
                "WHERE leases.holder = excluded.holder OR leases.expires_at < ? RETURNING epoch",
                (name, holder, now + ttl_seconds, now),
            ).fetchone()
            return int(row[0]) if row else None

        return await self._run(take)
