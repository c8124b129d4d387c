"""The SQLite metadata store's schema (sqlite.py): its tables and indexes, the triggers
that keep the change log (``MetadataStore.changes_since``), the columns added to a
database made before them, and how its rows are read back."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from cherami.metadata.models import (
    Extent,
    Group,
    GroupConfig,
    Host,
    LoadReport,
    Queue,
    QueueConfig,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at REAL NOT NULL, dlq_of TEXT,
    timers INTEGER NOT NULL DEFAULT 1, keyed INTEGER NOT NULL DEFAULT 0
);
-- the queues a listing shows (not the groups' DLQs), in name order
CREATE INDEX IF NOT EXISTS queues_public ON queues (name) WHERE dlq_of IS NULL;
CREATE TABLE IF NOT EXISTS groups (
    queue TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL, created_at REAL NOT NULL,
    start_ms INTEGER NOT NULL, dlq TEXT NOT NULL, PRIMARY KEY (queue, name)
);
CREATE TABLE IF NOT EXISTS extents (
    id TEXT PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    input_host TEXT NOT NULL, stores TEXT NOT NULL, created_at REAL NOT NULL,
    sealed_seq INTEGER, predecessor TEXT UNIQUE
);
CREATE INDEX IF NOT EXISTS extents_by_queue ON extents (queue, status);
CREATE INDEX IF NOT EXISTS extents_by_status ON extents (status);
CREATE TABLE IF NOT EXISTS ack_levels (
    queue TEXT NOT NULL, grp TEXT NOT NULL, extent TEXT NOT NULL, level BLOB NOT NULL,
    acked INTEGER NOT NULL, lim BLOB, PRIMARY KEY (queue, grp, extent)
);
CREATE TABLE IF NOT EXISTS hosts (
    id TEXT PRIMARY KEY, role TEXT NOT NULL, address TEXT NOT NULL, heartbeat_at REAL NOT NULL,
    zone TEXT NOT NULL DEFAULT '', load TEXT
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 1, session INTEGER
);
-- output hosts' host leases (hostleases.py): a unit whose session is set is held while
-- its holder's row has that session, unexpired
CREATE TABLE IF NOT EXISTS host_leases (
    host TEXT PRIMARY KEY, session INTEGER NOT NULL, expires_at REAL NOT NULL
);
-- the change log: a row per write to a queue, its groups, its extents or a merged DLQ
-- range (an ack level with a limit), in commit order; the newest KEPT_CHANGES are kept
CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS changes_kept AFTER INSERT ON changes
    BEGIN DELETE FROM changes WHERE seq <= NEW.seq - 10000; END;
CREATE TRIGGER IF NOT EXISTS queue_added AFTER INSERT ON queues
    BEGIN INSERT INTO changes (queue) VALUES (NEW.name); END;
CREATE TRIGGER IF NOT EXISTS queue_changed AFTER UPDATE ON queues
    BEGIN INSERT INTO changes (queue) VALUES (NEW.name); END;
CREATE TRIGGER IF NOT EXISTS queue_deleted AFTER DELETE ON queues
    BEGIN INSERT INTO changes (queue) VALUES (OLD.name); END;
CREATE TRIGGER IF NOT EXISTS group_added AFTER INSERT ON groups
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS group_changed AFTER UPDATE ON groups
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS group_deleted AFTER DELETE ON groups
    BEGIN INSERT INTO changes (queue) VALUES (OLD.queue); END;
CREATE TRIGGER IF NOT EXISTS extent_added AFTER INSERT ON extents
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS extent_changed AFTER UPDATE OF status ON extents
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS extent_deleted AFTER DELETE ON extents
    BEGIN INSERT INTO changes (queue) VALUES (OLD.queue); END;
CREATE TRIGGER IF NOT EXISTS limit_added AFTER INSERT ON ack_levels WHEN NEW.lim IS NOT NULL
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS limit_changed AFTER UPDATE ON ack_levels
    WHEN NEW.lim IS NOT OLD.lim
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
CREATE TRIGGER IF NOT EXISTS limit_deleted AFTER DELETE ON ack_levels WHEN OLD.lim IS NOT NULL
    BEGIN INSERT INTO changes (queue) VALUES (OLD.queue); END;
CREATE TABLE IF NOT EXISTS redeliveries (
    queue TEXT NOT NULL, grp TEXT NOT NULL, extent TEXT NOT NULL, key BLOB NOT NULL,
    count INTEGER NOT NULL, due_ms INTEGER NOT NULL, PRIMARY KEY (queue, grp, extent, key)
);
-- queue properties (properties.py): what is kept with a queue that Cherami never reads
CREATE TABLE IF NOT EXISTS queue_properties (
    queue TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (queue, name)
);
CREATE INDEX IF NOT EXISTS queue_properties_by_name ON queue_properties (name, value);
CREATE TABLE IF NOT EXISTS cancelled (
    queue TEXT NOT NULL, extent TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (queue, extent, seq)
);
-- a cancel is in the change log: output hosts read the queue's tombstones again
CREATE TRIGGER IF NOT EXISTS cancel_added AFTER INSERT ON cancelled
    BEGIN INSERT INTO changes (queue) VALUES (NEW.queue); END;
"""


def create_schema(db: sqlite3.Connection) -> None:
    """Create what is missing, then add the columns a database made by an older version
    lacks."""
    db.executescript(SCHEMA)
    # one process at a time looks for what is missing and adds it: the role processes of
    # a cluster on one SQLite file start at once, and two that both found a column
    # missing both added it (the second exited: "duplicate column name")
    db.execute("BEGIN IMMEDIATE")
    try:
        _add_columns(db)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _add_columns(db: sqlite3.Connection) -> None:
    leases = [row[1] for row in db.execute("PRAGMA table_info(leases)")]
    if "epoch" not in leases:  # made before lease epochs
        db.execute("ALTER TABLE leases ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1")
    if "session" not in leases:  # made before host leases
        db.execute("ALTER TABLE leases ADD COLUMN session INTEGER")
    queues = [row[1] for row in db.execute("PRAGMA table_info(queues)")]
    if "timers" not in queues:  # made when every queue had timer extents
        db.execute("ALTER TABLE queues ADD COLUMN timers INTEGER NOT NULL DEFAULT 1")
    if "keyed" not in queues:  # made before Queue.keyed
        db.execute("ALTER TABLE queues ADD COLUMN keyed INTEGER NOT NULL DEFAULT 0")
    host_leases = [row[1] for row in db.execute("PRAGMA table_info(host_leases)")]
    if "changes" not in host_leases:  # made before lease stamps
        db.execute("ALTER TABLE host_leases ADD COLUMN changes INTEGER NOT NULL DEFAULT 0")
        db.execute("ALTER TABLE host_leases ADD COLUMN released_until REAL NOT NULL DEFAULT 0")
    hosts = [row[1] for row in db.execute("PRAGMA table_info(hosts)")]
    if "zone" not in hosts:  # made before zones and load reports
        db.execute("ALTER TABLE hosts ADD COLUMN zone TEXT NOT NULL DEFAULT ''")
        db.execute("ALTER TABLE hosts ADD COLUMN load TEXT")


def queue_values(queue: Queue) -> tuple[Any, ...]:
    """A queue's row, in QUEUE_COLUMNS' order."""
    config = msgspec.json.encode(queue.config)
    return queue.name, config, queue.created_at, queue.dlq_of, queue.timers, queue.keyed


def queue_row(row: tuple[Any, ...]) -> Queue:
    name, config, created_at, dlq_of, timers, keyed = row
    return Queue(
        name=name,
        config=msgspec.json.decode(config, type=QueueConfig),
        created_at=created_at,
        dlq_of=dlq_of,
        timers=bool(timers),
        keyed=bool(keyed),
    )


def group_row(row: tuple[Any, ...]) -> Group:
    queue, name, config, created_at, start_ms, dlq = row
    return Group(
        queue=queue,
        name=name,
        config=msgspec.json.decode(config, type=GroupConfig),
        created_at=created_at,
        start_ms=start_ms,
        dlq=dlq,
    )


def extent_row(row: tuple[Any, ...]) -> Extent:
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


def host_row(row: tuple[Any, ...]) -> Host:
    id_, role, address, heartbeat_at, zone, load = row
    return Host(
        id=id_, role=role, address=address, heartbeat_at=heartbeat_at, zone=zone,
        load=None if load is None else msgspec.json.decode(load, type=LoadReport),
    )  # fmt: skip


QUEUE_COLUMNS = "name, config, created_at, dlq_of, timers, keyed"
EXTENT_COLUMNS = "id, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor"
