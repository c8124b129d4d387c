"""SQLite metadata (stdlib sqlite3, WAL mode): the embedded default for one machine.

Every call runs on one dedicated thread, so the event loop never blocks on SQLite. The
tables, indexes and change-log triggers are in sqlite_schema.py."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec

from cherami.errors import AlreadyExists, Fenced, GroupNotFound, QueueNotFound
from cherami.metadata.acklevels import level_row, put_ack_level_sql
from cherami.metadata.base import page_clause
from cherami.metadata.bulk import BulkReads, Statement
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    QUEUE_FLAGS,
    AckLevel,
    Extent,
    Fence,
    Group,
    Host,
    Queue,
    QueueFlag,
    Redelivery,
)
from cherami.metadata.properties import find_properties, select_properties, write_properties
from cherami.metadata.purge import dlq_leases, purge_extent, queue_leases
from cherami.metadata.sqlite_commit import GroupCommit, connect, unavailable
from cherami.metadata.sqlite_leases import SqliteLeases
from cherami.metadata.sqlite_schema import (
    EXTENT_COLUMNS,
    QUEUE_COLUMNS,
    create_schema,
    extent_row,
    group_row,
    host_row,
    queue_row,
    queue_values,
)

T = TypeVar("T")

_json = msgspec.json.Encoder()


_PUT_ACK_LEVEL = put_ack_level_sql("?")


class SqliteMetadataStore(SqliteLeases, BulkReads):
    """Writes on one thread and connection, committed in groups (sqlite_commit.py); reads
    on another, so a read never waits for a commit's sync (the log lets readers go on
    while one writes); ``self._db``: the connection of its thread; leases expire by ``clock``."""

    _queue_of, _extent_of = staticmethod(queue_row), staticmethod(extent_row)  # bulk.py
    _group_of = staticmethod(group_row)

    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self._local, self.clock = threading.local(), clock
        self._writer_db = connect(path)
        create_schema(self._writer_db)
        self._executor = ThreadPoolExecutor(
            1, "cherami-sqlite", initializer=self._bind, initargs=(self._writer_db,)
        )
        if path == ":memory:":  # a second connection would open another database
            self._reader_db, self._reads = self._writer_db, self._executor
        else:
            self._reader_db = connect(path)
            self._reads = ThreadPoolExecutor(
                1, "cherami-sqlite-read", initializer=self._bind, initargs=(self._reader_db,)
            )
        self._commits = GroupCommit(self._writer_db, self._executor)

    def _bind(self, db: sqlite3.Connection) -> None:
        self._local.db = db

    @property
    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection = self._local.db
        return db

    async def _run(self, fn: Callable[[], T]) -> T:
        """A read, on the reading thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reads, fn)
        except sqlite3.OperationalError as err:
            raise unavailable(err) from err

    async def _write(self, fn: Callable[[], T]) -> T:
        """A write: ``fn`` runs in the next group commit (sqlite_commit.py), atomically,
        and this returns once it is committed."""
        try:
            result: T = await self._commits.write(fn)
        except sqlite3.OperationalError as err:
            raise unavailable(err) from err
        return result

    async def _write_all(self, statements: list[Statement]) -> None:
        await self._write(lambda: self._tx(statements))

    async def _read_all(self, query: Any, args: Any) -> list[tuple[Any, ...]]:
        return await self._run(lambda: self._db.execute(query, args).fetchall())

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]], fence: Fence | None = None) -> int:
        """Run the statements (in a write: atomically) after checking ``fence``; returns
        how many rows the last one changed."""
        db = self._db
        changed = 0
        if fence is not None:
            row = db.execute("SELECT epoch FROM leases WHERE name = ?", (fence.lease,)).fetchone()
            if row is None or row[0] != fence.epoch:
                raise Fenced(f"lease {fence.lease} moved past epoch {fence.epoch}")
        for sql, args in statements:
            changed = db.execute(sql, args).rowcount
        return changed

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reads is not self._executor:
            await loop.run_in_executor(self._reads, self._reader_db.close)
            self._reads.shutdown(wait=True)
        await loop.run_in_executor(self._executor, self._writer_db.close)
        self._executor.shutdown(wait=True)

    # queues
    async def insert_queue(self, queue: Queue) -> None:
        def insert() -> None:
            try:
                self._db.execute(
                    f"INSERT INTO queues ({QUEUE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    queue_values(queue),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"queue {queue.name} exists") from None

        await self._write(insert)

    async def get_queue(self, name: str) -> Queue:
        sql = f"SELECT {QUEUE_COLUMNS} FROM queues WHERE name = ?"
        row = await self._run(lambda: self._db.execute(sql, (name,)).fetchone())
        if row is None:
            raise QueueNotFound(f"no queue {name}")
        return queue_row(row)

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
        sql = f"SELECT {QUEUE_COLUMNS} FROM queues WHERE {where}{page}"
        rows = await self._run(lambda: self._db.execute(sql, args).fetchall())
        return [queue_row(r) for r in rows]

    async def update_queue(self, queue: Queue) -> None:
        await self._write(
            lambda: self._db.execute(
                "UPDATE queues SET config = ?, timers = (timers OR ?), keyed = (keyed OR ?) "
                "WHERE name = ?",
                (_json.encode(queue.config), queue.timers, queue.keyed, queue.name),
            )
        )

    async def mark_queue(self, name: str, flag: QueueFlag) -> None:
        def want() -> None:
            column = QUEUE_FLAGS[flag]  # (never what a request says)
            sql = f"UPDATE queues SET {column} = 1 WHERE name = ? AND {column} = 0"
            if not self._db.execute(sql, (name,)).rowcount:
                if self._db.execute("SELECT 1 FROM queues WHERE name = ?", (name,)).fetchone():
                    return
                raise QueueNotFound(f"no queue {name}")

        await self._write(want)

    async def delete_queue(self, name: str) -> None:
        await self._write(
            lambda: self._tx(
                [
                    ("DELETE FROM queues WHERE name = ?", (name,)),
                    ("DELETE FROM groups WHERE queue = ?", (name,)),
                    ("DELETE FROM ack_levels WHERE queue = ?", (name,)),
                    ("DELETE FROM redeliveries WHERE queue = ?", (name,)),
                    ("DELETE FROM queue_properties WHERE queue = ?", (name,)),
                    ("UPDATE extents SET status = ? WHERE queue = ?", (DELETED, name)),
                    queue_leases(name, "?"),
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

        await self._write(insert)

    async def get_group(self, queue: str, name: str) -> Group:
        row = await self._run(
            lambda: self._db.execute(
                "SELECT * FROM groups WHERE queue = ? AND name = ?", (queue, name)
            ).fetchone()
        )
        if row is None:
            raise GroupNotFound(f"no group {name} on queue {queue}")
        return group_row(row)

    async def list_groups(
        self, queue: str, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[Group]:
        page, args = page_clause(prefix, after, limit, "?")
        sql = f"SELECT * FROM groups WHERE queue = ?{page}"
        rows = await self._run(lambda: self._db.execute(sql, [queue, *args]).fetchall())
        return [group_row(r) for r in rows]

    async def list_every_group(self) -> list[Group]:
        sql = "SELECT * FROM groups ORDER BY queue, name"
        return [group_row(r) for r in await self._run(lambda: self._db.execute(sql).fetchall())]

    async def update_group(self, group: Group) -> None:
        await self._write(
            lambda: self._db.execute(
                "UPDATE groups SET config = ? WHERE queue = ? AND name = ?",
                (_json.encode(group.config), group.queue, group.name),
            )
        )

    async def delete_group(self, queue: str, name: str) -> None:
        await self._write(
            lambda: self._tx(
                [
                    dlq_leases(queue, name, "?"),
                    ("DELETE FROM groups WHERE queue = ? AND name = ?", (queue, name)),
                    ("DELETE FROM ack_levels WHERE queue = ? AND grp = ?", (queue, name)),
                    ("DELETE FROM redeliveries WHERE queue = ? AND grp = ?", (queue, name)),
                ]
            )
        )

    # extents
    async def insert_extent(self, extent: Extent, fence: Fence | None = None) -> bool:
        sql = f"INSERT INTO extents ({EXTENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
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

        return await self._write(insert)

    async def get_extent(self, extent_id: str) -> Extent | None:
        row = await self._run(
            lambda: self._db.execute(
                f"SELECT {EXTENT_COLUMNS} FROM extents WHERE id = ?", (extent_id,)
            ).fetchone()
        )
        return extent_row(row) if row else None

    async def purge_extent(self, extent_id: str, queue: str) -> bool:
        return await self._write(lambda: self._tx(purge_extent(extent_id, queue, "?"))) > 0

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]:
        sql = f"SELECT {EXTENT_COLUMNS} FROM extents WHERE queue = ?"
        args: tuple[Any, ...] = (queue,)
        if statuses:
            sql += f" AND status IN ({', '.join('?' * len(statuses))})"
            args += statuses
        rows = await self._run(
            lambda: self._db.execute(sql + " ORDER BY created_at, id", args).fetchall()
        )
        return [extent_row(r) for r in rows]

    def watch_changes(self, wake: Callable[[], None]) -> None:
        return None  # a node opens a new queue's extents as it makes it

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
            f"SELECT {EXTENT_COLUMNS} FROM extents "
            f"WHERE status IN ({', '.join('?' * len(statuses))}) ORDER BY created_at, id"
        )
        rows = await self._run(lambda: self._db.execute(sql, statuses).fetchall())
        return [extent_row(r) for r in rows]

    async def set_extent_status(
        self,
        extent_id: str,
        status: str,
        sealed_seq: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        sql = (
            "UPDATE extents SET status = ?, sealed_seq = COALESCE(?, sealed_seq) "
            # a deleted extent stays deleted, and only an open one becomes failing
            "WHERE id = ? AND status <> ? AND (? <> ? OR status = ?)"
        )
        args = (status, sealed_seq, extent_id, DELETED, status, FAILING, OPEN)
        await self._write(lambda: self._tx([(sql, args)], fence))

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
        statements = [(_PUT_ACK_LEVEL, level_row(a)) for a in levels]
        await self._write(lambda: self._tx(statements, fence))

    async def put_fenced_ack_levels(
        self, writes: Sequence[tuple[Fence, list[AckLevel]]]
    ) -> set[Fence]:
        def put() -> set[Fence]:
            refused: set[Fence] = set()
            for fence, levels in writes:
                row = self._db.execute(
                    "SELECT epoch FROM leases WHERE name = ?", (fence.lease,)
                ).fetchone()
                if row is None or row[0] != fence.epoch:
                    refused.add(fence)
                    continue
                self._db.executemany(_PUT_ACK_LEVEL, [level_row(a) for a in levels])
            return refused

        return await self._write(put) if writes else set()

    async def delete_ack_levels(self, queue: str, group: str, extents: list[str]) -> None:
        sql = "DELETE FROM ack_levels WHERE queue = ? AND grp = ? AND extent = ?"
        await self._write(lambda: self._tx([(sql, (queue, group, e)) for e in extents]))

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
        await self._write(lambda: self._tx(statements, fence))

    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        sql, args = select_properties(queue, prefix, "?")
        return dict(await self._run(lambda: self._db.execute(sql, args).fetchall()))

    async def put_queue_properties(
        self, queue: str, values: dict[str, str], delete: list[str] | None = None
    ) -> None:
        writes = write_properties(queue, values, delete or [], "?")

        def write() -> bool:
            if not self._db.execute("SELECT 1 FROM queues WHERE name = ?", (queue,)).fetchone():
                return False
            for sql, args in writes:
                self._db.execute(sql, args)
            return True

        if not await self._write(write):
            raise QueueNotFound(f"no queue {queue}")

    async def find_queue_properties(self, name: str, value: str | None = None) -> dict[str, str]:
        sql, args = find_properties(name, value, "?")
        return dict(await self._run(lambda: self._db.execute(sql, args).fetchall()))

    # membership and leadership
    async def heartbeat(self, host: Host) -> None:
        await self._write(
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

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        since = -1.0 if alive_within is None else time.time() - alive_within
        rows = await self._run(
            lambda: self._db.execute(
                f"SELECT id, role, address, heartbeat_at, zone, {'load' if load else 'NULL'} "
                "FROM hosts "
                "WHERE (? IS NULL OR role = ?) AND heartbeat_at >= ? ORDER BY id",
                (role, role, since),
            ).fetchall()
        )
        return [host_row(row) for row in rows]
